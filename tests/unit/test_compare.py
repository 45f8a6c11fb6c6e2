"""``hvdtrain compare``: the plan, the figures read from logs, the report (in-process; the real
comparisons that run hvdtrain are in tests/multiproc/test_compare_multiproc.py)."""

import math

import pytest

from hvdtrain.compare.plan import Mode, modes, plan
from hvdtrain.compare.report import finding, summarize
from hvdtrain.compare.results import RunResult, time_to_target
from hvdtrain.stragglers import StragglerModel, parse_straggler


def test_plan_covers_every_condition_mode_and_seed():
    ms = modes(["sync", "async", "ssp"], [0, 4])
    assert [m.name for m in ms] == ["sync", "async", "ssp0", "ssp4"]
    runs = plan(ms, [0, 1], ["none", "3x"], workers=2, train_args=["--epochs", "5"])
    assert len(runs) == 2 * 4 * 2
    assert len({r.name for r in runs}) == len(runs)
    sync = next(r for r in runs if r.name == "sync-seed1-straggler3x")
    assert sync.processes == 2 and sync.straggler == "3x"
    ssp = next(r for r in runs if r.name == "ssp4-seed0")
    assert ssp.processes == 3  # two workers and the server
    cmd = ssp.command("python", "out/ssp4-seed0", cores=2)
    assert cmd[:4] == ["mpirun", "-np", "3", "--oversubscribe"]
    assert cmd[cmd.index("--staleness") + 1] == "4" and "--straggler" not in cmd
    assert Mode("async").train_flags() == ["--mode", "async", "--staleness", "inf"]
    assert "--oversubscribe" not in sync.command("python", "d", cores=2)
    with pytest.raises(ValueError, match="unknown mode 'hogwild'"):
        modes(["hogwild"], [])


def test_straggler_spec():
    assert parse_straggler("3x") == StragglerModel("last", factor=3.0)
    assert parse_straggler("50ms") == StragglerModel("last", seconds=0.05)
    assert parse_straggler("none") == StragglerModel()
    for bad in ["0.5x", "fast", "-3ms", "3"]:
        with pytest.raises(ValueError):
            parse_straggler(bad)


def _result(name, mode, straggler, seed, times, status="ok"):
    curve = [{"step": 10 * (i + 1), "wall_seconds": t, "train_loss": 1.0 / (i + 1),
              "test_acc": acc} for i, (t, acc) in enumerate(times)]
    return RunResult(name, mode, straggler, seed, status, "" if status == "ok" else "boom",
                     curve[-1]["test_acc"] if curve else None,
                     time_to_target(curve, 0.9), 1000.0, 0.0 if mode == "sync" else 1.5,
                     curve[-1]["wall_seconds"] if curve else None, curve,
                     {} if mode == "sync" else {0: 5, 3: 5})


def test_time_to_target_is_the_first_evaluation_at_or_above_it():
    curve = [{"wall_seconds": 1.0, "test_acc": 0.5}, {"wall_seconds": 2.0, "test_acc": None},
             {"wall_seconds": 3.0, "test_acc": 0.9}, {"wall_seconds": 4.0, "test_acc": 0.95}]
    assert time_to_target(curve, 0.9) == 3.0
    assert time_to_target(curve, 0.99) is None


def test_finding_states_what_was_measured():
    results = [
        _result("sync-0", "sync", "3x", 0, [(2.0, 0.8), (4.0, 0.95)]),
        _result("sync-1", "sync", "3x", 1, [(2.2, 0.8), (4.4, 0.95)]),
        _result("async-0", "async", "3x", 0, [(1.0, 0.92)]),
        _result("async-1", "async", "3x", 1, [(1.2, 0.93)]),
        _result("ssp-0", "ssp2", "3x", 0, [], status="failed"),
    ]
    summary = summarize(results)
    assert summary[("3x", "sync")]["time"][0] == pytest.approx(4.2)
    assert summary[("3x", "ssp2")]["failed"]
    text = finding(summary, "3x", 0.9)
    assert "async beats sync" in text and "3.82x sooner" in text
    assert "Not every run of ssp2" in text
    slower = [_result("sync-0", "sync", "none", 0, [(1.0, 0.95)]),
              _result("async-0", "async", "none", 0, [(3.0, 0.95)])]
    assert "sync is fastest" in finding(summarize(slower), "none", 0.9)
