"""One launch layer: every process of a job is built here, whatever its role (a sync trainer,
an async worker, a parameter server), and here its failures become the job's fate.

The command line (cli.py), the Python API (api.py) and the tests all call :func:`run`.

Errors. Bad input (ConfigError, DataError, CheckpointError) is found on every rank alike; a
training failure (a NaN loss, a stuck peer, a collective Horovod gave up on) may hit one rank.
In sync mode both propagate: the caller turns them into an exit code, or the API's caller sees
the exception; Horovod's own timeouts end the other ranks. An async job's ranks block in MPI
receives, and MPI has no such timeout, so there the scheme's rule is to end every rank with
MPI_Abort after printing the message.
"""

from __future__ import annotations

import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from .checkpoint import CheckpointError, intact_note
from .config import Config, ConfigError
from .data import DataError
from .errors import plain_message
from .exit_codes import EXIT_BAD_INPUT, EXIT_FAILED
from .layout import Layout
from .requeue import rank_started, tell_wrapper
from .workload import Workload

BAD_INPUT = (ConfigError, DataError, CheckpointError)


def failure_code(error: BaseException) -> int | None:
    """The exit code for an error the job expects (bad input, a training failure), or None for
    a bug, whose traceback must be shown."""
    from .loop import TrainingError
    from .ps.waiting import StuckError

    if isinstance(error, BAD_INPUT):
        return EXIT_BAD_INPUT
    if isinstance(error, (TrainingError, StuckError)) or _horovod_gave_up(error):
        return EXIT_FAILED
    return None


def _horovod_gave_up(error: BaseException) -> bool:
    if "horovod.common.exceptions" not in sys.modules:  # Horovod never started in this process
        return False
    from horovod.common.exceptions import HorovodInternalError
    return isinstance(error, HorovodInternalError)


def describe_failure(error: BaseException) -> str:
    if _horovod_gave_up(error):
        return (f"Horovod shut down: another rank failed, or a collective waited longer than "
                f"--stall-timeout-s for ranks that never joined it ({error})")
    return plain_message(error)


@dataclass
class Finished:
    """What a process knows when the job is done. The history and the run folder are worker 0's,
    given to every rank, servers included, so one script works under every mode and launcher."""

    history: list = field(default_factory=list)  # loop.EpochResult per epoch
    run_dir: Path | None = None
    trainer: Any = None  # this process's loop.Trainer; None on a parameter server
    verdict: Any = None  # loop.stopping.Verdict: whether, where and why training stopped early


def run(cfg: Config, workload: Workload) -> Finished:
    """Build this process's role and run it."""
    from .loop.preemption import process_signals

    model = build_model(cfg, workload)
    # SIGTERM/SIGUSR1/SIGINT: stop at a step, with a checkpoint (fit returns, the CLI exits)
    process_signals.install(in_fit=not workload.from_command_line)
    try:
        if cfg.run.mode == "async":
            return _run_async(cfg, workload, model)
        return _run_sync(cfg, workload, model)
    finally:
        process_signals.restore()


def build_model(cfg: Config, workload: Workload) -> torch.nn.Module:
    """The workload's model with the initial weights every replica draws (also the simulator's,
    compare/sim/)."""
    torch.manual_seed(cfg.run.seed)  # every replica's factory draws the same initial weights
    model = workload.build_model()
    workload.name = workload.name or type(model).__name__
    return model


def ready_replica(cfg: Config, workload: Workload, replica) -> None:
    """The workload bound to the replica's device and checked on its model; the replica's
    objective is then the workload's own (also the simulator's, compare/sim/)."""
    workload.bind(replica.device, cfg)  # a pipeline takes its inputs on its first stage's device
    replica.model.eval()  # the check must not move BatchNorm statistics
    with replica.eager():  # --compile compiles at the first step, for the shapes it trains on
        workload.check(getattr(replica, "checked_forward", replica.forward), replica.device)
    replica.model.train()
    replica.objective = workload.objective()  # without the metrics the check dropped


