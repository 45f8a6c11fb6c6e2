"""Long jobs on shared clusters (issue 14): preemption by a signal, a stuck rank, two jobs that
are pointed at one folder. Each case loses no run and ends within a bounded time."""

import os
import signal
import subprocess
import time

import pytest
import torch

from hvdtrain import checkpoint
from hvdtrain.run_output import read_jsonl
from launch import horovodrun, hvdtrain, launcher_env, mpirun, pid_of_rank, run

pytestmark = pytest.mark.multiproc
QUIET = ["--no-progress", "--seed", "1"]
PREEMPTED = 75
# Open MPI 4's mpirun passes a SIGTERM on to the ranks this many seconds after it got it, and
# kills them as long again later (1 s by default: too short for a checkpoint). The deploy files
# set it; so must a test that wants the checkpoint.
GRACE = {"OMPI_MCA_odls_base_sigkill_timeout": "5"}


def _steps_logged(run_dir) -> int:
    return sum(1 for r in _records(run_dir) if r["type"] == "step")


def _signal_mid_epoch(command, run_dir, sig, after_steps=0, after_seconds=0.0,
                      deliver_to="mpirun"):
    """Start ``command``; once ``after_steps`` step lines are logged (or, with 0, ``after_seconds``
    after the log's header), send ``sig`` to mpirun (or to the given ranks); return the finished
    process."""
    job = subprocess.Popen(command, env={**launcher_env(), **GRACE}, stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while (_steps_logged(run_dir) < after_steps if after_steps else
               not _records(run_dir)):
            assert job.poll() is None, f"the job ended before the signal: {job.communicate()}"
            assert time.monotonic() < deadline, "no log lines after 120 s"
            time.sleep(0.05)
        time.sleep(after_seconds)
        if deliver_to == "mpirun":
            job.send_signal(sig)
        else:
            for rank in deliver_to:
                os.kill(pid_of_rank(run_dir, "OMPI_COMM_WORLD_RANK", rank), sig)
        out, err = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    return job.returncode, out, err


@pytest.mark.parametrize("mode,np,extra,requeue", [
    # The resumed sync job is preempted once more, by SIGUSR1 (the SIGUSR1 test's sync case):
    # one interrupted job serves both signals, and the weights after two stops still match.
    ("sync", 2, [], True),
    # Lock-step rounds: the data order and the updates are the same in every run, so the
    # preempted and resumed run can end with exactly an uninterrupted run's weights.
    ("async", 3, ["--bsp"], False),
])
def test_sigterm_to_mpirun_checkpoints_the_step_and_auto_resume_ends_with_the_same_weights(
        tmp_path, mode, np, extra, requeue):
    # About 2 s per epoch, so that the signal, which reaches the ranks 5 s after mpirun got it,
    # lands mid-training (near half way). With `requeue`, SIGUSR1 reaches the resumed job's
    # ranks at once, 20 steps after it resumed, still 2 epochs or more before its end.
    flags = [*QUIET, "--mode", mode, *extra, "--epochs", "6", "--batch-size", "16"]
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    # The uninterrupted run needs no straggler: a sleep after each step changes no update
    # (sync, and lock-step rounds), only the time the preempted run takes.
    run(mpirun(np, *hvdtrain("train", *flags, "--run-dir", str(straight))))
    command = mpirun(np, *hvdtrain("train", *flags, "--log-steps", "--straggler", "40ms",
                                   "--run-dir", str(stopped), "--auto-resume"))
    code, out, err = _signal_mid_epoch(command, stopped, signal.SIGTERM, after_steps=30)
    # mpirun itself answers a SIGTERM with 1; the ranks' own code is 75 (SIGUSR1 test below)
    assert code != 0, out
    assert "SIGTERM received" in err, err
    assert "stopped by SIGTERM after epoch" in out, out + err
    kept = checkpoint.load(stopped)
    assert 0 < kept["step"] and kept["epoch"] < 6, (kept["epoch"], kept["step"])
    stop = [r for r in read_jsonl(stopped / "metrics.jsonl") if r["type"] == "stop"]
    assert stop and stop[-1]["global_step"] == kept["global_step"]
    if requeue:
        code, out, err = _signal_mid_epoch(command, stopped, signal.SIGUSR1,
                                           after_steps=_steps_logged(stopped) + 20)
        _assert_stopped_for_requeue(stopped, code, out, err, mode, epochs=6)
        assert checkpoint.load(stopped)["global_step"] > kept["global_step"]
    run(command)  # the requeued job: same command
    assert checkpoint.load(stopped)["epoch"] == 6
    a, b = checkpoint.load(straight)["model"], checkpoint.load(stopped)["model"]
    for name in a:
        assert torch.equal(a[name], b[name]), f"{name} differs after preemption and resume"


# sync: test_sigterm_..._same_weights[sync...]'s job gets a SIGUSR1 once resumed, with these
# same checks.
@pytest.mark.parametrize("mode,np,extra", [
    # Each worker stops after its own step. Unbounded, the job's batches go to whoever asks
    # (ps/dispatch.py), so one slow worker would leave the fast one to finish in a second:
    # every worker is slowed instead.
    ("async", 3, ["--straggler", "exp:30ms"]),
    # a worker held back for a stopped one is let go
    ("async", 3, ["--staleness", "0", "--straggler", "30ms"]),
])
def test_sigusr1_exits_75_for_a_requeue_and_the_resumed_run_finishes(tmp_path, mode, np, extra):
    # Slurm's --signal=USR1@T; mpirun forwards SIGUSR1 at once and then reports the ranks' exit
    # code, which the sbatch script turns into a requeue. About 5 s of training: 4 epochs x 45
    # steps x 30 ms.
    run_dir = tmp_path / "run"
    command = mpirun(np, *hvdtrain("train", *QUIET, "--mode", mode, *extra, "--epochs", "4",
                                   "--batch-size", "16",
                                   "--run-dir", str(run_dir), "--auto-resume"))
    code, out, err = _signal_mid_epoch(command, run_dir, signal.SIGUSR1, after_seconds=2.5)
    _assert_stopped_for_requeue(run_dir, code, out, err, mode, epochs=4)
    run(command)
    assert checkpoint.load(run_dir)["epoch"] == 4


def _assert_stopped_for_requeue(run_dir, code, out, err, mode, epochs):
    """A job stopped by SIGUSR1 exits 75 (the sbatch script's requeue) without a traceback,
    and its last checkpoint is the step its stop line names."""
    assert code == PREEMPTED, out + err
    assert "Traceback" not in err
    assert "stopped by" in out, out
    kept = checkpoint.load(run_dir)
    if mode == "sync":
        assert kept["step"] > 0 and kept["epoch"] < epochs
    stop = [r for r in read_jsonl(run_dir / "metrics.jsonl") if r["type"] == "stop"]
    assert stop and stop[-1]["global_step"] == kept["global_step"]


@pytest.mark.parametrize("launcher", ["mpirun", "horovodrun"])
def test_a_stopped_rank_ends_a_sync_job_within_the_stall_timeout(tmp_path, launcher):
    # kill -STOP of rank 1: rank 0 waits in an allreduce that will never complete. Before the
    # watchdog, it waited for ever under mpirun (Horovod's stall check blocks in MPI itself).
    run_dir = tmp_path / "run"
    train = hvdtrain("train", *QUIET, "--epochs", "200", "--batch-size", "8",
                     "--stall-timeout-s", "10", "--run-dir", str(run_dir))
    command = mpirun(2, *train) if launcher == "mpirun" else horovodrun(2, *train)
    rank_variable = "OMPI_COMM_WORLD_RANK" if launcher == "mpirun" else "HOROVOD_RANK"
    job = subprocess.Popen(command, env=launcher_env(), stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while _steps_logged(run_dir) == 0 and not any(
                r["type"] == "epoch" for r in _records(run_dir)):
            assert job.poll() is None, job.communicate()
            assert time.monotonic() < deadline, "training never started"
            time.sleep(0.2)
        pid = pid_of_rank(run_dir, rank_variable, 1)
        assert pid is not None
        stopped_at = time.monotonic()
        os.kill(pid, signal.SIGSTOP)
        out, err = job.communicate(timeout=60)  # a hang fails here
        took = time.monotonic() - stopped_at
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
        try:
            os.kill(pid, signal.SIGKILL)
        except (OSError, UnboundLocalError, TypeError):
            pass
    assert job.returncode != 0
    assert took < 30, f"the job ended {took:.0f} s after rank 1 stopped"
    text = out + err
    assert "(--stall-timeout-s 10)" in text, text
    assert f"rank 1 (PID {pid} on host" in text, text


def _records(run_dir):
    try:
        return read_jsonl(run_dir / "metrics.jsonl")
    except (OSError, ValueError):
        return []
