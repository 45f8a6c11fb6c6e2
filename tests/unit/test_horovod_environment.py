"""The Horovod settings hvdtrain starts with (runtime.horovod_environment): the cycle time it
chooses, and the wake on enqueue of hvdtrain's Horovod build
(scripts/setup/horovod-0.28.1-wake-on-enqueue.patch)."""

from hvdtrain.config import SyncConfig
from hvdtrain.runtime import horovod_environment, horovod_wakes_on_enqueue


def test_the_cycle_is_long_only_where_horovod_wakes_on_enqueue():
    woken = horovod_environment(SyncConfig(), wake=True)
    assert woken["HVDTRAIN_WAKE_ON_ENQUEUE"] == "1" and woken["HOROVOD_CYCLE_TIME"] == "10"
    plain = horovod_environment(SyncConfig(), wake=False)
    # Without the wake every collective waits up to a cycle: Horovod's own 1 ms stays.
    assert plain["HVDTRAIN_WAKE_ON_ENQUEUE"] == "0" and plain["HOROVOD_CYCLE_TIME"] == "1"


def test_mpi_waits_yield_with_the_wake_unless_set(monkeypatch):
    monkeypatch.delenv("OMPI_MCA_mpi_yield_when_idle", raising=False)
    assert horovod_environment(SyncConfig(), wake=True)["OMPI_MCA_mpi_yield_when_idle"] == "1"
    assert "OMPI_MCA_mpi_yield_when_idle" not in horovod_environment(SyncConfig(), wake=False)
    monkeypatch.setenv("OMPI_MCA_mpi_yield_when_idle", "0")  # the user's choice stays
    assert "OMPI_MCA_mpi_yield_when_idle" not in horovod_environment(SyncConfig(), wake=True)


def test_a_cycle_time_given_is_kept_either_way():
    for wake in (True, False):
        env = horovod_environment(SyncConfig(cycle_time_ms=2.5), wake=wake)
        assert env["HOROVOD_CYCLE_TIME"] == "2.5"


def test_the_installed_horovod_is_hvdtrain_build():
    # make setup builds Horovod with every patch in scripts/setup; a wheel built without the
    # wake patch would quietly fall back to the 1 ms cycle and per-gradient allreduces.
    assert horovod_wakes_on_enqueue()
