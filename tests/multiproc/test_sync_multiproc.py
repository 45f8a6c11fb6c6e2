"""Tiers 2 and 3: real mpirun / horovodrun jobs of sync training, each with a timeout."""

import os
import shutil
import sys

import pytest
import torch

from hvdtrain import checkpoint
from hvdtrain.core_binding import share_of_cores
from hvdtrain.run_output import read_jsonl
from launch import (BIN, HELPER, SYNC_REFERENCE, final_model, horovodrun, hvdtrain, mpirun,
                    records, run)

pytestmark = pytest.mark.multiproc
QUICK = SYNC_REFERENCE  # so that conftest's sync_reference is the mpirun case below
LAUNCHERS = {"mpirun": mpirun, "horovodrun": horovodrun,
             "horovodrun --mpi": lambda np, *cmd: [str(BIN / "horovodrun"), "-np", str(np),
                                                  "--mpi", *cmd]}


def launch(launcher: str, np: int, *command: str) -> list[str]:
    return LAUNCHERS[launcher](np, *command)


@pytest.mark.parametrize("launcher, extra", [
    ("mpirun", []),
    ("horovodrun", []),
    ("horovodrun --mpi", ["--model", "cnn"]),
    ("horovodrun", ["--compression", "fp16", "--backward-passes-per-step", "2",
                    "--optimizer", "adam", "--lr", "0.002"]),
    ("mpirun", ["--reduce-op", "adasum", "--optimizer", "adamw", "--lr", "0.002",
                "--weight-decay", "0.01"]),
])
def test_every_rank_ends_with_identical_parameters(tmp_path, request, launcher, extra):
    if launcher == "mpirun" and not extra:  # the very run of conftest's sync_reference
        folder = request.getfixturevalue("sync_reference")
    else:
        folder = tmp_path
        run(launch(launcher, 2, sys.executable, HELPER, str(folder), *QUICK,
                   "--run-dir", str(folder / "run"), *extra))
    rank0 = torch.load(folder / "rank0.pt", weights_only=True)
    rank1 = torch.load(folder / "rank1.pt", weights_only=True)
    for name, tensor in rank0.items():
        assert torch.equal(tensor, rank1[name]), f"{name} differs between ranks"
    log = read_jsonl(folder / "run" / "metrics.jsonl")
    epochs = [r for r in log if r["type"] == "epoch"]
    assert len(epochs) == 2 and epochs[-1]["train_loss"] < epochs[0]["train_loss"]
    assert log[0]["world_size"] == 2 and log[0]["versions"]["horovod"] == "0.28.1"


def step_losses(run_dir) -> list[float]:
    return [r["loss"] for r in read_jsonl(run_dir / "metrics.jsonl") if r["type"] == "step"]


PARITY = ["--epochs", "2", "--no-progress", "--log-steps", "--optimizer", "sgd",
          "--momentum", "0.9", "--lr", "0.05", "--lr-scaling", "none", "--warmup-epochs", "0"]


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory):
    """The single-process run that the 2-rank runs below must match, step for step."""
    one = tmp_path_factory.mktemp("one")
    run(hvdtrain("train", *PARITY, "--batch-size", "32", "--run-dir", str(one)))
    return step_losses(one)


@pytest.mark.parametrize("launcher", ["mpirun", "horovodrun"])
def test_two_ranks_match_one_rank_with_the_same_global_batch(tmp_path, launcher, one_rank):
    two = tmp_path / "two"
    run(launch(launcher, 2, *hvdtrain("train", *PARITY, "--batch-size", "16",
                                      "--run-dir", str(two))))
    double = step_losses(two)
    assert len(one_rank) == len(double) > 50
    worst = max(abs(a - b) for a, b in zip(one_rank, double))
    assert worst < 1e-5, f"per-step losses differ by up to {worst}"


