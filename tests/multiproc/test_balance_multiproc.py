"""--balance in real 2-rank mpirun jobs: the same updates as one process on the same global batch
with unequal shares, shares that move away from a straggler, and shares restored on resume."""

import sys

import pytest
import torch

from launch import REPO, final_model, hvdtrain, mpirun, records, run

pytestmark = pytest.mark.multiproc
FIXED = str(REPO / "tests" / "helpers" / "train_fixed_shares.py")
PARITY = ["--epochs", "2", "--no-progress", "--log-steps", "--optimizer", "sgd",
          "--momentum", "0.9", "--lr", "0.05", "--lr-scaling", "none", "--warmup-epochs", "0",
          "--seed", "4"]


def step_losses(run_dir) -> list[float]:
    return [r["loss"] for r in records(run_dir, "step")]


def test_unequal_shares_update_as_one_process_on_the_global_batch(tmp_path):
    one = tmp_path / "one"
    run(hvdtrain("train", *PARITY, "--batch-size", "32", "--run-dir", str(one)))
    single, model = step_losses(one), final_model(one)
    for name, shares, extra in [("plain", "8,24", []),
                                ("accum", "6,26", ["--backward-passes-per-step", "2"])]:
        two = tmp_path / name
        run(mpirun(2, sys.executable, FIXED, shares, *PARITY, "--balance", "--batch-size", "16",
                   "--run-dir", str(two), *extra))
        assert [e["batch_shares"] for e in records(two, "epoch")] == \
            [[int(s) for s in shares.split(",")]] * 2
        balanced = step_losses(two)
        assert len(balanced) == len(single) > 50
        worst = max(abs(a - b) for a, b in zip(single, balanced))
        assert worst < 1e-5, f"{name}: per-step losses differ by up to {worst}"
        other = final_model(two)
        for key in model:
            worst = (model[key] - other[key]).abs().max().item()
            assert worst < 1e-5, f"{name}: {key} differs by {worst}"
