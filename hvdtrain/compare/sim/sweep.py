"""The simulator's entry points: one simulated run (simulate_run), and a sweep over modes,
numbers of workers, stragglers and seeds, optionally at a fixed global batch
(strong_scaling_args)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ...config import ConfigError
from ...stragglers import StragglerModel
from ..plan import Mode
from ..results import RunResult
from ..target_metric import Target
from .flat_model import config_from_train_args
from .simulation import Simulation, failed_result
from .timing import Timing


def simulate_run(mode: Mode, workers: int, straggler: str, seed: int, train_args: Sequence[str],
                 target: Target | str | float, timing: Timing,
                 eval_every_steps: int | None = None,
                 stop_at_target: bool = False,
                 delays: StragglerModel | None = None) -> RunResult:
    """One simulated run: the RunResult a real run of ``mode`` on ``workers`` workers would
    report, on the virtual clock. ``train_args`` are hvdtrain train flags (dataset, model,
    epochs, batch size, optimizer...). Evaluations fall where a real run's do: at the ends of
    epochs (--eval-every) and every --eval-every-steps global steps, which ``eval_every_steps``
    overrides (a global step is every worker's batch once: a sync round, N async pushes).
    With ``stop_at_target`` the run ends at the first evaluation that reaches ``target`` (a
    Target, compare/target_metric.py: its metric in its direction; a float: a test accuracy),
    its figures then those up to there, as the time to target is all a sweep needs.
    ``delays``, in place of ``straggler``'s model, gives each worker's delay per step (an
    object with StragglerModel.delay, e.g. the per-worker fit of compare --from-run).
    Raises ConfigError for what cannot run (e.g. too few samples for N workers)."""
    return Simulation(mode, workers, straggler, seed, train_args, target, timing,
                      eval_every_steps, stop_at_target, delays).run()


def strong_scaling_args(train_args: Sequence[str], workers: int, global_batch: int,
                        under: Mode | None = None) -> list[str]:
    """``train_args`` for ``workers`` workers that share a global batch of ``global_batch``
    samples (strong scaling): --batch-size global_batch / workers, and --lr scaled with the
    per-worker batch (lr x batch / the flags' batch), so that under --lr-scaling linear sync's
    rate, lr x workers, is the same at every number of workers (with --lr-scaling none sync's
    rate is --lr itself, which is then kept). Only the warmup differs: it ramps from one
    worker's rate, which is lower with more workers. The number of global steps per epoch,
    samples // workers // batch, is then samples // global_batch whatever the workers, and
    so are the global batches themselves (data/builtin.py epoch_batches): sync trains the
    same model at every N. ConfigError if ``workers`` does not divide ``global_batch``.
    ``under``: the mode whose Config reads the flags (sync's by default), for flags that suit
    only some modes (--outer-momentum-every suits async DiLoCo alone)."""
    if workers < 1 or global_batch % workers:
        raise ConfigError(f"{workers} workers cannot split the global batch of {global_batch} "
                          "evenly; use numbers of workers that divide it, or another "
                          "--global-batch")
    cfg = config_from_train_args(train_args, under.config_options() if under else {})
    batch = global_batch // workers
    lr = cfg.optim.lr
    if cfg.optim.lr_scaling == "linear":
        lr *= batch / cfg.run.batch_size
    return [*train_args, "--batch-size", str(batch), "--lr", repr(lr)]  # the later flags win


def sweep(modes: Sequence[Mode], worker_counts: Sequence[int], train_args: Sequence[str],
          target: Target | str | float, timing: Timing | Callable[[int], Timing],
          stragglers: Sequence[str] = ("",), seeds: Sequence[int] = (0,),
          eval_every_steps: int | None = None,
          progress: Callable[[RunResult], None] | None = None,
          global_batch: int | None = None, stop_at_target: bool = False) -> list[RunResult]:
    """Every (straggler, workers, mode, seed), simulated. ``timing`` may depend on the number of
    workers (a callable), as a calibrated allreduce or a per-worker batch does. With
    ``global_batch`` the workers share that global batch (strong scaling, see
    strong_scaling_args); without, each worker takes the flags' --batch-size (weak scaling).
    A combination that cannot run (too few samples for N workers' batches, a global batch that
    N workers cannot share) is a failed RunResult with the reason, not an exception."""
    results = []

    def record(result: RunResult) -> None:
        results.append(result)
        if progress is not None:
            progress(result)

    for straggler in stragglers:
        straggler = "" if straggler.strip().lower() in ("", "none") else straggler.strip()
        for workers in worker_counts:
            runs = [(mode, seed) for mode in modes for seed in seeds]
            try:
                args = (strong_scaling_args(train_args, workers, global_batch,
                                            modes[0] if modes else None)
                        if global_batch else list(train_args))
                figures = timing(workers) if callable(timing) else timing
            except ConfigError as e:  # every run at this number of workers fails alike
                for mode, seed in runs:
                    record(failed_result(mode, workers, straggler, seed, str(e)))
                continue
            for mode, seed in runs:
                try:
                    record(simulate_run(mode, workers, straggler, seed, args, target, figures,
                                        eval_every_steps, stop_at_target))
                except ConfigError as e:
                    record(failed_result(mode, workers, straggler, seed, str(e)))
    return results