def test_accumulation_and_clipping_on_two_ranks_match_one_rank(tmp_path, one_rank):
    """What the launcher does not change, under one launcher (mpirun)."""
    # Gradient accumulation: 2 backward passes of 8 samples per step make the same update.
    accum = tmp_path / "accum"
    run(mpirun(2, *hvdtrain("train", *PARITY, "--batch-size", "16",
                            "--backward-passes-per-step", "2", "--run-dir", str(accum))))
    accumulated = step_losses(accum)
    assert len(accumulated) == len(one_rank)
    worst = max(abs(a - b) for a, b in zip(one_rank, accumulated))
    assert worst < 1e-5, f"accumulated per-step losses differ by up to {worst}"
    # --clip-grad-norm clips the averaged gradient, which 2 ranks hold as 1 rank does.
    clipped = [*PARITY, "--clip-grad-norm", "0.3"]
    one_clip, two_clip = tmp_path / "one_clip", tmp_path / "two_clip"
    run(hvdtrain("train", *clipped, "--batch-size", "32", "--run-dir", str(one_clip)))
    run(mpirun(2, *hvdtrain("train", *clipped, "--batch-size", "16",
                            "--run-dir", str(two_clip))))
    for folder in (one_clip, two_clip):
        epochs = records(folder, "epoch")
        assert all(e["clipped_fraction"] > 0.5 for e in epochs), epochs  # clipping mostly on
    a, b = final_model(one_clip), final_model(two_clip)
    for name in a:
        worst = (a[name] - b[name]).abs().max().item()
        assert worst < 1e-5, f"{name} differs by {worst} with clipping"


def test_digits_reaches_95_percent_under_horovodrun(tmp_path):
    proc = run(horovodrun(2, *hvdtrain("train", "--dataset", "digits", "--epochs", "20",
                                       "--run-dir", str(tmp_path))))
    epochs = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if r["type"] == "epoch"]
    assert epochs[-1]["test_acc"] >= 0.95, epochs[-1]
    assert "done: test accuracy" in proc.stdout
    assert "ms/step - loss:" in proc.stderr  # the progress bar ran on rank 0
    # horovodrun binds nothing, so each rank takes its share of the physical cores
    # (core_binding.py), unless this test itself runs on fewer cores than the machine has.
    cpus = sorted(os.sched_getaffinity(0))
    share = share_of_cores(0, 2, cpus) if len(cpus) == os.cpu_count() else []
    header = records(tmp_path, "header")[0]
    assert header["cores"] == (share or cpus), header["cores"]
    if share:
        assert header["threads"] == len(share)
    # On CPUs hvdtrain's Horovod build starts each allreduce as it is enqueued, and the cycle
    # then only paces the idle loop (runtime.horovod_environment)
    assert header["horovod_wakes"] is True and header["horovod_cycle_ms"] == 10, header
    assert header["keeps_freed_memory"] is True  # freed_memory.py


def test_resumed_run_ends_with_the_same_weights(tmp_path, sync_reference):
    # The run stopped after 2 epochs is a copy of conftest's sync_reference (QUICK, a checkpoint
    # every epoch by default); resumed to 4 it must end where 4 epochs in one go end.
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    shutil.copytree(sync_reference / "run", stopped)
    run(mpirun(2, *hvdtrain("train", *QUICK, "--epochs", "4", "--run-dir", str(straight))))
    assert torch.load(stopped / "checkpoint.pt", weights_only=True)["epoch"] == 2
    run(mpirun(2, *hvdtrain("train", *QUICK, "--epochs", "4", "--resume", str(stopped))))
    a, b = final_model(straight), final_model(stopped)
    for name in a:
        assert torch.equal(a[name], b[name]), f"{name} differs after resume"
    log = read_jsonl(stopped / "metrics.jsonl")
    assert [r["epoch"] for r in log if r["type"] == "epoch"] == [1, 2, 3, 4]


@pytest.fixture(scope="module")
def one_epoch(tmp_path_factory):
    """One epoch of a single process without a launcher (QUICK, --epochs 1): (its run folder,
    the finished process). The tests below that start from such a checkpoint take a copy of the
    folder instead of training it again, a process launch each."""
    folder = tmp_path_factory.mktemp("one-epoch") / "run"
    return folder, run(hvdtrain("train", *QUICK, "--epochs", "1", "--run-dir", str(folder)))


def copy_of(one_epoch, folder):
    """A copy of the one_epoch fixture's run folder at ``folder`` (which may exist, empty)."""
    shutil.copytree(one_epoch[0], folder, dirs_exist_ok=True)
    return folder


