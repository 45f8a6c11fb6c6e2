"""scripts/bench_sync.py keeps the rounds it measured when one launch crashes (torch's Gloo
aborted a DDP job in one of stop 39's rounds, and the whole table was lost)."""

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def load_bench():
    sys.path.insert(0, str(REPO / "scripts"))
    spec = importlib.util.spec_from_file_location("bench_sync", REPO / "scripts" / "bench_sync.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_failed_launch_loses_its_round_only(capsys):
    bench = load_bench()

    def crashes(np, args):
        raise SystemExit("failed (-6): torchrun ... terminate called without an active exception")

    assert bench.attempt(crashes, 2, None) is None
    assert "terminate called" in capsys.readouterr().out
    assert bench.attempt(lambda np, args: 6000.0 + np, 2, None) == 6002.0

    def hangs(np, args):
        raise bench.subprocess.TimeoutExpired(["torchrun"], 600)

    assert bench.attempt(hangs, 2, None) is None


def test_cells_and_ratios_say_how_many_rounds_ran():
    bench = load_bench()
    assert bench.rate_cell([6000.0, 7000.0, 6500.0], 3) == "6,500 (6,000-7,000)"
    assert bench.rate_cell([6000.0, 7000.0], 3) == "6,500 (6,000-7,000), 2 of 3 rounds"
    assert bench.rate_cell([], 3) == "failed"
    median = {("hvdtrain", 2): 6000.0, ("DDP", 2): 5000.0, ("hvdtrain", 1): 4000.0}
    assert bench.ratio(median, ("hvdtrain", 2), ("DDP", 2)) == "1.200"
    assert bench.ratio(median, ("hvdtrain", 2), ("hvdtrain", 1), times=2, digits=2) == "0.75"
    assert bench.ratio(median, ("hvdtrain", 1), ("DDP", 1)) == "-"


def test_the_goal_section_runs_both_collectives_and_ddp():
    """hvdtrain over Horovod and over torch.distributed (--collective torch) beside DDP, in one
    run (issue 42); the ratios divide the first."""
    bench = load_bench()
    contenders = bench.goal_contenders()
    assert list(contenders)[0] == "hvdtrain"
    assert {"hvdtrain --collective torch", "DDP over Gloo"} <= set(contenders)
    seen = []
    bench.measure_hvdtrain = lambda np, args, extra=(), drop_last=False: seen.append(extra) or 1.0
    assert contenders["hvdtrain --collective torch"](2, None) == 1.0
    assert seen == [("--collective", "torch")]
