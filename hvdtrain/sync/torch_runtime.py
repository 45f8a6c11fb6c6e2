"""Start and stop torch.distributed for ``--collective torch``, under torchrun, mpirun,
horovodrun or no launcher.

Rendezvous: under torchrun, its own (env://: MASTER_ADDR, MASTER_PORT). Elsewhere rank 0 opens
the TCP store on a port the kernel picks (port 0), so no other process can take it between a
choice and its use, and tells the others where it listens: through MPI (mpi4py's bcast) under
mpirun, through horovodrun's own rendezvous server (the key-value store at
HOROVOD_GLOO_RENDEZVOUS_ADDR/PORT that Horovod's Gloo finds its peers by) under horovodrun
--gloo. Both channels belong to this one job, so a stale address from an earlier run cannot be
read, and neither needs a folder shared between hosts (a FileStore would, and a file left by a
killed run would mislead the next). A missing peer fails after the timeout with a message that
says so, instead of hanging.
"""

from __future__ import annotations

import datetime
import os
import socket
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..core_binding import bind_to_share, release_default_binding
from ..errors import ConfigError
from ..freed_memory import keep_freed_memory
from ..runtime import Runtime, configure_torch, pick_device

if TYPE_CHECKING:
    from ..config import Config, RunConfig, SyncConfig

# without --stall-timeout-s, a missing peer at start-up still ends the job, after this long
DEFAULT_TIMEOUT_S = 1800.0
RENDEZVOUS_KEY = "hvdtrain_torch/store"  # horovodrun's key-value store: scope/key


@dataclass(frozen=True)
class Placement:
    """Who this process is, as its launcher says: world rank and size, rank and size on its
    host, and the launcher's name (for logs and errors)."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    launcher: str


def _env_int(*names: str, default: int | None = None) -> int | None:
    for name in names:
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return default


def placement() -> Placement:
    """Rank, size and local rank from torchrun (RANK, WORLD_SIZE, LOCAL_RANK), horovodrun
    (HOROVOD_RANK, ...) or mpirun (OMPI_COMM_WORLD_RANK, ...); one process without any."""
    for launcher, prefix, local in (("torchrun", "", "LOCAL_WORLD_SIZE"),
                                    ("horovodrun --gloo", "HOROVOD_", "HOROVOD_LOCAL_SIZE"),
                                    ("mpirun", "OMPI_COMM_WORLD_", "OMPI_COMM_WORLD_LOCAL_SIZE")):
        size_name = "WORLD_SIZE" if launcher == "torchrun" else prefix + "SIZE"
        rank = _env_int(prefix + "RANK")
        size = _env_int(size_name)
        if rank is None or size is None:
            continue
        if launcher == "horovodrun --gloo" and "HOROVOD_GLOO_RENDEZVOUS_ADDR" not in os.environ:
            continue  # horovodrun --mpi: an MPI job, read as mpirun's
        local_rank = _env_int(prefix + "LOCAL_RANK", default=0)
        local_size = _env_int(local, default=1)
        return Placement(rank, size, local_rank, local_size, launcher)
    return Placement(0, 1, 0, 1, "none")


def _timeout_s(sync: SyncConfig) -> float:
    return sync.stall_timeout_s or DEFAULT_TIMEOUT_S


def _announce_by_mpi(store_address: tuple[str, int] | None) -> tuple[str, int]:
    from mpi4py import MPI

    return MPI.COMM_WORLD.bcast(store_address, root=0)


def _horovod_kv_url() -> str:
    return (f"http://{os.environ['HOROVOD_GLOO_RENDEZVOUS_ADDR']}:"
            f"{os.environ['HOROVOD_GLOO_RENDEZVOUS_PORT']}/{RENDEZVOUS_KEY}")


def _announce_by_horovodrun(store_address: tuple[str, int] | None,
                            timeout_s: float) -> tuple[str, int]:
    """Rank 0 puts its store's address into horovodrun's key-value store; the others poll it."""
    url = _horovod_kv_url()
    if store_address is not None:
        request = urllib.request.Request(url, data=f"{store_address[0]}:{store_address[1]}"
                                         .encode(), method="PUT")
        urllib.request.urlopen(request, timeout=30).close()
        return store_address
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=30) as reply:
                host, _, port = reply.read().decode().rpartition(":")
                return host, int(port)
        except urllib.error.HTTPError as e:  # 404 until rank 0 has put it
            if e.code != 404 or time.monotonic() > deadline:
                raise
        time.sleep(0.05)


def _rank0_host() -> str:
    """The address the other ranks reach rank 0's store at: MASTER_ADDR if given, the host
    name horovodrun reached it by, else this host's name."""
    return (os.environ.get("MASTER_ADDR") or os.environ.get("HOROVOD_HOSTNAME")
            or socket.gethostname())


