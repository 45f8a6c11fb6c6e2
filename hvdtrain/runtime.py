"""Who am I: rank, size, local rank, devices. Read once at start-up; plain fields after that.

A single process with no launcher is a world of size 1 and goes through the same code.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .config import ConfigError, RunConfig, SyncConfig
from .core_binding import bind_to_share, local_size_hint, release_default_binding
from .freed_memory import keep_freed_memory


@dataclass(frozen=True)
class Runtime:
    rank: int
    size: int
    local_rank: int
    local_size: int
    device: torch.device
    launcher: str  # "horovodrun --gloo", "mpirun" or "none": shown in logs
    # Horovod starts each collective as soon as it is enqueued (horovod_wakes_on_enqueue)
    horovod_wakes: bool = False
    # glibc keeps freed blocks for the next step (freed_memory.py; CPU training under Horovod)
    keeps_freed_memory: bool = False

    @property
    def is_main_process(self) -> bool:
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        return self.size > 1


def detect_launcher() -> str:
    if "HOROVOD_RANK" in os.environ and "HOROVOD_GLOO_RENDEZVOUS_ADDR" in os.environ:
        return "horovodrun --gloo"
    if "OMPI_COMM_WORLD_RANK" in os.environ or "PMI_RANK" in os.environ:
        return "mpirun"
    if "TORCHELASTIC_RUN_ID" in os.environ:  # torchrun's, in every process it starts
        return "torchrun"
    return "none"


# --cycle-time-ms 0 (the default): with the wake, the cycle only paces Horovod's idle
# negotiation, and 10 ms leaves the forward and backward passes their CPU; without it every
# collective waits up to a cycle, and Horovod's own 1 ms stays (docs/benchmarks.md, "Stop 40").
IDLE_CYCLE_MS_WITH_WAKE = 10.0
HOROVOD_CYCLE_MS = 1.0


def horovod_wakes_on_enqueue() -> bool:
    """Whether the installed Horovod is hvdtrain's build, whose background thread starts a
    collective as soon as it is enqueued when HVDTRAIN_WAKE_ON_ENQUEUE=1
    (scripts/setup/horovod-0.28.1-wake-on-enqueue.patch). Loads Horovod without starting it."""
    from horovod.torch.mpi_ops import _basics

    return hasattr(_basics.MPI_LIB_CTYPES, "horovod_wakes_on_enqueue")


def horovod_environment(sync: SyncConfig, wake: bool = False) -> dict[str, str]:
    """Horovod's tuning knobs as environment variables; Horovod reads them in hvd.init().
    ``wake``: turn on the wake on enqueue (CPU training with hvdtrain's Horovod build)."""
    cycle = sync.cycle_time_ms or (IDLE_CYCLE_MS_WITH_WAKE if wake else HOROVOD_CYCLE_MS)
    env = {"HOROVOD_CYCLE_TIME": f"{cycle:g}", "HVDTRAIN_WAKE_ON_ENQUEUE": "1" if wake else "0"}
    if wake and "OMPI_MCA_mpi_yield_when_idle" not in os.environ:  # a value given is kept
        # With the wake, a rank that waits for a slower one negotiates at once and stays in
        # that collective until the slower rank's thread joins, up to a 10 ms cycle; under MPI
        # (Open MPI polls) it would spin a second thread beside the main thread's wait and,
        # where ranks share cores, slow the rank it waits for (a 5x straggler measured up to
        # 10x). Polling that yields gives such a rank its core first.
        env["OMPI_MCA_mpi_yield_when_idle"] = "1"
    if not sync.elastic:
        # Measured with Horovod 0.28.1 and Gloo: with both HOROVOD_FUSION_THRESHOLD and
        # HOROVOD_CYCLE_TIME set, hvd.init() segfaults when elastic training re-initialises after
        # losing a worker (either one alone is fine). Elastic runs keep Horovod's fusion default.
        env["HOROVOD_FUSION_THRESHOLD"] = str(int(sync.fusion_threshold_mb * 1024 * 1024))
    if sync.stall_timeout_s:
        # Warn about a collective that some ranks have not joined, then shut down with an error
        # (HorovodInternalError on every rank) rather than hang until the job's wall-time limit.
        env["HOROVOD_STALL_CHECK_TIME_SECONDS"] = f"{max(1, int(sync.stall_timeout_s // 4))}"
        env["HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"] = f"{max(1, int(sync.stall_timeout_s))}"
    else:
        env["HOROVOD_STALL_CHECK_DISABLE"] = "1"
    return env


def start_horovod(run: RunConfig, sync: SyncConfig) -> Runtime:
    """hvd.init() with hvdtrain's tuned settings, then pick this rank's device and threads."""
    if sync.elastic and os.environ.get("HOROVOD_ELASTIC") != "1":
        # Under mpirun, plain horovodrun or no launcher every rank would train, but without
        # elastic's rendezvous: a lost rank still ends the job, which is what --elastic was
        # asked to prevent. horovodrun sets HOROVOD_ELASTIC=1 in its elastic mode only.
        launcher = detect_launcher()
        started = {"mpirun": "by mpirun", "none": "without a launcher"}.get(
            launcher, f"by {launcher} without --min-np/--max-np or --host-discovery-script")
        raise ConfigError(f"--elastic needs horovodrun's elastic mode, and this job was started "
                          f"{started}: launch with horovodrun -np N --gloo --min-np/--max-np "
                          "--host-discovery-script, or drop --elastic")
    if detect_launcher() == "torchrun":
        # Horovod finds no job there: each process trained alone, into a folder of its own
        raise ConfigError("this job was started by torchrun, whose processes Horovod cannot "
                          "join (each would train alone): add --collective torch "
                          "(torch.distributed, which takes torchrun's rendezvous), or launch "
                          "with horovodrun -np N or mpirun -np N")
    if sync.reduce_op == "adasum" and os.environ.get("HOROVOD_CONTROLLER") == "gloo":
        # Horovod's Gloo controller has no Adasum: the first step failed with "No Adasum
        # operation enabled", blamed on another rank or a stall
        raise ConfigError("--reduce-op adasum needs Horovod's MPI controller, and this job "
                          "runs on Gloo (horovodrun --gloo): launch with mpirun or horovodrun "
                          "--mpi, or use --reduce-op average")
    on_host = local_size_hint()
    # Done already where the command line started this process (cli.main); here for fit().
    release_default_binding(on_host)
    # --threads N: the user places the process; an elastic reset renumbers the local ranks that
    # the shares follow
    if not run.threads and not sync.elastic:
        bind_to_share(on_host)
    import horovod.torch as hvd

    # On GPUs the per-gradient allreduces keep Horovod's cadence, which fuses them; see
    # sync/horovod.py.
    # Not under --elastic: a job that took in a third worker hung after the reset with it on
    # (tests/multiproc/test_elastic.py; not investigated further).
    on_cpu = trains_on_cpu(run.device)
    wake = on_cpu and not sync.elastic and horovod_wakes_on_enqueue()
    os.environ.update(horovod_environment(sync, wake))
    keeps_freed = on_cpu and keep_freed_memory()  # freed_memory.py
    hvd.init()
    runtime = Runtime(rank=hvd.rank(), size=hvd.size(), local_rank=hvd.local_rank(),
                      local_size=hvd.local_size(),
                      device=pick_device(run.device, hvd.local_rank()),
                      launcher=detect_launcher(), horovod_wakes=wake,
                      keeps_freed_memory=keeps_freed)
    configure_torch(run, runtime.local_size)
    return runtime


def start_mpi(run: RunConfig, is_server: Callable[[int, int], bool],
              server_device: str = "cpu") -> Runtime:
    """MPI through mpi4py, for the parameter server (async mode). mpi4py asks for
    MPI_THREAD_MULTIPLE, which Horovod also wants should both live in one process.
    ``is_server(rank, world_size)``: whether that rank serves (the job's Topology, layout.py).

    Servers stay on the CPU unless ``server_device`` (--server-device) says otherwise
    (pick_server_device). A worker's local rank counts the workers on its host only, so that
    the workers take GPUs 0, 1, ... however the servers are placed among them."""
    launcher = detect_launcher()
    if launcher in ("horovodrun --gloo", "torchrun"):
        raise ConfigError(f"--mode async talks MPI, but {launcher} starts no MPI job; "
                          "launch with mpirun -np N, or horovodrun --mpi -np N")
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    serves = is_server(rank, size)  # an impossible split fails everywhere
    if run.device.startswith("cuda") and not torch.cuda.is_available():
        pick_device(run.device, 0)  # the same message on every rank, servers included
    if server_device == "cuda":  # a server's host may lack what the workers' hosts have
        check_server_cuda(world.allreduce(int(serves and not torch.cuda.is_available())))
    node = world.Split_type(MPI.COMM_TYPE_SHARED)  # the ranks on this host
    peers = node.Split(int(serves), rank)           # ... that have this rank's role
    local_rank, local_size, host_size = peers.Get_rank(), peers.Get_size(), node.Get_size()
    peers.Free()
    node.Free()
    device = (pick_server_device(server_device, local_rank) if serves
              else pick_device(run.device, local_rank))
    runtime = Runtime(rank=rank, size=size, local_rank=local_rank, local_size=local_size,
                      device=device, launcher=launcher)
    configure_torch(run, host_size)  # every process on the host shares its cores
    return runtime


def trains_on_cpu(requested: str) -> bool:
    """Whether --device ``requested`` trains on the CPU (pick_device's choice, known before
    Horovod starts)."""
    return requested == "cpu" or (requested == "auto" and not torch.cuda.is_available())


def pick_device(requested: str, local_rank: int) -> torch.device:
    if requested == "cpu":
        return torch.device("cpu")
    if requested == "auto" and not torch.cuda.is_available():
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError(f"--device {requested}: this torch build sees no CUDA device; "
                          "use --device cpu, or install a CUDA build of torch")
    if requested.startswith("cuda:"):
        device = torch.device(requested)
    else:  # one GPU per local rank
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    return device


def check_server_cuda(servers_without_cuda: int) -> None:
    """--server-device cuda: every rank raises the same error (so that no rank waits for one
    that left) when any server rank sees no CUDA device."""
    if servers_without_cuda:
        raise ConfigError(f"--server-device cuda: {servers_without_cuda} parameter server "
                          "rank(s) see no CUDA device; use --server-device auto (a GPU where "
                          "the server has one) or cpu, or place the servers on GPU hosts")


def pick_server_device(requested: str, local_server: int) -> torch.device:
    """A server's device: the CPU for --server-device cpu (and for auto without CUDA); else a
    GPU counted from the host's last, server ``local_server`` of the host taking the
    (local_server + 1)-th from the end, so that servers and workers (which count from GPU 0)
    share a GPU only when the host has fewer GPUs than processes."""
    if requested == "cpu" or not torch.cuda.is_available():  # cuda without: check_server_cuda
        return torch.device("cpu")
    count = torch.cuda.device_count()
    device = torch.device("cuda", (count - 1 - local_server) % count)
    torch.cuda.set_device(device)
    return device


def configure_torch(run: RunConfig, processes_on_host: int) -> None:
    torch.set_num_threads(run.threads or default_threads(processes_on_host))
    if run.deterministic:
        torch.use_deterministic_algorithms(True)


def default_threads(local_size: int) -> int:
    """Cores per process. Without this each rank starts one thread per core, and N ranks on one
    host oversubscribe it N-fold, which on a small machine costs more than the allreduce."""
    allowed = len(os.sched_getaffinity(0))
    total = os.cpu_count() or allowed
    if allowed < total:  # the launcher bound us to a subset of cores: use exactly those
        return allowed
    return max(1, total // max(1, local_size))
