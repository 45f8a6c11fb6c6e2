"""The simulator runs the real schemes' engine classes (issue 42): not copies of the algorithm,
checked by identity, not by comparing results (those are test_simulate.py's)."""

from __future__ import annotations

import pytest
import torch

from hvdtrain.compare.plan import Mode
from hvdtrain.compare.sim.virtual_collective import VirtualCluster
from hvdtrain.compare.sim.simulation import Simulation
from hvdtrain.compare.sim.timing import Timing
from hvdtrain.config import Config
from hvdtrain.engines.local_rounds import LocalRounds
from hvdtrain.engines.sync_step import SyncStep
from hvdtrain.replica import Replica
from hvdtrain.sync import horovod
from hvdtrain.sync.collective import CollectiveSync
from hvdtrain.sync.local_rounds_scheme import LocalSGDSync

DIGITS = ["--dataset", "digits", "--model", "mlp", "--hidden", "32", "--threads", "1",
          "--epochs", "1", "--max-steps-per-epoch", "4"]


@pytest.mark.parametrize("mode, engine", [
    (Mode("sync", scheme="sync"), SyncStep),
    (Mode("local2", scheme="sync", local_steps=2), LocalRounds),
    (Mode("diloco2", scheme="sync", local_steps=2, outer_lr=0.7, outer_momentum=0.9),
     LocalRounds),
])
def test_the_simulator_runs_the_real_schemes_engine_classes(mode, engine):
    """Not copies of the algorithm: each virtual worker runs an engine of the very class that
    the real scheme builds in attach() (here over a one-worker virtual collective)."""
    sim = Simulation(mode, 2, "", 0, DIGITS, 0.9, Timing(0.01))
    assert sim.run().status == "ok"
    options = {"local_steps": mode.local_steps, "outer_lr": mode.outer_lr,
               "outer_momentum": mode.outer_momentum}
    cfg = Config.from_overrides(options).validate()
    real = (LocalSGDSync if mode.local_steps > 1 else CollectiveSync)(
        cfg, None, VirtualCluster(1).port(0))
    real.attach(Replica(torch.nn.Linear(4, 2), torch.device("cpu")))
    real_engine = real.rounds if mode.local_steps > 1 else real.engine
    assert type(real_engine) is engine
    assert all(type(w.engine) is type(real_engine) for w in sim.workers)


def test_horovod_s_scheme_builds_the_same_sync_engine_class():
    # HorovodSync needs Horovod started to attach; the class it builds its engine from is the
    # one the simulator and CollectiveSync run.
    assert issubclass(horovod.HorovodSync, CollectiveSync) and horovod.SyncStep is SyncStep