def _store(place: Placement, timeout_s: float):
    """The process group's store, found as the module docstring says (not under torchrun)."""
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=timeout_s)
    if place.size == 1:
        return dist.HashStore()
    store = None
    address = None
    if place.rank == 0:  # listens on every interface; the kernel picks the port
        store = dist.TCPStore("0.0.0.0", 0, place.size, is_master=True, timeout=timeout,
                              wait_for_workers=False)
        address = (_rank0_host(), store.port)
    if place.launcher == "mpirun":
        address = _announce_by_mpi(address)
    else:
        address = _announce_by_horovodrun(address, timeout_s)
    if store is None:
        store = dist.TCPStore(address[0], address[1], place.size, is_master=False,
                              timeout=timeout)
    return store


def start_torch_distributed(run: RunConfig, sync: SyncConfig) -> Runtime:
    """torch.distributed's process group (Gloo on CPUs, NCCL on GPUs), then this rank's device
    and threads as start_horovod picks them."""
    import torch.distributed as dist

    place = placement()
    release_default_binding(place.local_size)  # as start_horovod: see core_binding.py
    if not run.threads:
        bind_to_share(place.local_size)
    device = pick_device(run.device, place.local_rank)
    backend = "nccl" if device.type == "cuda" else "gloo"
    timeout_s = _timeout_s(sync)
    try:
        if place.launcher == "torchrun":
            dist.init_process_group(backend, init_method="env://", rank=place.rank,
                                    world_size=place.size,
                                    timeout=datetime.timedelta(seconds=timeout_s))
        else:
            dist.init_process_group(backend, store=_store(place, timeout_s), rank=place.rank,
                                    world_size=place.size,
                                    timeout=datetime.timedelta(seconds=timeout_s))
    except (RuntimeError, OSError) as e:  # DistStoreError, DistNetworkError, refused sockets
        raise ConfigError(
            f"--collective torch: rank {place.rank} of {place.size} ({place.launcher}) could "
            f"not meet the other ranks within {timeout_s:g} s ({type(e).__name__}: {e}); check "
            "that every rank was started and that rank 0's host is reachable "
            "(MASTER_ADDR), or raise --stall-timeout-s") from e
    # as start_horovod on CPUs: each step's flat copy of the gradients reuses its pages
    keeps_freed = device.type == "cpu" and keep_freed_memory()
    runtime = Runtime(rank=place.rank, size=place.size, local_rank=place.local_rank,
                      local_size=place.local_size, device=device,
                      launcher=f"{place.launcher} (torch.distributed {backend})",
                      keeps_freed_memory=keeps_freed)
    configure_torch(run, place.local_size)
    return runtime


def stop_torch_distributed(finished: bool) -> None:
    """Destroy the process group (safe when none was started), and with it Gloo's worker
    threads, while the interpreter is alive. A Gloo thread that releases the last reference to
    a tensor of Python's takes the GIL; if the interpreter is finalizing by then, that thread is
    ended mid-call and the process aborts (SIGABRT, "terminate called without an active
    exception", exit code 134 after the run's last line: 4 runs of 30 here, none of 70 since).
    After a run that ``finished`` every rank meets first, so that no collective is still in
    flight (not after a failure, where the others may never come); the collection frees what
    still holds the group, so that its destructor joins the threads now."""
    import gc

    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        if finished:
            dist.barrier()
        dist.destroy_process_group()
        gc.collect()


def torch_scheme(cfg: Config, runtime: Runtime):
    """The scheme of --collective torch: sync's (sync/collective.py) or local SGD's and
    DiLoCo's (sync/local_rounds_scheme.py), the classes Horovod's run, over torch.distributed."""
    from .collective import CollectiveSync
    from .local_rounds_scheme import LocalSGDSync
    from .torch_collective import TorchCollective

    port = TorchCollective(runtime.device, cfg.sync.compression)
    scheme = LocalSGDSync if cfg.sync.local_steps > 1 else CollectiveSync
    return scheme(cfg, runtime, port)
