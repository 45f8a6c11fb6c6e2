"""DiLoCo (--mode sync --local-steps H --outer-lr LR --outer-momentum M): real mpirun jobs, each
with a timeout. tests/unit/test_diloco.py checks the outer step's arithmetic in one process."""

import sys

import pytest
import torch

from launch import REPO, final_model, hvdtrain, mpirun, ranks_agree_with_checkpoint, records, run

pytestmark = pytest.mark.multiproc
HELPER = str(REPO / "tests" / "helpers" / "train_and_dump.py")
WORKERS = 2
DILOCO = ["--local-steps", "8", "--outer-lr", "0.7", "--outer-momentum", "0.9"]


def test_digits_reaches_95_percent_and_the_ranks_agree(tmp_path):
    """The issue's command line, with the default model, optimizer and 20 epochs."""
    run(mpirun(WORKERS, sys.executable, HELPER, str(tmp_path), "--dataset", "digits", *DILOCO,
               "--no-progress", "--run-dir", str(tmp_path / "run")))
    epochs = records(tmp_path / "run", "epoch")
    assert epochs[-1]["test_acc"] >= 0.95, epochs[-1]
    assert all(e["averaging_rounds"] == 3 for e in epochs)  # 22 steps per epoch: 8 + 8 + 6
    [scheme] = records(tmp_path / "run", "scheme")
    assert (scheme["local_steps"], scheme["averaging_rounds"]) == (8, 3 * len(epochs))
    ranks_agree_with_checkpoint(tmp_path, tmp_path / "run")


def test_resume_from_an_epoch_checkpoint_continues_exactly(tmp_path):
    """The outer momentum and the round's start go into the checkpoint: a run stopped after
    epoch 2 and resumed ends with the parameters of a run that never stopped (and wrote no
    checkpoint, and evaluated only at the end, before that)."""
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    flags = ["--no-progress", "--seed", "5", *DILOCO]
    run(mpirun(WORKERS, *hvdtrain("train", *flags, "--epochs", "4", "--checkpoint-every", "0",
                                  "--eval-every", "4", "--run-dir", str(straight))))
    run(mpirun(WORKERS, *hvdtrain("train", *flags, "--epochs", "2", "--run-dir", str(stopped))))
    halfway = torch.load(stopped / "checkpoint.pt", weights_only=True)
    momentum = [s["momentum_buffer"] for s in halfway["outer"]["optimizer"]["state"].values()]
    assert momentum and any(m.abs().max() > 0 for m in momentum)
    run(mpirun(WORKERS, *hvdtrain("train", *flags, "--epochs", "4", "--resume", str(stopped))))
    a, b = final_model(straight), final_model(stopped)
    for name in a:
        assert torch.equal(a[name], b[name]), f"{name} differs after resume"
    assert [e["epoch"] for e in records(stopped, "epoch")] == [1, 2, 3, 4]