def prepare_sync(cfg: Config, workload: Workload, model):
    """A sync trainer, its collective started (Horovod, or torch.distributed under
    --collective torch), nothing trained yet (benchmarks drive it by hand)."""
    from .runtime import start_horovod
    from .sync.horovod import to_sync_batchnorm
    from .sync.torch_runtime import start_torch_distributed

    start = start_torch_distributed if cfg.sync.collective == "torch" else start_horovod
    runtime = start(cfg.run, cfg.sync)
    layout = Layout.build(cfg, runtime.size, runtime.local_rank, runtime.local_size)
    if cfg.sync.sync_batchnorm:
        if runtime.device.type != "cuda":
            raise ConfigError(f"--sync-batchnorm: Horovod's SyncBatchNorm runs on CUDA devices "
                              f"only, and this rank trains on {runtime.device}; drop the flag "
                              "(on CPUs every rank's BatchNorm statistics are averaged before "
                              "each evaluation and checkpoint) or train on GPUs")
        model = to_sync_batchnorm(model)
    scheme = _sync_scheme(cfg)(cfg, runtime)
    return _build_trainer(cfg, runtime, layout, scheme, workload, model)


def _sync_scheme(cfg: Config) -> Callable[..., Any]:
    """What builds the scheme from (cfg, runtime): elastic Horovod, local SGD / DiLoCo
    (--local-steps H > 1), batch shares that follow speed (--balance), or plain Horovod sync.
    Config.validate refuses --elastic with --local-steps H > 1, and --balance with either."""
    from .sync.horovod import HorovodSync

    if cfg.sync.collective == "torch":  # the refusals of what it lacks: config/sync_options.py
        from .sync.torch_runtime import torch_scheme

        return torch_scheme
    if cfg.sync.elastic:
        from .sync.elastic import ElasticHorovodSync

        return ElasticHorovodSync
    if cfg.sync.balance:
        from .sync.shares import BalancedSync

        return BalancedSync
    if cfg.sync.local_steps > 1:
        from .sync.horovod_port import HorovodPort
        from .sync.local_rounds_scheme import LocalSGDSync

        return lambda cfg, runtime: LocalSGDSync(cfg, runtime, HorovodPort())
    return HorovodSync


def _run_sync(cfg: Config, workload: Workload, model):
    finished = False
    try:
        result = _train_sync(cfg, workload, model)
        finished = True
        return result
    finally:
        if cfg.sync.collective == "torch":  # a second fit() here starts its own process group
            from .sync.torch_runtime import stop_torch_distributed

            stop_torch_distributed(finished)


def _train_sync(cfg: Config, workload: Workload, model):
    trainer = prepare_sync(cfg, workload, model)
    scheme = trainer.scheme
    try:
        trainer.fit()
    except Exception as e:
        if failure_code(e) is None:  # the user's forward() or dataset, or a bug: the CLI says
            e.run_dir = trainer.run_dir  # which checkpoint is intact below the traceback
        raise
    finally:
        workload.close()
    history, run_dir, verdict = scheme.group.broadcast_object(
        (trainer.history, trainer.run_dir, trainer.stopping.verdict))
    return Finished(history, run_dir, trainer, verdict)


def _client_class(cfg: Config) -> type:
    """The async workers' scheme: plain, or asynchronous DiLoCo (H inner steps per push)."""
    if cfg.sync.local_steps != 1:
        from .ps.diloco_client import DiLoCoClient
        return DiLoCoClient
    from .ps.client import ParameterServerClient
    return ParameterServerClient


def _run_async(cfg: Config, workload: Workload, model):
    from .runtime import start_mpi

    def is_server(rank: int, world_size: int) -> bool:  # the job's one rank layout
        return Layout.job_topology(cfg, world_size).is_server(rank)

    from .ps.newcomer import parent_link, run_newcomer
    from .ps.replacement import restarts_allowed

    restarts_allowed(cfg.ps.max_restarts)  # on every rank alike
    parent = parent_link() if cfg.ps.max_restarts else None
    if parent is not None:  # a replacement worker that server 0 started (--max-restarts)
        return run_newcomer(cfg, workload, model, parent, _build_trainer, Finished)
    runtime = start_mpi(cfg.run, is_server, cfg.ps.server_device)
    # The same on every rank: errors need no abort. A worker's local rank and size count this
    # host's workers, whose pipeline stages take its GPUs; servers hold no stages.
    layout = Layout.build(cfg, runtime.size, runtime.local_rank, runtime.local_size)
    topology = layout.topology
    from mpi4py import MPI

    from .ps.server import ParameterServer

    world = MPI.COMM_WORLD
    is_server = topology.is_server(runtime.rank)
    comm, worker_comm = _async_channels(cfg, world, runtime.rank, is_server)
    trainer = None
    try:
        if is_server:
            server = _built_on_every_rank(
                world, lambda: ParameterServer(comm, cfg, topology, runtime.device))
            lost = _serve(server)
        else:
            trainer = _built_on_every_rank(world, lambda: _build_trainer(
                cfg, runtime, layout, _client_class(cfg)(cfg, runtime, comm, worker_comm, topology),
                workload, model), model_of=lambda built: built.replica.model)
            trainer.fit()
            workload.close()
            lost = trainer.scheme.survivors.lost
        history, run_dir, verdict = survivors_of(world, lost).bcast(
            (trainer.history, trainer.run_dir, trainer.stopping.verdict)
            if trainer is not None and trainer.is_main else None, root=0)  # root 0: the lead
        if is_server:  # every server has stopped serving: a frozen lost worker may wake
            server.membership.job_ended(server)
        return Finished(history, run_dir, trainer, verdict)
    except BaseException as e:  # never leave the other ranks waiting for this one
        if getattr(e, "raised_on_every_rank", False):
            raise
        _leave_if_lost(e)
        _end_async_job(e, world, runtime.rank, trainer, cfg.run.run_dir)


