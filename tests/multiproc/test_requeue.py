"""Preemption under a launcher ends with 75 (issue 24): `hvdtrain run mpirun|horovodrun ...` gets
the signals Kubernetes and Slurm send (SIGTERM to the container's first process, or to every
process of the job; SIGKILL after the grace period), the ranks stop after a step with a
checkpoint, and the job's exit code is 75, so the scheduler requeues it. Without the wrapper,
mpirun and horovodrun answer a SIGTERM with 1 (test_long_jobs.py)."""

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from hvdtrain import checkpoint
from hvdtrain.requeue import (RANKS_FILE_ENV, _handles, mpirun_session_folders,
                              process_tree, ranks_ready)
from launch import REPO, horovodrun, hvdtrain, launcher_env, mpirun, records

pytestmark = pytest.mark.multiproc
PREEMPTED = 75
GRACE_S = 60  # terminationGracePeriodSeconds / Slurm's KillWait: then everything is killed
TRAIN = ["train", "--no-progress", "--seed", "1", "--epochs", "300", "--log-steps",
         "--auto-resume"]


@pytest.mark.parametrize("launcher", ["mpirun", "horovodrun"])
@pytest.mark.parametrize("scheduler", ["kubernetes", "slurm"])
def test_sigterm_to_a_launched_job_exits_75_after_the_checkpoint(tmp_path, launcher, scheduler):
    run_dir = tmp_path / "run"
    launch = mpirun if launcher == "mpirun" else horovodrun
    command = hvdtrain("run", *launch(2, *hvdtrain(*TRAIN, "--run-dir", str(run_dir))))
    env = {**launcher_env()}
    env.pop("OMPI_MCA_odls_base_sigkill_timeout", None)  # the wrapper sets it
    job = subprocess.Popen(command, cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while not (run_dir / "metrics.jsonl").exists() or \
                len(records(run_dir, "step")) < 20:
            assert job.poll() is None, f"the job ended before the signal: {job.communicate()}"
            assert time.monotonic() < deadline, "no 20 step lines after 180 s"
            time.sleep(0.2)
        if scheduler == "kubernetes":  # the container's first process alone
            job.send_signal(signal.SIGTERM)
        else:  # Slurm: every process of the job step
            for pid in process_tree(job.pid):
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        signalled = time.monotonic()
        try:
            out, err = job.communicate(timeout=GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(job.pid, signal.SIGKILL)  # the grace period is over
            out, err = job.communicate()
            pytest.fail(f"still running {GRACE_S} s after the SIGTERM:\n{out[-3000:]}\n"
                        f"{err[-3000:]}")
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    assert job.returncode == PREEMPTED, (job.returncode, out[-3000:], err[-3000:])
    assert time.monotonic() - signalled < GRACE_S
    assert "hvdtrain run: the job stopped after its checkpoint; exit 75" in err, err[-3000:]
    if scheduler == "kubernetes":  # mpirun that got a SIGTERM itself drops the ranks' last lines
        assert "stopped by SIGTERM" in out or "stopped by SIGUSR1" in out, out[-3000:]
        assert "Traceback" not in err, err[-3000:]  # nor horovodrun's
    stop = records(run_dir, "stop")
    assert stop and stop[-1]["reason"].startswith("preempted"), stop
    state = checkpoint.load(run_dir)
    assert state["global_step"] == stop[-1]["global_step"] >= 20


def test_without_a_preemption_the_launchers_exit_code_passes_through(tmp_path):
    def code(*command):
        return subprocess.run(hvdtrain("run", *command), env=launcher_env(), timeout=60,
                              capture_output=True, text=True).returncode

    assert code("sh", "-c", "exit 0") == 0
    assert code("sh", "-c", "exit 3") == 3
    assert code("sh", "-c", "kill -9 $$") == 128 + 9
    assert code(str(tmp_path / "no-such-launcher")) == 2


# --- issue 41: a stop while the job starts ---------------------------------------------------------
def _start_wrapped(command: list[str]) -> subprocess.Popen:
    """`hvdtrain run COMMAND`, once its own handler is in place: a signal within the Python
    interpreter's start-up (a tenth of a second or so) ends it with 143 before it has started
    anything, which no code of its own can change."""
    job = subprocess.Popen(hvdtrain("run", *command), cwd=REPO, env=launcher_env(),
                           stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 30
    while not _handles(job.pid, signal.SIGTERM):
        assert job.poll() is None and time.monotonic() < deadline, job.communicate()
        time.sleep(0.01)
    return job


def _ranks_started(job: subprocess.Popen) -> bool:
    """Whether every rank has told the wrapper that it started (the file the launcher's
    environment names)."""
    for pid in process_tree(job.pid):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for entry in env:
            if entry.startswith(RANKS_FILE_ENV.encode() + b"="):
                return ranks_ready(Path(entry.split(b"=", 1)[1].decode()))
    return False


def _stop_and_wait(job: subprocess.Popen, delay: float,
                   after_start: bool = False) -> tuple[int, float, str, set[int]]:
    """SIGTERM after ``delay`` seconds (from the ranks' start with ``after_start``), as
    Kubernetes sends it; the code, the seconds the job took to end after it, its stderr, and
    the processes it had at the signal."""
    deadline = time.monotonic() + 120
    while after_start and not _ranks_started(job) and job.poll() is None:
        assert time.monotonic() < deadline, "the ranks never started"
        time.sleep(0.05)
    time.sleep(delay)
    tree = set(process_tree(job.pid)) - {job.pid}
    job.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    try:
        _, err = job.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        for pid in tree:
            _kill(pid)
        pytest.fail(f"still running 30 s after the SIGTERM at {delay} s")
    return job.returncode, time.monotonic() - signalled, err, tree


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _left_behind(tree: set[int], mark: str, since: float) -> list[str]:
    """The job's processes still running (named by ``mark`` in their command line), and
    mpirun's session folders of its processes made since the job started (``since``, a
    time.time()): a folder an earlier job left under a pid that one of this job's processes
    now has is not this job's (a CI run on a machine whose temporary folder held one dated the
    day before failed on it)."""
    time.sleep(0.5)
    left = []
    for pid in tree:
        try:
            if mark in (Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")):
                left.append(f"process {pid}")
        except OSError:
            pass
        left += [str(p) for p in mpirun_session_folders(pid) if p.stat().st_mtime >= since]
    return left


def test_a_stop_at_any_moment_of_the_start_up_ends_within_10_s_with_nothing_left(tmp_path):
    # The stop used to reach ranks without a handler yet as mpirun's forwarded SIGUSR1: a rank
    # died of it, mpirun waited ~120 s in its abort, the wrapper exited 138 and, killed, left
    # mpirun running. Before the ranks are ready the wrapper now ends the launcher's session
    # (nothing was trained) and exits 75; after, the ranks stop at a step with a checkpoint.
    # The delays run from the wrapper's start, and the last two from the ranks' (however long
    # their start takes on a busy machine), so that both sides of it are swept.
    outcomes = []
    for i, (delay, after_start) in enumerate([(0.0, False), (0.3, False), (1.0, False),
                                               (2.0, False), (3.5, False), (0.0, True),
                                               (0.5, True)]):
        run_dir = tmp_path / f"run{i}"
        since = time.time() - 1  # a folder's time is in whole seconds on some file systems
        job = _start_wrapped(mpirun(2, *hvdtrain("train", "--no-progress", "--epochs", "3",
                                                 "--run-dir", str(run_dir))))
        code, took, err, tree = _stop_and_wait(job, delay, after_start)
        outcomes.append((delay, after_start, code, round(took, 1)))
        assert code in (PREEMPTED, 0), (delay, code, err[-3000:])
        assert took < 10, (delay, took, err)
        assert "Traceback" not in err, err[-3000:]
        left = _left_behind(tree, str(run_dir), since)
        assert not left, (delay, left)
    print(outcomes)


def test_a_command_that_handles_no_stop_is_ended_by_it():
    # `hvdtrain run sleep 30` swallowed SIGTERM: sleep handles no SIGUSR1, so nothing was sent.
    since = time.time() - 1
    job = _start_wrapped(["sleep", "30"])
    code, took, err, tree = _stop_and_wait(job, 0.3)
    assert code == PREEMPTED and took < 5, (code, took, err)
    assert "hvdtrain run: SIGTERM while the job started" in err, err
    assert not _left_behind(tree, "sleep", since), tree
