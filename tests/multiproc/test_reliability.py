"""Failures a long job meets: a stalled collective, a stuck or killed async worker, a full disk.
Each must end in a clear error within a bounded time and lose no finished work."""

import os
import resource
import shutil
import signal
import subprocess
import time

import pytest
import torch

from hvdtrain import checkpoint
from hvdtrain.run_output import read_jsonl
from hvdtrain.run_lock import LOCK_NAME
from launch import (BIN, REPO, hvdtrain, launcher_env, mpirun, pid_of_rank, run,
                    wait_for_checkpoint)

pytestmark = pytest.mark.multiproc
QUIET = ["--no-progress", "--seed", "1"]


def test_a_diverged_collective_ends_in_an_error_not_a_hang():
    # Rank 1 reduces a tensor rank 0 never submits; Horovod's stall check (--stall-timeout-s,
    # set by hvdtrain's runtime) shuts the job down.
    t0 = time.monotonic()
    proc = run(mpirun(2, str(BIN / "python"), str(REPO / "tests" / "helpers" / "diverge.py"), "6"),
               check=False, timeout=120)
    assert proc.returncode != 0
    assert time.monotonic() - t0 < 90
    assert "Horovod has been shut down" in proc.stdout + proc.stderr
    assert "the diverged allreduce returned" not in proc.stdout


def test_a_stuck_async_worker_ends_the_job_with_an_error(tmp_path):
    # Lock-step (--staleness 0) and a worker that stalls for a minute after its first step: the
    # other worker's reply is held back, and nothing reaches the server for --timeout-s.
    t0 = time.monotonic()
    proc = run(mpirun(3, *hvdtrain("train", *QUIET, "--mode", "async", "--staleness", "0",
                                   "--straggler", "60000ms", "--timeout-s", "5", "--epochs", "1",
                                   "--run-dir", str(tmp_path))), check=False, timeout=120)
    assert proc.returncode != 0
    assert time.monotonic() - t0 < 50
    assert "a process has stopped or hangs" in proc.stderr
    assert "Traceback" not in proc.stderr  # an expected failure: a message, not a stack


def test_a_killed_async_worker_ends_the_job_and_resume_finishes(tmp_path):
    run_dir = tmp_path / "run"
    flags = [*QUIET, "--mode", "async", "--epochs", "6", "--checkpoint-steps", "5",
             "--run-dir", str(run_dir)]
    slow = ["--straggler", "20ms"]  # slow enough that the kill lands mid-training
    job = subprocess.Popen(mpirun(3, *hvdtrain("train", *flags, *slow)), env=launcher_env(),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           stdin=subprocess.DEVNULL)
    try:
        wait_for_checkpoint(run_dir, job)
        # worker 1 (rank 0 is worker 0, rank 2 the server)
        pid = pid_of_rank(run_dir, "OMPI_COMM_WORLD_RANK", 1)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        out, err = job.communicate(timeout=60)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode != 0
    assert time.monotonic() - killed < 30  # mpirun ends the whole job promptly
    assert "exited on signal 9" in out + err  # and says which rank died, and how
    state = checkpoint.load(run_dir)  # the last checkpoint is intact
    assert state["global_step"] > 0 and state["epoch"] < 6
    # The same command again (a scheduler's plain restart) must not start over on top of it...
    proc = run(mpirun(3, *hvdtrain("train", *flags)), check=False)
    assert proc.returncode == 2 and "already holds a checkpoint" in proc.stderr
    assert checkpoint.load(run_dir)["global_step"] == state["global_step"]
    # ...and with --auto-resume, the restart command of the Kubernetes and Slurm files, it
    # finishes the run.
    run(mpirun(3, *hvdtrain("train", *flags, "--auto-resume")))
    records = read_jsonl(run_dir / "metrics.jsonl")
    header = [r for r in records if r["type"] == "header"][-1]
    assert (header["resumed_from_epoch"], header["resumed_from_step"]) == (state["epoch"],
                                                                           state["step"])
    assert [r["epoch"] for r in records if r["type"] == "epoch"][-1] == 6