def _async_channels(cfg: Config, world, rank: int, is_server: bool):
    """The parameter server's private channel (which reaches a replacement too under
    --max-restarts: ps/routes.py), and the workers' own."""
    from mpi4py import MPI

    comm = world.Dup()
    if cfg.ps.max_restarts:
        from .ps.routes import Routes
        comm = Routes(comm, MPI.ANY_SOURCE)
    return comm, world.Split(1 if is_server else 0, rank)


def _built_on_every_rank(world, build: Callable[[], Any],
                         model_of: Callable[[Any], Any] = lambda built: None) -> Any:
    """What build() makes on this rank (its server, or its trainer, whose model and data are
    checked then), once every rank has built its own: bad input refused on any rank is raised
    on all of them, before anything trains. fit() then raises it and the command line exits 2 on
    every rank, as in sync, where a worker's refusal had aborted the MPI job. ``model_of``: a
    worker's model, which must be worker 0's (_same_model_on_every_worker); a server has none."""
    refused = built = None
    try:
        built = build()
    except BAD_INPUT as e:
        refused = e
    _agree_on_input(world, refused)
    model = model_of(built)
    _same_model_on_every_worker(world, None if model is None else [
        (name, tuple(p.shape)) for name, p in model.named_parameters()])
    return built


def _same_model_on_every_worker(world, shapes: list | None) -> None:
    """Every worker's model has worker 0's parameters (``shapes``: names and shapes; None on a
    server), else ConfigError on every rank. The server holds worker 0's flat parameters, and a
    worker whose model differed (fit() given another on each rank) trained on them in silence,
    or failed in a numpy copy, where sync's broadcast refuses the mismatch."""
    workers = [(rank, s) for rank, s in enumerate(world.allgather(shapes)) if s is not None]
    lead_rank, lead = workers[0]
    differ = [(rank, s) for rank, s in workers if s != lead]
    if not differ:
        return
    rank, other = differ[0]
    def shown(parameter) -> str:
        return f"{parameter[0]} {'x'.join(map(str, parameter[1])) or 'scalar'}"
    first = next((f"{shown(b)} against {shown(a)}" for a, b in zip(lead, other) if a != b),
                 f"{len(other)} parameters against {len(lead)}")
    error = ConfigError(
        f"the model: {len(differ)} worker(s) built another model than rank {lead_rank}'s "
        f"(rank {rank}: {first}); every worker must build the same model, from the same "
        "builder and arguments on every rank (a parameter server holds one copy of it)")
    error.raised_on_every_rank = True
    raise error


def _agree_on_input(world, refused: BaseException | None) -> None:
    """Raise ``refused``, or the bad input another rank refused, on every rank."""
    told = None if refused is None else (
        next(i for i, kind in enumerate(BAD_INPUT) if isinstance(refused, kind)), str(refused),
        getattr(refused, "user_traceback", None))
    first = next((t for t in world.allgather(told) if t is not None), None)
    if first is None:
        return
    error = refused if refused is not None else BAD_INPUT[first[0]](first[1])
    if error.__traceback__ is None:  # another rank's: its user's traceback where it had one
        error.user_traceback = first[2]
    error.raised_on_every_rank = True
    raise error


