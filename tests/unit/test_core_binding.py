"""Ranks that no launcher placed get a share of whole physical cores each
(hvdtrain/core_binding.py); a placement that a launcher, a cpuset or the user chose stays."""

import os
from pathlib import Path

import pytest

from hvdtrain import core_binding


def fake_sysfs(root: Path, topology: dict[int, tuple[int, int]]) -> Path:
    """/sys/devices/system/cpu with cpu -> (package, core) as given."""
    for cpu, (package, core) in topology.items():
        folder = root / f"cpu{cpu}" / "topology"
        folder.mkdir(parents=True)
        (folder / "physical_package_id").write_text(f"{package}\n")
        (folder / "core_id").write_text(f"{core}\n")
    return root


def test_hyperthreads_of_one_core_stay_together(tmp_path):
    # 4 cores with 2 threads each, numbered as Linux usually does: cpu i and i+4 share a core
    sysfs = fake_sysfs(tmp_path, {cpu: (0, cpu % 4) for cpu in range(8)})
    assert core_binding.physical_cores(list(range(8)), sysfs) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert core_binding.share_of_cores(0, 2, list(range(8)), sysfs) == [0, 4, 1, 5]
    assert core_binding.share_of_cores(1, 2, list(range(8)), sysfs) == [2, 6, 3, 7]


def test_packages_are_filled_in_order_and_shares_are_equal(tmp_path):
    sysfs = fake_sysfs(tmp_path, {0: (0, 0), 1: (0, 1), 2: (1, 0), 3: (1, 1), 4: (1, 2)})
    shares = [core_binding.share_of_cores(r, 2, [0, 1, 2, 3, 4], sysfs) for r in range(2)]
    assert shares == [[0, 1], [2, 3]]  # 5 cores, 2 ranks: 2 each, the fifth left free


def test_more_ranks_than_cores_binds_nothing(tmp_path):
    sysfs = fake_sysfs(tmp_path, {0: (0, 0), 1: (0, 0)})  # one core, two threads
    assert core_binding.share_of_cores(0, 2, [0, 1], sysfs) == []


def test_an_unreadable_topology_counts_each_cpu_as_a_core(tmp_path):
    assert core_binding.physical_cores([3, 1], tmp_path / "missing") == [[1], [3]]


@pytest.fixture
def unplaced(monkeypatch):
    """A 2-core host where horovodrun started local rank 1 of 2, unbound. Returns the affinity
    set calls."""
    calls = []
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(os, "sched_setaffinity", lambda pid, cores: calls.append(list(cores)))
    monkeypatch.setattr(core_binding, "SYSFS_CPUS", Path("/nonexistent"))
    for name in ("OMPI_MCA_orte_bound_at_launch", "OMPI_MCA_hwloc_base_binding_policy",
                 "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOROVOD_LOCAL_RANK", "1")
    return calls


def test_an_unbound_rank_takes_its_share(unplaced):
    assert core_binding.bind_to_share(local_size=2)
    assert unplaced == [[1]]


@pytest.mark.parametrize("variable, value", [("OMPI_MCA_orte_bound_at_launch", "1"),
                                             ("OMPI_MCA_hwloc_base_binding_policy", "none")])
def test_open_mpis_placement_stays(unplaced, monkeypatch, variable, value):
    monkeypatch.setenv(variable, value)  # mpirun bound the rank, or was told --bind-to ...
    assert not core_binding.bind_to_share(local_size=2)
    assert unplaced == []


def test_a_narrowed_affinity_stays(unplaced, monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {1})  # taskset, a cpuset
    assert not core_binding.bind_to_share(local_size=2)
    assert unplaced == []


def test_one_rank_on_the_host_or_no_local_rank_binds_nothing(unplaced, monkeypatch):
    assert not core_binding.bind_to_share(local_size=1)
    monkeypatch.delenv("HOROVOD_LOCAL_RANK")
    assert not core_binding.bind_to_share(local_size=2)
    assert unplaced == []