def test_a_crash_mid_epoch_resumes_from_the_last_step_checkpoint(tmp_path):
    # --checkpoint-steps: the whole job is killed inside an epoch; --auto-resume continues from
    # the last step checkpoint and ends with exactly the weights of an uninterrupted run.
    flags = [*QUIET, "--epochs", "4", "--checkpoint-steps", "4", "--straggler", "40ms"]
    straight, crashed = tmp_path / "straight", tmp_path / "crashed"
    run(mpirun(2, *hvdtrain("train", *flags, "--run-dir", str(straight))))
    job = subprocess.Popen(mpirun(2, *hvdtrain("train", *flags, "--run-dir", str(crashed))),
                           env=launcher_env(), stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           start_new_session=True)
    try:
        # a checkpoint inside the second epoch or later
        wait_for_checkpoint(crashed, job, poll=0.02,
                            accept=lambda state: state["epoch"] >= 1 and state["step"] > 0)
        # Both ranks at once, as a lost node would (mpirun puts them in process groups of
        # their own), then mpirun.
        for rank in (0, 1):
            pid = pid_of_rank(crashed, "OMPI_COMM_WORLD_RANK", rank)
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
        os.killpg(job.pid, signal.SIGKILL)
        job.wait(timeout=30)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    kept = checkpoint.load(crashed)
    assert kept["step"] > 0 and kept["epoch"] < 4
    run(mpirun(2, *hvdtrain("train", *flags, "--run-dir", str(crashed), "--auto-resume")))
    header = [r for r in read_jsonl(crashed / "metrics.jsonl") if r["type"] == "header"][-1]
    assert (header["resumed_from_epoch"], header["resumed_from_step"]) == (kept["epoch"],
                                                                           kept["step"])
    a = checkpoint.load(straight)["model"]
    b = checkpoint.load(crashed)["model"]
    for name in a:
        assert torch.equal(a[name], b[name]), f"{name} differs after a mid-epoch resume"


def _limit_file_size():
    # A file-size limit makes the checkpoint write fail (EFBIG) the way a full disk does
    # (ENOSPC): an OSError in the middle of writing the temporary file.
    # 16 MB: room for the files MPI's start-up writes, not for the 35 MB checkpoint below.
    resource.setrlimit(resource.RLIMIT_FSIZE, (16_000_000, 16_000_000))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


BIG = [*QUIET, "--hidden", "2048,2048", "--max-steps-per-epoch", "3"]  # 4.3M parameters


@pytest.fixture(scope="module")
def big_epoch(tmp_path_factory):
    """One epoch of BIG, written synchronously: the checkpoint that both full-disk runs and the
    NaN-loss run resume (a copy each), one launch for the three."""
    folder = tmp_path_factory.mktemp("big") / "run"
    run(hvdtrain("train", *BIG, "--epochs", "1", "--run-dir", str(folder)))
    return folder


@pytest.mark.parametrize("writes", [[], ["--async-checkpoint"]])
def test_a_full_disk_keeps_the_previous_checkpoint(tmp_path, big_epoch, writes):
    # --async-checkpoint: the background write's error ends the run as a synchronous one does
    big = [*BIG, *writes]
    shutil.copytree(big_epoch, tmp_path, dirs_exist_ok=True)
    before = (tmp_path / checkpoint.CHECKPOINT_NAME).read_bytes()
    assert len(before) > 30_000_000
    proc = subprocess.run(hvdtrain("train", *big, "--epochs", "2", "--resume", str(tmp_path)),
                          env=launcher_env(), capture_output=True, text=True, timeout=240,
                          preexec_fn=_limit_file_size, stdin=subprocess.DEVNULL)
    assert proc.returncode == 1, proc.stderr
    assert "could not write the epoch 2 checkpoint" in proc.stderr
    assert "previous checkpoint" in proc.stderr and "is intact" in proc.stderr
    assert (tmp_path / checkpoint.CHECKPOINT_NAME).read_bytes() == before
    assert checkpoint.load(tmp_path)["epoch"] == 1
    # no temporary file left; the folder's (released) lock stays
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == [LOCK_NAME]


def test_more_stages_than_layers_exits_2_with_the_arithmetic():
    proc = run(hvdtrain("train", "--stages", "9", "--devices", "cpu"), check=False)
    assert proc.returncode == 2
    assert "--stages 9: the model has 6 layers" in proc.stderr


def test_a_nan_loss_stops_with_the_step_and_keeps_the_last_good_checkpoint(tmp_path, big_epoch):
    shutil.copytree(big_epoch, tmp_path, dirs_exist_ok=True)
    before = (tmp_path / checkpoint.CHECKPOINT_NAME).read_bytes()
    # The learning rate is not part of a checkpoint's identity: resume with one that diverges.
    proc = run(mpirun(2, *hvdtrain("train", *BIG, "--epochs", "3", "--lr", "1e12",
                                   "--resume", str(tmp_path))), check=False)
    assert proc.returncode != 0
    assert "loss became" in proc.stderr and "at epoch 2, step" in proc.stderr
    assert "The last checkpoint is kept unchanged" in proc.stderr
    assert (tmp_path / checkpoint.CHECKPOINT_NAME).read_bytes() == before
