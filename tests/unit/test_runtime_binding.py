"""Open MPI's own core binding is released when it starts a rank short of its share of cores
(runtime.release_default_binding); a binding the user asked for stays."""

import os

import pytest

from hvdtrain import runtime


@pytest.fixture
def machine(monkeypatch):
    """A 2-core host; the process is bound to core 0. Returns the affinity set calls."""
    calls = []
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    monkeypatch.setattr(os, "sched_setaffinity", lambda pid, cores: calls.append(set(cores)))
    monkeypatch.delenv("OMPI_MCA_hwloc_base_binding_policy", raising=False)
    monkeypatch.setenv("OMPI_MCA_orte_bound_at_launch", "1")
    return calls


def test_mpirun_default_binding_at_np1_is_released(machine):
    runtime.release_default_binding(local_size=1)
    assert machine == [{0, 1}]


def test_a_binding_the_user_asked_for_stays(machine, monkeypatch):
    monkeypatch.setenv("OMPI_MCA_hwloc_base_binding_policy", "core")
    runtime.release_default_binding(local_size=1)
    assert machine == []


def test_a_binding_that_gives_the_rank_its_share_stays(machine):
    runtime.release_default_binding(local_size=2)  # 2 ranks on 2 cores: one core each
    assert machine == []


def test_no_binding_at_launch_is_left_alone(machine, monkeypatch):
    monkeypatch.delenv("OMPI_MCA_orte_bound_at_launch")
    runtime.release_default_binding(local_size=1)
    assert machine == []


def test_local_size_hint_reads_the_launchers_variable(monkeypatch):
    for name in ("OMPI_COMM_WORLD_LOCAL_SIZE", "HOROVOD_LOCAL_SIZE", "MPI_LOCALNRANKS"):
        monkeypatch.delenv(name, raising=False)
    assert runtime.local_size_hint() == 1
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "3")
    assert runtime.local_size_hint() == 3