def _serve(server) -> list[int]:
    """Serve until every worker is done or lost; the workers lost on the way."""
    rank_started()  # `hvdtrain run` may pass a stop on to it now (requeue.py)
    server.serve()
    return server.membership.lost_workers


def _leave_if_lost(e: BaseException) -> None:
    """A worker the servers declared lost leaves quietly: the job goes on without it, and an
    abort would end the survivors too (ps/ledger.py)."""
    from .ps.membership import WorkerLost, exit_without_finalize

    if isinstance(e, WorkerLost):
        print(f"hvdtrain: {e}", file=sys.stderr, flush=True)
        exit_without_finalize()


def _end_async_job(e: BaseException, world, rank: int, trainer,
                   run_dir: str | None = None) -> None:
    """Print what went wrong and end every rank (abort). ``run_dir``: --run-dir, where a server
    (no trainer) logs why, as a worker other than the lead does."""
    code = failure_code(e)
    if code is None:
        traceback.print_exc()
    user_traceback = getattr(e, "user_traceback", None)
    if user_traceback and rank == 0:
        print(user_traceback, file=sys.stderr, end="", flush=True)
    where = "" if code == EXIT_BAD_INPUT else f" (rank {rank})"
    message = describe_failure(e) if code else f"{type(e).__name__}: {e}"
    if code is None and trainer is not None:
        message += f"; {intact_note(trainer.run_dir, 'fix the cause')}"
    elif code and trainer is not None and "parameter server" in str(e):  # waited on one
        from .ps.membership import lost_server_note

        message += f"; {lost_server_note(trainer.run_dir)}"
    folder = run_dir if trainer is None else None if trainer.is_main else trainer.run_dir
    if folder and code != EXIT_BAD_INPUT:  # the abort kills the lead before it logs the stop
        _log_failure(folder, f"rank {rank}: {message}")
    abort(world, f"hvdtrain: error{where}: {message}", code or EXIT_FAILED,
          collective=code == EXIT_BAD_INPUT)


def _log_failure(run_dir: Path, why: str) -> None:
    """The log's last line says why the run ended, where a rank other than the lead failed:
    the abort kills the lead before it could write it (its log ended at an epoch line, as if
    the run had been killed). Appended whole, as the lead appends its own lines."""
    from .loop.sinks import LOG_NAME
    from .run_output import JsonlLog, LogWriteError

    path = Path(run_dir) / LOG_NAME
    if not path.is_file():
        return
    try:  # locked until the abort: the lead's next line must not come after it
        JsonlLog(path, append=True).write_last("stop", reason=f"failed: {why.splitlines()[0]}")
    except (OSError, LogWriteError):  # the folder is gone or full: stderr still says why
        pass


def _build_trainer(cfg: Config, runtime, layout: Layout, scheme, workload: Workload, model):
    from .loop import Trainer
    from .pipeline import build_replica

    from .precision import check_devices

    replica = build_replica(model, cfg, runtime, layout, workload.objective())
    check_devices(cfg.run.precision, replica.devices, runtime.rank == 0)
    ready_replica(cfg, workload, replica)
    return Trainer(cfg, runtime, scheme, workload, replica)


def survivors_of(world, lost: list[int]):
    """The job's processes less the workers lost on the way (worker w is world rank w), for
    the final collective: a collective with a dead member never completes."""
    if not lost:
        return world
    import atexit

    from .ps.membership import exit_without_finalize

    atexit.register(exit_without_finalize)
    group = world.Get_group().Excl(sorted(set(lost)))  # a replacement may be lost again
    return world.Create_group(group, tag=999)


def abort(world, message: str, code: int, collective: bool = False) -> None:
    """Print, then end every rank of the job. For an error that all ranks raise together (a bad
    checkpoint), rank 0 alone prints and aborts; the others give it a moment to do so. Under
    mpirun's recovery settings MPI_Abort ends the job with exit code 0, so the launcher is
    also stopped (ps/membership.py fail_launcher): a failed job must not look like a success."""
    from .ps.membership import fail_launcher

    if collective and world.Get_rank() != 0:
        time.sleep(10)
    else:
        print(message, file=sys.stderr, flush=True)
    tell_wrapper("exit", code)  # `hvdtrain run` exits with it (mpirun's says 0 or 1)
    fail_launcher(code)
    world.Abort(code)