def test_bad_checkpoint_stops_every_rank_with_a_message(tmp_path, one_epoch):
    good = copy_of(one_epoch, tmp_path / "good")
    ckpt = good / "checkpoint.pt"
    ckpt.write_bytes(ckpt.read_bytes()[:1000])
    proc = run(mpirun(2, *hvdtrain("train", *QUICK, "--resume", str(good))), check=False)
    assert proc.returncode != 0
    assert "not a readable checkpoint" in proc.stderr
    # A readable checkpoint of another model: the one_epoch fixture's mlp, resumed as a cnn.
    mlp = copy_of(one_epoch, tmp_path / "mlp")
    proc = run(hvdtrain("train", *QUICK, "--model", "cnn", "--resume", str(mlp)), check=False)
    assert proc.returncode == 2 and "model: checkpoint has 'mlp', this run has 'cnn'" in proc.stderr


def test_a_rerun_into_a_run_folder_keeps_its_checkpoint(tmp_path, one_epoch):
    flags = [*QUICK, "--epochs", "1", "--run-dir", str(tmp_path)]
    copy_of(one_epoch, tmp_path)  # what `hvdtrain train *flags` left
    before = (tmp_path / "checkpoint.pt").read_bytes()
    proc = run(mpirun(2, *hvdtrain("train", *flags)), check=False)
    assert proc.returncode == 2
    assert proc.stderr.count("already holds a checkpoint") == 1  # once, by rank 0
    assert f"--resume {tmp_path}" in proc.stderr
    assert (tmp_path / "checkpoint.pt").read_bytes() == before
    # --auto-resume (what a restarted job passes) continues it instead.
    proc = run(mpirun(2, *hvdtrain("train", *QUICK, "--epochs", "2", "--run-dir", str(tmp_path),
                                   "--auto-resume")))
    assert "continuing the checkpoint" in proc.stdout
    log = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["resumed_from_epoch"] for r in log if r["type"] == "header"] == [0, 1]
    assert [r["epoch"] for r in log if r["type"] == "epoch"] == [1, 2]


@pytest.mark.parametrize("np, step, left", [
    (2, 20, 12),  # 20 one-worker steps = 10 two-worker steps: 12 of 22 are left
    (3, 43, 0),   # 43 one-worker steps = 14.3 three-worker steps: none of 14 is left
])
def test_a_step_checkpoint_resumes_with_another_number_of_workers(tmp_path, one_epoch, np, step,
                                                                  left):
    # A checkpoint inside epoch 2 written by 1 worker (44 steps per epoch on digits at batch 32)
    # continues at the step of the new global batch that has seen the same share of the epoch.
    copy_of(one_epoch, tmp_path)
    state = checkpoint.load(tmp_path)
    assert state["num_workers"] == 1 and state["global_step"] == 44
    checkpoint.save_atomic({**state, "epoch": 1, "step": step, "global_step": 44 + step},
                           tmp_path / checkpoint.CHECKPOINT_NAME)
    proc = run(mpirun(np, *hvdtrain("train", *QUICK, "--epochs", "3", "--resume", str(tmp_path))))
    assert (f"checkpoint was written with a global batch of 32 samples, this run's is 32 x {np} "
            "workers; the data order differs") in proc.stdout
    epochs = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if r["type"] == "epoch"]
    assert [e["epoch"] for e in epochs] == [1, 2, 3]
    assert epochs[1]["step"] - (44 + step) == left
    assert epochs[2]["step"] - epochs[1]["step"] == 1437 // (32 * np)  # epoch 3 is whole
    assert checkpoint.load(tmp_path)["epoch"] == 3


def test_single_process_without_a_launcher(one_epoch):
    run_dir, proc = one_epoch
    header = read_jsonl(run_dir / "metrics.jsonl")[0]
    assert header["world_size"] == 1 and header["launcher"] == "none"
    assert "epoch 1/1" in proc.stdout


def test_bad_input_exits_2_before_training(tmp_path):
    proc = run(mpirun(2, *hvdtrain("train", "--dataset", "mnist", "--data-path",
                                   str(tmp_path / "absent"))), check=False)
    assert proc.returncode == 2
    assert proc.stderr.count("no such folder") == 1  # reported once, by rank 0
