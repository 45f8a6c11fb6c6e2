"""No process of a trainer outlives it (issue 24): with --data-workers, its forkserver, resource
tracker and loader processes end within seconds of the trainer, however it ends. Before the fix
they stayed under PID 1 after a kill -9 or a stall-watchdog exit, about 0.9 GB each."""

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from hvdtrain.data.loader_processes import sweep_temp_dirs
from launch import REPO, hvdtrain, launcher_env, mpirun, pid_of_rank

pytestmark = pytest.mark.multiproc
DATA = "tests/helpers/user/user_data.py:digits"  # a map-style Dataset: DataLoader processes
GRACE_S = 10  # what the issue allows the processes of a dead trainer


def started(pid: int) -> str | None:
    """The start time of ``pid`` (field 22 of /proc/PID/stat), None if it is gone or a zombie:
    with it a reused PID is not taken for the process recorded before the kill."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] in ("Z", "X") else fields[19]


def descendants(pid: int) -> dict[int, str]:
    """Every process below ``pid``, with its start time."""
    found: dict[int, str] = {}
    frontier = [pid]
    while frontier:
        parent = frontier.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                children = (task / "children").read_text().split()
            except OSError:
                continue
            for child in map(int, children):
                if child not in found and (start := started(child)) is not None:
                    found[child] = start
                    frontier.append(child)
    return found


def survivors(recorded: dict[int, str]) -> dict[int, str]:
    """The recorded processes still running, with their command lines."""
    alive = {}
    for pid, start in recorded.items():
        if started(pid) == start:
            try:
                alive[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:120]
            except OSError:
                continue
    return alive


def loaders_running(run_dir: Path, job: subprocess.Popen, ranks: int,
                    timeout: float = 240) -> dict[int, dict[int, str]]:
    """Each rank's PID and its descendants, once the first epoch has ended (so that the test
    split's loader processes have started too) and every rank has at least its forkserver,
    resource tracker and two loader processes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if job.poll() is not None:
            pytest.fail(f"the job ended first, exit code {job.returncode}:\n"
                        f"{job.communicate()[0][-3000:]}")
        pids = [pid_of_rank(run_dir, "OMPI_COMM_WORLD_RANK", r) for r in range(ranks)]
        log = run_dir / "metrics.jsonl"
        if None not in pids and log.exists() and '"type": "epoch"' in log.read_text():
            below = {pid: descendants(pid) for pid in pids}
            if all(len(d) >= 4 for d in below.values()):
                return below
        time.sleep(0.5)
    pytest.fail(f"the first epoch did not end with loader processes within {timeout} s")


@pytest.mark.parametrize("ending", ["kill -9", "stall watchdog"])
def test_a_dead_trainer_leaves_no_process_behind(tmp_path, ending):
    run_dir, temp = tmp_path / "run", tmp_path / "tmp"
    temp.mkdir()  # the processes' temp folder: multiprocessing's pymp-* folders go there
    job = subprocess.Popen(
        # --stall-timeout-s: the watchdog counts from the last step, evaluation or checkpoint,
        # and the stop comes after the first epoch, so the start's length does not matter
        mpirun(2, *hvdtrain("train", "--dataset", DATA, "--data-workers", "2", "--epochs", "500",
                            "--no-progress", "--stall-timeout-s", "10", "--run-dir", str(run_dir))),
        cwd=REPO, env={**launcher_env(), "TMPDIR": str(temp)}, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    recorded: dict[int, str] = {}
    try:
        below = loaders_running(run_dir, job, ranks=2)
        for pids in below.values():
            recorded.update(pids)
        rank1 = list(below)[1]
        if ending == "kill -9":
            os.kill(rank1, signal.SIGKILL)
        else:  # rank 1 stops answering: rank 0's watchdog ends it with os._exit after 10 s
            os.kill(rank1, signal.SIGSTOP)
        out, _ = job.communicate(timeout=90)
        ended = time.monotonic()
        if ending == "stall watchdog":
            assert "no progress in" in out, out[-3000:]
        while (left := survivors(recorded)) and time.monotonic() < ended + GRACE_S:
            time.sleep(0.2)
        assert not left, (f"{len(left)} of the {len(recorded)} processes below the trainers are "
                          f"still running {time.monotonic() - ended:.0f} s after the job ended: "
                          f"{left}")
        # Their sockets' folders (issue 41): rank 1's loader processes removed its own; rank 0's
        # may remain where mpirun killed its processes all at once, for the next start on this
        # machine to remove.
        assert len(list(temp.glob("pymp-*"))) <= 1
        while list(temp.glob("pymp-*")) and time.monotonic() < ended + GRACE_S:
            sweep_temp_dirs(temp)  # once rank 0's PID is gone (reaped)
            time.sleep(0.2)
        assert list(temp.glob("pymp-*")) == []
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
        for pid in survivors(recorded):  # never leave them to the next test, even on a failure
            os.kill(pid, signal.SIGKILL)
