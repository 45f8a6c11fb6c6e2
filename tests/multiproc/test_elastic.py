"""Elastic sync training (--elastic) under horovodrun --gloo with a host discovery script: a
worker killed mid-run is survived, and a host that appears is taken in.

The "hosts" are names of this machine: localhost, 127.0.0.1 and this machine's own address.
Horovod runs workers locally for any name that resolves to a local address, and treats each
name as its own host (a host whose worker fails is blacklisted, so the names must differ)."""

import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from hvdtrain import checkpoint
from hvdtrain.run_output import read_jsonl
from launch import BIN, hvdtrain, launcher_env, pid_of_rank, wait_for_checkpoint

pytestmark = pytest.mark.multiproc


class ElasticJob:
    """horovodrun --gloo elastic, its output collected line by line as it runs."""

    def __init__(self, tmp_path: Path, hosts: list[str], np: int, *train_flags: str):
        self.hosts_file = tmp_path / "hosts"
        self.hosts_file.write_text("".join(f"{h}:1\n" for h in hosts))
        discover = tmp_path / "discover.sh"
        discover.write_text(f"#!/bin/sh\ncat {self.hosts_file}\n")
        discover.chmod(0o755)
        self.run_dir = tmp_path / "run"
        command = [str(BIN / "horovodrun"), "-np", str(np), "--min-np", "1", "--max-np", "3",
                   "--host-discovery-script", str(discover), "--gloo",
                   *hvdtrain("train", "--elastic", "--elastic-commit-steps", "5", "--no-progress",
                             "--seed", "1", "--run-dir", str(self.run_dir), *train_flags)]
        self.lines: list[str] = []
        self.proc = subprocess.Popen(command, env=launcher_env(), cwd=tmp_path, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())

    def wait_for(self, text: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not any(text in line for line in self.lines):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"never saw {text!r}; output:\n" + "\n".join(self.lines[-60:]))
            time.sleep(0.2)

    def add_host(self, host: str) -> None:
        with open(self.hosts_file, "a") as f:
            f.write(f"{host}:1\n")

    def finish(self, timeout: float = 300) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            pytest.fail("elastic job hung; output:\n" + "\n".join(self.lines[-60:]))

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)

    def epochs(self) -> list[dict]:
        return [r for r in read_jsonl(self.run_dir / "metrics.jsonl") if r["type"] == "epoch"]


@pytest.mark.parametrize("killed_rank", [1, 0])
def test_a_killed_worker_is_survived_and_training_reaches_the_target(tmp_path, killed_rank):
    job = ElasticJob(tmp_path, ["localhost", "127.0.0.1"], 2, "--epochs", "15",
                     "--batch-size", "16")
    job.wait_for("epoch 2/15")
    pid = pid_of_rank(job.run_dir, "HOROVOD_RANK", killed_rank)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    job.wait_for("elastic reset 1: now 1 worker(s)")
    if killed_rank == 0:  # the survivor takes over the log and the checkpoints
        job.wait_for("this process is rank 0 now")
    assert job.finish() == 0, "\n".join(job.lines[-40:])
    epochs = job.epochs()
    assert epochs[-1]["epoch"] == 15 and epochs[-1]["workers"] == 1
    assert any(e["workers"] == 2 for e in epochs)
    assert epochs[-1]["test_acc"] >= 0.95, epochs[-1]
    assert checkpoint.load(job.run_dir)["epoch"] == 15
    assert any("done: test accuracy" in line for line in job.lines)


def test_an_injected_kill_is_survived_like_one_from_outside(tmp_path):
    """--inject-faults under elastic sync: the schedule the other schemes' fault tests use
    (issue 28) kills rank 1, once: the restored workers do not fire it again. At step 60, in
    the second epoch (45 steps each), so that the first epoch's line has both workers."""
    job = ElasticJob(tmp_path, ["localhost", "127.0.0.1"], 2, "--epochs", "8",
                     "--batch-size", "16", "--inject-faults", "kill:rank=1,step=60")
    job.wait_for("elastic reset 1: now 1 worker(s)")
    assert job.finish() == 0, "\n".join(job.lines[-40:])
    assert sum("injected fault: kill rank 1" in line for line in job.lines) == 1
    epochs = job.epochs()
    assert epochs[-1]["epoch"] == 8 and epochs[-1]["workers"] == 1
    assert epochs[0]["workers"] == 2 and epochs[-1]["test_acc"] >= 0.9, epochs[-1]


def _own_address() -> str | None:
    """A non-loopback IPv4 address of this machine (no packet is sent), or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: only selects the outgoing interface
            address = s.getsockname()[0]
        except OSError:
            return None
    return None if address.startswith("127.") else address


def test_a_host_that_appears_is_taken_in(tmp_path):
    extra = _own_address()
    if extra is None:
        pytest.skip("this machine has no non-loopback address to act as a third host")
    # 3 epochs: the host is taken in at the first commit after discovery (within a second),
    # early in epoch 2; 3 workers on this machine's 2 cores then train at about 6 s an epoch.
    job = ElasticJob(tmp_path, ["localhost", "127.0.0.1"], 2, "--epochs", "3",
                     "--batch-size", "16")
    job.wait_for("epoch 1/3")
    # The new worker then finds this run's checkpoint and must join the run, not refuse the
    # folder (elastic implies --auto-resume).
    wait_for_checkpoint(job.run_dir, timeout=60, poll=0.1)
    job.add_host(extra)
    job.wait_for("now 3 worker(s)")
    assert job.finish() == 0, "\n".join(job.lines[-40:])
    epochs = job.epochs()
    assert epochs[0]["workers"] == 2 and epochs[-1]["workers"] == 3
    assert epochs[-1]["epoch"] == 3
