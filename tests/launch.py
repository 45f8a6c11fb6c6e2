"""Shared helpers: launch real mpirun / horovodrun jobs with a timeout, read their logs.

Tests import them with ``from launch import ...`` (pyproject.toml puts tests/ on the path). Whether
mpirun is installed is checked by tests/multiproc/conftest.py, for the multi-process tests only."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pytest

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent  # the venv's bin: hvdtrain, horovodrun
LAUNCH_TIMEOUT = 240  # seconds; a hung job fails the test instead of stalling CI
HELPER = str(REPO / "tests" / "helpers" / "train_and_dump.py")
# The runs several test files share (tests/multiproc/conftest.py runs each once a session): 2-rank
# sync training with these flags (the default optimizer, SGD with momentum 0.9), and the same
# training in lock-step through one parameter server (2 workers) in many chunks per message.
SYNC_REFERENCE = ["--epochs", "2", "--no-progress", "--seed", "3"]
BSP_REFERENCE = ["--mode", "async", "--bsp", *SYNC_REFERENCE, "--chunk-mb", "0.01"]


def launcher_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    # Open MPI refuses root without these; CI runs as root.
    env["OMPI_ALLOW_RUN_AS_ROOT"] = "1"
    env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    # No FLOP count in the tests' jobs (hvdtrain/loop/flops.py NO_COUNT): a second or two of
    # start-up in each of hundreds of jobs; test_throughput_multiproc.py counts.
    env["HVDTRAIN_NO_FLOP_COUNT"] = "1"
    return env


def mpirun(np: int, *command: str) -> list[str]:
    # --oversubscribe: the test machine may have fewer cores than ranks.
    return ["mpirun", "-np", str(np), "--oversubscribe", "--bind-to", "none", *command]


def horovodrun(np: int, *command: str) -> list[str]:
    return [str(BIN / "horovodrun"), "-np", str(np), "--gloo", *command]


def hvdtrain(*args: str) -> list[str]:
    return [str(BIN / "hvdtrain"), *args]


def run(cmd: list[str], cwd: Path | None = None, timeout: float = LAUNCH_TIMEOUT,
        check: bool = True, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run(cmd, cwd=cwd, env={**launcher_env(), **(env or {})},
                              capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"timed out after {timeout}s (a hang): {' '.join(cmd)}\n"
                    f"stdout:\n{e.stdout}\nstderr:\n{e.stderr}")
    if check and proc.returncode != 0:
        pytest.fail(f"exit code {proc.returncode}: {' '.join(cmd)}\n"
                    f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}")
    return proc


def wait_for_checkpoint(run_dir: Path, job: subprocess.Popen | None = None, timeout: float = 120,
                        poll: float = 0.2, accept: Callable[[dict], bool] | None = None
                        ) -> dict | None:
    """Poll until a running job has written run_dir's checkpoint (one that ``accept`` takes,
    when given; that checkpoint is returned). Fails if ``job`` ends first or after timeout."""
    from hvdtrain import checkpoint

    path = Path(run_dir) / checkpoint.CHECKPOINT_NAME
    deadline = time.monotonic() + timeout
    while True:
        if job is not None:
            assert job.poll() is None, f"the job ended before the checkpoint: {job.communicate()}"
        assert time.monotonic() < deadline, f"no such checkpoint in {run_dir} after {timeout} s"
        if path.exists():
            if accept is None:
                return None
            state = checkpoint.load(path)
            if accept(state):
                return state
        time.sleep(poll)


def pid_of_rank(run_dir: Path, rank_variable: str, rank: int) -> int | None:
    """The PID of the training process of a launched job (found by its --run-dir) whose launcher
    gave it ``rank_variable=rank`` (OMPI_COMM_WORLD_RANK for mpirun, HOROVOD_RANK for
    horovodrun), so a test can kill exactly that rank."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if str(run_dir).encode() in cmdline and f"{rank_variable}={rank}".encode() in environ:
            return int(entry.name)
    return None


def records(run_dir: Path, kind: str) -> list[dict]:
    """The lines of a run's metrics.jsonl of one type ("epoch", "step", "scheme"...)."""
    from hvdtrain.run_output import read_jsonl

    return [r for r in read_jsonl(Path(run_dir) / "metrics.jsonl") if r["type"] == kind]


def final_model(run_dir: Path) -> dict:
    """The model state of a run folder's checkpoint."""
    import torch

    return torch.load(Path(run_dir) / "checkpoint.pt", weights_only=True)["model"]


def ranks_agree_with_checkpoint(dumps: Path, run_dir: Path) -> dict:
    """Rank 0's and rank 1's final models (tests/helpers/train_and_dump.py wrote them into
    ``dumps``) are equal to each other and to the run's checkpoint; returns rank 0's."""
    import torch

    rank0 = torch.load(Path(dumps) / "rank0.pt", weights_only=True)
    rank1 = torch.load(Path(dumps) / "rank1.pt", weights_only=True)
    saved = final_model(run_dir)
    for name, tensor in rank0.items():
        assert torch.equal(tensor, rank1[name]), f"{name} differs between ranks"
        assert torch.equal(tensor, saved[name]), f"{name} differs from the checkpoint"
    return rank0


def no_update_applied_twice(summary: dict) -> None:
    """Issue 28's invariant for an async job (its "scheme" line; hvdtrain/ps/ledger.py): every
    server took each worker's pushes once, a lost worker's up to its loss, refused none but a
    lost worker's, and applied one update per push with a gradient; the job's batch plan
    completed no batch twice, handed one out again only when a lost worker gave it back, and
    left none untrained but those (a batch handed back after every survivor was told that none
    is left, hvdtrain/ps/slot_waiters.py: a worker lost while it trained the last batches it
    had read ahead, or during a stop)."""
    lost = {loss["worker"]: loss["pushes"] for loss in summary.get("workers_lost", [])}
    for server in summary["servers"]:
        taken = server["pushes_per_worker"]
        assert taken == server["pushes_made_per_worker"], server
        assert all(taken[w] == pushes for w, pushes in lost.items()), (lost, server)
        assert server["pushes_applied"] == sum(taken), server
        assert server["updates"] == sum(taken) - server["pushes_without_gradient"], server
        refused = server["pushes_refused_per_worker"]
        assert all(n == 0 for w, n in enumerate(refused) if w not in lost), server
    plan = summary["servers"][0]
    if "batches_completed" in plan:
        assert plan["batches_pushed_twice"] == 0, plan
        # batches_per_worker: each worker's batches, a lost one's given back not counted: the
        # completed ones, and any still out at a stop (untrained)
        handed = sum(plan["batches_per_worker"].values())
        assert plan["batches_completed"] <= handed <= (plan["batches_completed"] +
                                                       plan["batches_untrained"]), plan
        assert plan["batches_untrained"] <= plan["batches_handed_back"], plan
        assert lost or plan["batches_handed_back"] == 0, plan
