"""Each rank on its own share of the host's cores, when the launcher placed none.

horovodrun starts its ranks unbound. With two ranks on two cores and one torch thread each, the
two compute threads, Horovod's background threads and Gloo's threads then share both cores and
move between them. In scripts/bench_sync.py's model (np=2, horovodrun --gloo) that gave 0.80 of
DDP over Gloo's samples/s, and 0.96 with each rank on a core of its own (docs/benchmarks.md,
issue 27). Open MPI already binds this way by itself when it starts 2 ranks or fewer, and
hvdtrain keeps a binding that a launcher or the user chose: only a process that may run on every
core of the machine is bound, so ``taskset``, ``numactl``, ``srun --cpu-bind``, a container's
cpuset and ``mpirun --bind-to ...`` all win.

The shares are whole physical cores (a core's hyperthreads stay together), so that two ranks
never compute on the two threads of one core while other cores idle.
"""

from __future__ import annotations

import os
from pathlib import Path

SYSFS_CPUS = Path("/sys/devices/system/cpu")


def local_rank_hint() -> int | None:
    """This process's rank on its host as the launcher tells it, before hvd.init()."""
    for name in ("HOROVOD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return None


def launcher_placed_ranks() -> bool:
    """Whether Open MPI bound this rank, or was told how to (``--bind-to none`` included)."""
    return (os.environ.get("OMPI_MCA_orte_bound_at_launch") == "1"
            or "OMPI_MCA_hwloc_base_binding_policy" in os.environ)


def local_size_hint() -> int:
    """The processes on this host as the launcher tells it, before hvd.init(); 1 if unknown."""
    for name in ("OMPI_COMM_WORLD_LOCAL_SIZE", "HOROVOD_LOCAL_SIZE", "MPI_LOCALNRANKS"):
        if os.environ.get(name, "").isdigit():
            return max(1, int(os.environ[name]))
    return 1


def release_default_binding(local_size: int) -> None:
    """Undo a core binding that Open MPI chose by itself, when it leaves this process fewer cores
    than its share. mpirun binds each rank to one core when it starts 2 ranks or fewer, unasked:
    at -np 1 on 2 cores that left hvdtrain one torch thread against DDP's two (torchrun binds
    nothing), 0.68 of DDP's samples/s in scripts/bench_sync.py. A binding the user asked for
    (--bind-to, which Open MPI passes on as OMPI_MCA_hwloc_base_binding_policy) stays.

    Call it before torch is imported: OpenMP (libgomp) counts the cores it may use once, when
    torch loads it, and where it runs more threads than it counted its idle threads sleep
    instead of spinning. Released after the import, mpirun -np 1 on 2 cores left a fifth of the
    cores idle and trained 0.8 as fast (docs/benchmarks.md). cli.main calls it first thing."""
    if os.environ.get("OMPI_MCA_orte_bound_at_launch") != "1" or \
            "OMPI_MCA_hwloc_base_binding_policy" in os.environ:
        return
    total = os.cpu_count() or 1
    if len(os.sched_getaffinity(0)) >= max(1, total // local_size):
        return
    try:
        os.sched_setaffinity(0, range(total))
    except OSError:  # a cpuset narrower than cpu_count(): keep what the launcher gave
        pass


def physical_cores(cpus: list[int], sysfs: Path | None = None) -> list[list[int]]:
    """The logical CPUs grouped by physical core, in (package, core) order. A CPU whose topology
    cannot be read counts as a core of its own."""
    cores: dict[tuple[int, int], list[int]] = {}
    for cpu in sorted(cpus):
        topology = (sysfs or SYSFS_CPUS) / f"cpu{cpu}" / "topology"
        try:
            key = (int((topology / "physical_package_id").read_text()),
                   int((topology / "core_id").read_text()))
        except (OSError, ValueError):
            key = (-1, cpu)
        cores.setdefault(key, []).append(cpu)
    return [cores[key] for key in sorted(cores)]


def share_of_cores(local_rank: int, local_size: int, cpus: list[int],
                   sysfs: Path | None = None) -> list[int]:
    """Local rank ``local_rank``'s slice of the physical cores among ``local_size`` ranks: an
    equal number of whole cores each, the first ranks on the first cores. Empty when there are
    fewer cores than ranks (binding would only stack ranks on each other)."""
    cores = physical_cores(cpus, sysfs)
    per_rank = len(cores) // local_size
    if per_rank == 0 or not 0 <= local_rank < local_size:
        return []
    mine = cores[local_rank * per_rank:(local_rank + 1) * per_rank]
    return [cpu for core in mine for cpu in core]


def bind_to_share(local_size: int) -> bool:
    """Bind this process to its share of the cores when several ranks share the host and nobody
    placed them; returns whether it did. Runs before hvd.init() and torch's thread pool, whose
    threads inherit the cores of the thread that starts them."""
    local_rank = local_rank_hint()
    if local_size < 2 or local_rank is None or launcher_placed_ranks():
        return False
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) != os.cpu_count():  # narrowed by a cpuset, taskset or the launcher
        return False
    mine = share_of_cores(local_rank, local_size, allowed)
    if not mine:
        return False
    try:
        os.sched_setaffinity(0, mine)
    except OSError:
        return False
    return True
