"""Open MPI's own core binding is released when it starts a rank short of its share of cores
(core_binding.release_default_binding); a binding the user asked for stays."""

import os
import subprocess
import sys

import pytest

from hvdtrain import core_binding


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
    core_binding.release_default_binding(local_size=1)
    assert machine == [{0, 1}]


def test_a_binding_the_user_asked_for_stays(machine, monkeypatch):
    monkeypatch.setenv("OMPI_MCA_hwloc_base_binding_policy", "core")
    core_binding.release_default_binding(local_size=1)
    assert machine == []


def test_a_binding_that_gives_the_rank_its_share_stays(machine):
    core_binding.release_default_binding(local_size=2)  # 2 ranks on 2 cores: one core each
    assert machine == []


def test_no_binding_at_launch_is_left_alone(machine, monkeypatch):
    monkeypatch.delenv("OMPI_MCA_orte_bound_at_launch")
    core_binding.release_default_binding(local_size=1)
    assert machine == []


def test_local_size_hint_reads_the_launchers_variable(monkeypatch):
    for name in ("OMPI_COMM_WORLD_LOCAL_SIZE", "HOROVOD_LOCAL_SIZE", "MPI_LOCALNRANKS"):
        monkeypatch.delenv(name, raising=False)
    assert core_binding.local_size_hint() == 1
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "3")
    assert core_binding.local_size_hint() == 3


def test_the_command_line_releases_before_torch_loads():
    """OpenMP counts its cores once, when torch loads it: a release after that leaves its idle
    threads sleeping (core_binding.release_default_binding), so cli.main releases first."""
    code = ("import sys, hvdtrain.cli as cli\n"
            "seen = []\n"
            "cli.release_default_binding = lambda n: seen.append('torch' in sys.modules)\n"
            "try:\n    cli.main(['--version'])\nexcept SystemExit:\n    pass\n"
            "print(seen)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[False]", proc.stdout
