"""Tiers 2 and 3 for --precision and --clip-grad-norm: real mpirun jobs, each with a timeout (the
in-process checks are in tests/unit/test_precision.py; the clipped sync parity test is in
test_sync_multiproc.py)."""

import math
import sys

import pytest
import torch

from launch import REPO, final_model, hvdtrain, mpirun, records, run

pytestmark = pytest.mark.multiproc
DUMP = str(REPO / "tests" / "helpers" / "train_and_dump.py")
OVERFLOW_LOSS = str(REPO / "tests" / "helpers" / "user" / "overflow_loss.py")
QUIET = ["--no-progress", "--seed", "1"]
# Epochs with margin over 95% (the test split has 360 samples): with a cosine decay, 12 epochs
# ended at 96.7-97.5% in sync over seeds 0-5 (10 epochs: 96.1-97.2%, 8: down to 95.8%) and at
# 96.1-97.2% in async over six runs (async runs differ: 10 epochs ended once at 95.8%).
BF16 = ["--precision", "bf16", "--epochs", "12", "--lr-schedule", "cosine"]


def assert_ranks_equal(folder, ranks=2):
    first = torch.load(folder / "rank0.pt", weights_only=True)
    for r in range(1, ranks):
        other = torch.load(folder / f"rank{r}.pt", weights_only=True)
        for name, tensor in first.items():
            assert torch.equal(tensor, other[name]), f"{name} differs between rank 0 and {r}"


def test_bf16_sync_reaches_95_percent_with_identical_ranks(tmp_path):
    run(mpirun(2, sys.executable, DUMP, str(tmp_path), *BF16, *QUIET,
               "--run-dir", str(tmp_path / "run")))
    assert_ranks_equal(tmp_path)
    assert records(tmp_path / "run", "header")[0]["config"]["run"]["precision"] == "bf16"
    epochs = records(tmp_path / "run", "epoch")
    assert len(epochs) == 12 and epochs[-1]["test_acc"] >= 0.95, epochs[-1]
    assert "loss_scale" not in epochs[-1]  # bf16 needs no loss scale


def test_bf16_async_reaches_95_percent(tmp_path):
    run(mpirun(3, *hvdtrain("train", "--mode", "async", *BF16, *QUIET,
                            "--run-dir", str(tmp_path))))
    assert records(tmp_path, "header")[0]["config"]["run"]["precision"] == "bf16"
    assert records(tmp_path, "epoch")[-1]["test_acc"] >= 0.95, records(tmp_path, "epoch")[-1]


def test_an_fp16_overflow_on_one_rank_skips_the_step_on_every_rank(tmp_path):
    # Rank 1's 6th step has a NaN gradient (the loss value stays finite). Every rank unscales
    # the allreduced average, which the NaN reaches, so every rank skips that step alike.
    proc = run(mpirun(2, sys.executable, DUMP, str(tmp_path), *QUIET, "--epochs", "2",
                      "--precision", "fp16", "--loss", f"{OVERFLOW_LOSS}:loss",
                      "--run-dir", str(tmp_path / "run")),
               env={"OVERFLOW_RANK": "1", "OVERFLOW_CALL": "6"})
    assert proc.stdout.count("fp16 on CPUs runs") == 1  # the CPU note, from rank 0 only
    assert_ranks_equal(tmp_path)
    epochs = records(tmp_path / "run", "epoch")
    assert len(epochs) == 2, epochs
    first, second = epochs
    assert first["skipped_steps"] == 1 and second["skipped_steps"] == 0, epochs
    # GradScaler starts at 2**16, halves at a skipped step and grows only after 2000 good ones.
    assert first["loss_scale"] == second["loss_scale"] == 2.0 ** 15, epochs
    # Training went on (a user's loss comes without the accuracy metric).
    assert math.isfinite(second["train_loss"]) and second["train_loss"] < first["train_loss"]
    assert second["test_loss"] < 0.6, second
    saved = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)
    assert saved["grad_scaler"]["scale"] == 2.0 ** 15  # a resume goes on with the backed-off scale


