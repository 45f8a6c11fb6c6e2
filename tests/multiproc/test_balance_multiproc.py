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


@pytest.fixture(scope="module")
def straggler_run(tmp_path_factory):
    """A 3x straggler under --balance for 10 epochs, stopped after epoch 2 (when the shares have
    moved) and resumed: one run for the straggler's shares and for the resume's, in two
    launches instead of three. Returns the folder, the shares the stopped run's checkpoint
    saved, and the resumed launch."""
    run_dir = tmp_path_factory.mktemp("straggler")
    flags = ["--straggler", "3x", "--balance", "--no-progress", "--run-dir", str(run_dir)]
    run(mpirun(2, *hvdtrain("train", *flags, "--epochs", "2")))  # shares move after epoch 1
    saved = torch.load(run_dir / "checkpoint.pt", weights_only=True)["batch_shares"]
    assert saved == records(run_dir, "epoch")[-1]["next_batch_shares"] and saved != [32, 32]
    proc = run(mpirun(2, *hvdtrain("train", *flags, "--epochs", "10", "--resume",
                                   str(run_dir))))
    return run_dir, saved, proc


def test_a_straggler_gets_a_smaller_share_and_digits_still_learns(straggler_run):
    run_dir, _, _ = straggler_run
    epochs = records(run_dir, "epoch")
    assert [e["epoch"] for e in epochs] == list(range(1, 11))  # both launches' lines
    shares = [e["batch_shares"] for e in epochs]
    assert shares[0] == [32, 32], shares  # nothing is measured before the first epoch
    assert all(sum(s) == 64 and min(s) >= 8 for s in shares), shares  # the floor: 0.25 x 32
    # Rank 1, the straggler, trains well under half of the global batch once re-planned.
    later = sorted(s[1] for s in shares[2:])
    assert later[len(later) // 2] <= 24, shares
    assert epochs[-1]["test_acc"] >= 0.95, epochs[-1]
    assert all(e["samples"] == 64 * 22 for e in epochs)  # every sample of every global batch


def test_a_resumed_run_continues_with_the_checkpoints_shares(straggler_run):
    run_dir, saved, proc = straggler_run
    assert records(run_dir, "epoch")[2]["batch_shares"] == saved  # the first resumed epoch
    assert "are not used" not in proc.stdout


def test_balance_composes_with_accumulation_and_fp16_compression(tmp_path):
    helper = str(REPO / "tests" / "helpers" / "train_and_dump.py")
    run(mpirun(2, sys.executable, helper, str(tmp_path), "--straggler", "3x", "--balance",
               "--backward-passes-per-step", "2", "--compression", "fp16", "--epochs", "3",
               "--no-progress", "--run-dir", str(tmp_path / "run")))
    shares = [e["next_batch_shares"] for e in records(tmp_path / "run", "epoch")]
    assert all(s % 2 == 0 for row in shares for s in row) and shares[-1][1] < 32, shares
    rank0 = torch.load(tmp_path / "rank0.pt", weights_only=True)
    rank1 = torch.load(tmp_path / "rank1.pt", weights_only=True)
    for name, tensor in rank0.items():
        assert torch.equal(tensor, rank1[name]), f"{name} differs between ranks"
