"""rules/registry.py: one table gives each mode's scheme, flags, Config options and rules."""

from __future__ import annotations

import math

import pytest

from hvdtrain.compare.sim.flat_model import config_from_train_args
from hvdtrain.config import field_owners
from hvdtrain.rules.backup import BackupWorkers
from hvdtrain.rules.bsp import LockStepRounds
from hvdtrain.rules.dc_asgd import DelayCompensation
from hvdtrain.rules.registry import FAMILIES, MODE_NAMES, modes, server_rules
from hvdtrain.rules.ssp import StalenessBound
from hvdtrain.rules.staleness_lr import StalenessWeight

ALL = modes(list(FAMILIES), bounds=[2], backups=[1], local_steps=[4])


def test_the_table_names_every_mode_of_the_comparison():
    assert MODE_NAMES == ("sync, balanced, local, diloco, async, adiloco, ssp, backup, async-slr, "
                          "dcasgd")
    assert [m.name for m in ALL] == ["sync", "balanced", "local4", "diloco4", "async",
                                     "adiloco4", "ssp2", "backup1", "async-slr", "dcasgd"]


@pytest.mark.parametrize("mode", ALL, ids=[m.name for m in ALL])
def test_a_mode_s_flags_set_its_config_options(mode):
    """What a real run's flags set is what the simulator's Config gets (the same rules)."""
    cfg = config_from_train_args(mode.train_flags(), {})
    options = mode.config_options()
    assert cfg.run.mode == options.pop("mode")
    for name, value in options.items():
        section = getattr(cfg, field_owners()[name])
        assert getattr(section, name) == value, name


def test_balanced_is_sync_with_balance():
    [balanced] = modes(["balanced"], [])
    assert not balanced.is_async and balanced.local_steps == 1
    assert balanced.train_flags() == ["--mode", "sync", "--balance"]
    assert balanced.config_options()["balance"] is True
    assert "balance" not in modes(["sync"], [])[0].config_options()


def test_each_async_mode_gets_its_rule_objects():
    rules = {m.name: m.server_rules(3) for m in ALL if m.is_async}
    assert isinstance(rules["async"].policy, StalenessBound)
    assert math.isinf(rules["async"].policy.bound) and rules["ssp2"].policy.bound == 2
    assert isinstance(rules["backup1"].policy, BackupWorkers)
    assert rules["backup1"].policy.lr_scale(3) == 2.0
    assert [type(a) for a in rules["async-slr"].step.adjustments] == [StalenessWeight]
    assert [type(a) for a in rules["dcasgd"].step.adjustments] == [DelayCompensation]
    assert rules["async"].step.adjustments == []


def test_the_server_reads_the_same_table_from_a_config():
    cfg = config_from_train_args(["--mode", "async", "--bsp"], {})
    assert type(server_rules(cfg.ps, 2).policy) is LockStepRounds