def test_async_bsp_pushes_clipped_gradients(tmp_path):
    # Not compared with sync: BSP averages the workers' clipped gradients, and sync clips the
    # average. But each server update is lr times a mean of gradients of norm <= c, so after S
    # rounds of momentum-free SGD the weights have moved by at most S * lr * c. Unclipped, the
    # same run moves about 0.45, twice the bound.
    lr, c = 0.05, 0.1
    flags = ["--mode", "async", "--bsp", *QUIET, "--epochs", "2", "--optimizer", "sgd",
             "--momentum", "0", "--lr", str(lr), "--lr-scaling", "none", "--warmup-epochs", "0",
             "--clip-grad-norm", str(c)]
    run(mpirun(3, *hvdtrain("train", *flags, "--run-dir", str(tmp_path))))
    epochs = records(tmp_path, "epoch")
    assert epochs[-1]["train_loss"] < epochs[0]["train_loss"], epochs
    assert all(e["clipped_fraction"] > 0.5 and e["grad_norm_mean"] > c for e in epochs), epochs
    start = initial_model(flags)
    moved = math.sqrt(sum(float((final_model(tmp_path)[k] - v).pow(2).sum())
                          for k, v in start.items()))
    rounds = epochs[-1]["step"]
    assert 0 < moved <= rounds * lr * c + 1e-5, (moved, rounds * lr * c)


def initial_model(flags):
    """The weights every process starts from (launch.run draws them from --seed)."""
    from hvdtrain.cli import build_parser, config_from_args
    from hvdtrain.workload import workload_from_config

    cfg = config_from_args(build_parser().parse_args(["train", *flags]))
    workload = workload_from_config(cfg)
    torch.manual_seed(cfg.run.seed)
    return workload.build_model().state_dict()


def test_the_issues_command_runs_async_bf16_with_clipping(tmp_path):
    # --batch-size 16: twice the steps of the default 32, so that worker 0 trains in most epochs.
    # With 22 steps an epoch, a clean-clone run saw worker 1 take every batch of epochs 2-6
    # while worker 0 evaluated, which left one epoch with clipping figures. 8 epochs, not 6: a
    # clean-clone run (stop 59) ended 6 epochs at 0.886 where six runs here ended at 0.93-0.96.
    proc = run(mpirun(3, *hvdtrain("train", "--mode", "async", "--precision", "bf16",
                                   "--clip-grad-norm", "1", "--epochs", "8", "--batch-size", "16",
                                   "--no-progress", "--run-dir", str(tmp_path))))
    assert "done: test accuracy" in proc.stdout
    epochs = records(tmp_path, "epoch")
    assert len(epochs) == 8 and epochs[-1]["test_acc"] >= 0.9, epochs[-1]
    # Late in training a whole epoch of worker 0's gradients can stay under the norm (CI saw
    # it once), so only what must hold: a fraction, some clipping, and an epoch whose mean norm
    # is above the limit clipped at least one step. The figures are worker 0's own: an epoch in
    # which it trained no step (a loaded machine; it also evaluates) has none.
    clipping = [e for e in epochs if "clipped_fraction" in e]
    assert len(clipping) >= 3, epochs
    assert all(0 <= e["clipped_fraction"] <= 1 for e in clipping), epochs
    assert any(e["clipped_fraction"] > 0 for e in clipping), epochs
    assert all(e["clipped_fraction"] > 0 for e in clipping if e["grad_norm_mean"] > 1), epochs


# --- GPUs -------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_fp16_sync_on_gpus(tmp_path):
    ranks = min(2, torch.cuda.device_count())
    run(mpirun(ranks, sys.executable, DUMP, str(tmp_path), *QUIET, "--device", "cuda",
               "--precision", "fp16", "--epochs", "10", "--lr-schedule", "cosine",
               "--run-dir", str(tmp_path / "run")))
    assert_ranks_equal(tmp_path, ranks)
    epochs = records(tmp_path / "run", "epoch")
    assert epochs[-1]["test_acc"] >= 0.95, epochs[-1]
    assert epochs[-1]["loss_scale"] > 0, epochs[-1]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_fp16_async_on_gpus(tmp_path):
    run(mpirun(3, *hvdtrain("train", "--mode", "async", "--device", "cuda", "--precision",
                            "fp16", *QUIET, "--epochs", "10", "--lr-schedule", "cosine",
                            "--run-dir", str(tmp_path))))
    epochs = records(tmp_path, "epoch")
    assert epochs[-1]["test_acc"] >= 0.95, epochs[-1]
    assert epochs[-1]["loss_scale"] > 0, epochs[-1]
