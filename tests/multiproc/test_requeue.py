"""Preemption under a launcher ends with 75 (issue 24): `hvdtrain run mpirun|horovodrun ...` gets
the signals Kubernetes and Slurm send (SIGTERM to the container's first process, or to every
process of the job; SIGKILL after the grace period), the ranks stop after a step with a
checkpoint, and the job's exit code is 75, so the scheduler requeues it. Without the wrapper,
mpirun and horovodrun answer a SIGTERM with 1 (test_long_jobs.py)."""

import os
import signal
import subprocess
import time

import pytest

from hvdtrain import checkpoint
from hvdtrain.requeue import process_tree
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
