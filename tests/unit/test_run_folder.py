"""Who owns a run folder (issue 14, items 1, 2 and 11): the folder lock, default folders that
never collide, --resume A --run-dir B, a --resume with no epochs left, the compare folder's lock,
and stale checkpoint temporaries."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

import pytest
from helpers.forked_cli import run_forked

from hvdtrain import checkpoint
from hvdtrain.cli import main
from hvdtrain.config import ConfigError
from hvdtrain.loop import checkpointer as checkpointer_module
from hvdtrain.loop.checkpointer import make_fresh_folder
from hvdtrain.run_lock import LOCK_NAME, FolderInUse, FolderLock
from launch import LAUNCH_TIMEOUT, hvdtrain, launcher_env
from test_trainer import make_trainer

HOST = socket.gethostname()
DEAD_PID = 999999999  # above any pid_max: no such process
QUIET = ("--no-progress", "--batch-size", "64", "--epochs", "1")


def dead_holder_record(folder: Path, host: str = "gone-host") -> None:
    """What a run killed while it held the folder leaves: its record, and no flock."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / LOCK_NAME).write_text(json.dumps(
        {"host": host, "pid": DEAD_PID, "since": "2024-01-01 00:00:00"}) + "\n")


def wait_until_locked(folder: Path, job: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    lock = folder / LOCK_NAME
    while not (lock.exists() and lock.stat().st_size):
        assert job.poll() is None, f"the job ended before it locked {folder}: {job.communicate()}"
        assert time.monotonic() < deadline, f"{lock} still empty after {timeout} s"
        time.sleep(0.05)


# --- FolderLock ---------------------------------------------------------------------------------
HOLD = """
import sys, time
from hvdtrain.run_lock import FolderLock
FolderLock(sys.argv[1]).acquire()
print("locked", flush=True)
time.sleep(600)
"""


def test_a_held_lock_refuses_other_processes_and_is_free_once_its_holder_is_killed(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE,
                              text=True, env=launcher_env())
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(FolderInUse) as refused:
            FolderLock(tmp_path).acquire()
        assert f"PID {holder.pid} on host {HOST}" in str(refused.value)
        assert str(refused.value).startswith(f"--run-dir {tmp_path} is in use")
    finally:
        holder.send_signal(signal.SIGKILL)  # no clean release: the kernel drops the flock
        holder.wait(timeout=30)
    lock = FolderLock(tmp_path)
    previous = lock.acquire()
    assert previous["pid"] == holder.pid and previous["host"] == HOST  # a stale lock, taken over
    assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()
    lock.release()
    assert (tmp_path / LOCK_NAME).read_text() == ""  # a clean end
    again = FolderLock(tmp_path)
    assert again.acquire() is None  # nothing to take over after a clean end
    again.release()


def test_default_run_folders_started_in_the_same_second_differ(tmp_path):
    folder = tmp_path / "runs" / "20240101-000000-sync-digits-mlp"
    taken = []

    def take():
        taken.append(make_fresh_folder(folder))
    threads = [threading.Thread(target=take) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(p.name for p in taken) == sorted(
        [folder.name] + [f"{folder.name}-{n}" for n in range(2, 7)])


class SameSecond(datetime):
    @classmethod
    def now(cls, tz=None):
        return datetime(2024, 1, 1, 12, 0, 0)


def test_two_trainers_with_the_default_folder_in_the_same_second_claim_two_folders(
        tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(checkpointer_module, "datetime", SameSecond)
    first, second = make_trainer(tmp_path, run_dir=""), make_trainer(tmp_path, run_dir="")
    assert first.run_dir == second.run_dir  # the same default name...
    try:
        a, b = first.checkpointer.claim(), second.checkpointer.claim()
        assert a != b and b.name == f"{a.name}-2"  # ...but not the same folder
    finally:
        first.checkpointer.release()
        second.checkpointer.release()


def test_best_pt_goes_into_the_folder_the_run_claimed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(checkpointer_module, "datetime", SameSecond)
    trainer = make_trainer(tmp_path, run_dir="", epochs=1, keep_best="test_acc")
    trainer.run_dir.mkdir(parents=True)  # a run that started in the same second took the name
    trainer.fit()
    assert trainer.run_dir.name.endswith("-2")
    assert sorted(p.name for p in trainer.run_dir.iterdir()) == [
        LOCK_NAME, "best.pt", "checkpoint.pt", "metrics.jsonl"]
    assert not (trainer.run_dir.with_name(trainer.run_dir.name[:-2]) / "best.pt").exists()


def test_a_stale_lock_is_taken_over_with_a_message_and_the_run_succeeds(tmp_path, capsys):
    dead_holder_record(tmp_path)
    make_trainer(tmp_path, epochs=1).fit()
    out = capsys.readouterr().out
    assert (f"{tmp_path} was locked by PID {DEAD_PID} on host gone-host (since "
            "2024-01-01 00:00:00), which ended without releasing it; taking it over") in out
    assert checkpoint.load(tmp_path)["epoch"] == 1
    assert (tmp_path / LOCK_NAME).read_text() == ""


def test_a_second_run_into_a_busy_folder_exits_2_and_the_first_finishes_intact(command_lines):
    """Reproduction 1: two jobs with one --run-dir. Before the lock, the second trained into the
    first's folder: mixed log lines, and a checkpoint of the wrong model. (The two jobs are
    command_lines' first job and its "busy" case, below.)"""
    folder, second = command_lines["X"], command_lines["busy"]
    first, out, err = command_lines["first"]
    refused_with(second, f"is in use by another hvdtrain job (PID {first.pid} on host {HOST}")
    assert first.returncode == 0, out + err
    state = checkpoint.load(folder)
    assert state["epoch"] == 3 and state["config"]["run"]["seed"] == 1
    assert tuple(state["model"]["1.weight"].shape) == (256, 64)  # the first run's --hidden
    assert tuple(state["model"]["3.weight"].shape) == (128, 256)
    lines = (folder / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]  # every line whole
    assert [r["type"] for r in records].count("header") == 1
    assert [r["epoch"] for r in records if r["type"] == "epoch"] == [1, 2, 3]
    assert (folder / LOCK_NAME).read_text() == ""


# --- --resume A --run-dir B ---------------------------------------------------------------------
def same_weights(state, saved):
    return all((state["model"][k] == saved["model"][k]).all() for k in saved["model"])


def test_resume_into_a_folder_that_holds_another_runs_checkpoint_is_refused(tmp_path):
    """Reproduction 2: --resume A --run-dir B overwrote B's own run."""
    a, b = tmp_path / "A", tmp_path / "B"
    make_trainer(a, epochs=1).fit()
    make_trainer(b, epochs=1, seed=5).fit()
    before = (b / checkpoint.CHECKPOINT_NAME).read_bytes()
    with pytest.raises(checkpoint.CheckpointError) as refused:
        make_trainer(b, epochs=2, resume=str(a)).fit()
    assert (f"--resume {a} --run-dir {b}: {b / 'checkpoint.pt'} holds another run's checkpoint"
            in str(refused.value))
    assert (b / checkpoint.CHECKPOINT_NAME).read_bytes() == before
    assert (b / LOCK_NAME).read_text() == ""  # released on the way out


def test_resume_with_auto_resume_continues_the_folders_own_checkpoint(tmp_path, capsys):
    a, b = tmp_path / "A", tmp_path / "B"
    make_trainer(a, epochs=1).fit()
    make_trainer(b, epochs=1, seed=5).fit()
    own = checkpoint.load(b)
    requeued = make_trainer(b, epochs=2, resume=str(a), auto_resume=True)
    requeued.fit()
    started, resuming = requeued.scheme.started_with
    assert resuming and same_weights(started, own)
    assert not same_weights(started, checkpoint.load(a))
    out = capsys.readouterr().out
    assert f"{b} holds this run's own checkpoint, newer than --resume {a}" in out
    assert checkpoint.load(b)["epoch"] == 2


def test_resume_into_an_empty_folder_starts_from_the_resumed_run(tmp_path):
    a, b = tmp_path / "A", tmp_path / "B"
    make_trainer(a, epochs=1).fit()
    source = (a / checkpoint.CHECKPOINT_NAME).read_bytes()
    resumed = make_trainer(b, epochs=2, resume=str(a))
    resumed.fit()
    assert same_weights(resumed.scheme.started_with[0], checkpoint.load(a))
    assert checkpoint.load(b)["epoch"] == 2
    assert (a / checkpoint.CHECKPOINT_NAME).read_bytes() == source  # A is left as it was


# --- --resume RUN/best.pt (issue 24) -------------------------------------------------------------
def test_resume_of_a_file_beside_the_checkpoint_that_is_none_names_the_run_to_continue(tmp_path):
    """--resume RUN/metrics.jsonl had been told to branch from it into a new folder, a command
    that then failed as 'not a readable checkpoint'."""
    run_dir = tmp_path / "run"
    make_trainer(run_dir, epochs=1).fit()
    log = str(run_dir / "metrics.jsonl")
    with pytest.raises(checkpoint.CheckpointError) as refused:
        make_trainer(run_dir, run_dir=None, epochs=2, resume=log).fit()
    assert str(refused.value) == (f"--resume {log}: metrics.jsonl is not a checkpoint (not a "
                                  f"torch zip archive); continue the run with --resume {run_dir}")


def test_resume_of_a_best_pt_never_written_says_it_is_not_there(tmp_path):
    """It was told to branch from best.pt into a new folder, a command that then failed with
    'no checkpoint at'."""
    run_dir = tmp_path / "run"
    make_trainer(run_dir, epochs=1).fit()  # no --keep-best: no best.pt
    best = str(run_dir / "best.pt")
    with pytest.raises(checkpoint.CheckpointError) as refused:
        make_trainer(run_dir, run_dir=None, epochs=2, resume=best).fit()
    assert str(refused.value) == (f"--resume {best}: there is no best.pt in {run_dir} (its "
                                  f"checkpoints: checkpoint.pt); continue the run with --resume "
                                  f"{run_dir}")


def test_resume_of_best_pt_leaves_the_runs_checkpoint_and_log_alone(tmp_path):
    """--resume RUN/best.pt wrote into RUN: its checkpoint.pt replaced, a second branch in its
    log. It is refused, and the command it suggests branches into a new folder."""
    run_dir = tmp_path / "run"
    make_trainer(run_dir, epochs=3, keep_best="min:test_acc").fit()  # best.pt: not the last epoch
    before = {name: (run_dir / name).read_bytes() for name in ("checkpoint.pt", "metrics.jsonl")}
    best = str(run_dir / "best.pt")
    with pytest.raises(checkpoint.CheckpointError) as refused:
        make_trainer(run_dir, run_dir=None, epochs=4, lr=0.01, resume=best).fit()
    branch = tmp_path / "run-from-best"
    assert (f"--resume {best}: best.pt is not the latest checkpoint of {run_dir}"
            in str(refused.value))
    assert f"--resume {best} --run-dir {branch}, or continue the run itself with --resume " \
           f"{run_dir}" in str(refused.value)
    assert {name: (run_dir / name).read_bytes() for name in before} == before
    assert (run_dir / LOCK_NAME).read_text() == ""  # released on the way out
    branched = make_trainer(branch, epochs=4, resume=best)  # the suggested command
    branched.fit()
    assert same_weights(branched.scheme.started_with[0], checkpoint.load(best))
    assert checkpoint.load(branch)["epoch"] == 4
    assert {name: (run_dir / name).read_bytes() for name in before} == before
    # The folder's own latest checkpoint, named as a file, still continues the run in place.
    make_trainer(run_dir, run_dir=None, epochs=4, resume=str(run_dir / "checkpoint.pt")).fit()
    assert checkpoint.load(run_dir)["epoch"] == 4


# --- --resume of a finished run -----------------------------------------------------------------
def test_resume_with_fewer_epochs_than_the_checkpoint_trained_is_refused(tmp_path):
    make_trainer(tmp_path, epochs=2).fit()
    before = (tmp_path / checkpoint.CHECKPOINT_NAME).read_bytes()
    with pytest.raises(ConfigError) as refused:
        make_trainer(tmp_path, epochs=1, resume=str(tmp_path)).fit()
    assert "--epochs 1: the checkpoint" in str(refused.value)
    assert "has trained 2 epoch(s) already" in str(refused.value)
    assert "pass --epochs 3 or more" in str(refused.value)
    assert (tmp_path / checkpoint.CHECKPOINT_NAME).read_bytes() == before


def test_resume_of_a_finished_run_with_equal_epochs_says_nothing_is_left(tmp_path, capsys):
    make_trainer(tmp_path, epochs=2).fit()
    before = (tmp_path / checkpoint.CHECKPOINT_NAME).read_bytes()
    capsys.readouterr()
    make_trainer(tmp_path, epochs=2, resume=str(tmp_path)).fit()
    assert "has finished all 2 epoch(s); nothing is left to train" in capsys.readouterr().out
    assert (tmp_path / checkpoint.CHECKPOINT_NAME).read_bytes() == before


# --- the refusals, from the command line --------------------------------------------------------
@pytest.fixture(scope="module")
def command_lines(tmp_path_factory):
    """The command lines that must exit 2 before training, and a finished run's resume, each
    in its own folder (two at once could meet in one folder's lock; the resume of A into B only
    reads A, beside the refusal of A/best.pt in A): one process trains the runs they resume, in
    forked children (torch imported once), and once each checkpoint is read, a second runs
    them (two launches, where a launch per command line took eight). Among them, the second
    job into the folder X that a first job, launched on its own, holds (three launches, where
    the four tests took ten)."""
    folder = tmp_path_factory.mktemp("command_lines")
    busy = folder / "X"
    first = subprocess.Popen(
        hvdtrain("train", "--epochs", "3", "--seed", "1", "--run-dir", str(busy),
                 "--no-progress"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=launcher_env(),
        stdin=subprocess.DEVNULL)
    try:
        wait_until_locked(busy, first)
        # The first job is stopped while the others run (seconds, on a busy machine longer than
        # it needs to train), so it is surely still in its folder when the "busy" case starts.
        first.send_signal(signal.SIGSTOP)
        runs = forked_command_lines(folder, busy)
        first.send_signal(signal.SIGCONT)
        out, err = first.communicate(timeout=LAUNCH_TIMEOUT)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    return {**runs, "X": busy, "first": (first, out, err)}


def forked_command_lines(folder: Path, busy: Path) -> dict:
    a, b, two, two_again = (folder / name for name in ("A", "B", "two", "two2"))
    trained = run_forked([["train", *QUIET, "--keep-best", "test_acc", "--run-dir", str(a)],
                          ["train", *QUIET, "--seed", "2", "--run-dir", str(b)],
                          ["train", *QUIET, "--epochs", "2", "--run-dir", str(two)],
                          ["train", *QUIET, "--epochs", "2", "--run-dir", str(two_again)]],
                         folder / "trained")
    for proc in trained:
        assert proc.returncode == 0, proc.args + [proc.stdout, proc.stderr]
    before = {path: (path / checkpoint.CHECKPOINT_NAME).read_bytes() for path in (a, b)}
    procs = run_forked([
        ["train", *QUIET, "--epochs", "2", "--resume", str(a), "--run-dir", str(b)],
        ["train", *QUIET, "--epochs", "2", "--resume", str(a / "best.pt")],
        ["train", *QUIET, "--resume", str(two)],
        ["train", *QUIET, "--epochs", "2", "--resume", str(two_again)],
        ["train", "--batch-size", "1", "--epochs", "3", "--seed", "2", "--hidden", "32",
         "--run-dir", str(busy), "--no-progress"]], folder / "refused")
    return {"before": before, "A": a, "B": b,
            **dict(zip(("another", "best.pt", "fewer", "equal", "busy"), procs))}


def refused_with(proc, message: str) -> None:
    """A command line refused as bad input: exit 2, ``message`` on stderr, no traceback."""
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_resume_into_another_folder_exits_2_from_the_command_line(command_lines):
    refused, b = command_lines["another"], command_lines["B"]
    refused_with(refused, "holds another run's checkpoint")
    assert (b / checkpoint.CHECKPOINT_NAME).read_bytes() == command_lines["before"][b]


def test_resume_of_best_pt_exits_2_from_the_command_line(command_lines):
    refused, run_dir = command_lines["best.pt"], command_lines["A"]
    refused_with(refused, "best.pt is not the latest checkpoint")
    assert (run_dir / checkpoint.CHECKPOINT_NAME).read_bytes() == command_lines["before"][run_dir]


def test_resume_of_a_finished_run_with_fewer_epochs_exits_2_from_the_command_line(command_lines):
    refused, finished = command_lines["fewer"], command_lines["equal"]
    refused_with(refused, "--epochs 1: the checkpoint")
    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert "nothing is left to train" in finished.stdout


# --- compare --out ------------------------------------------------------------------------------
def stub_runs(monkeypatch, launched: list):
    """Runs that fail at once, and no plots, so that a compare takes no time."""
    from hvdtrain.compare import plots, runner

    def failed_run(run, out, timeout, force, max_restarts=0):
        launched.append(run.name)
        return {"status": "failed", "reason": "stub", "seconds": 0.0}
    monkeypatch.setattr(runner, "run_one", failed_run)
    monkeypatch.setattr(plots, "write_plots", lambda *args: [])


ONE_RUN = ("--modes", "sync", "--seeds", "1", "--stragglers", "none")


def test_a_second_compare_into_a_busy_folder_exits_2_naming_the_holder(
        tmp_path, capsys, monkeypatch):
    launched = []
    stub_runs(monkeypatch, launched)
    out = tmp_path / "out"
    with FolderLock(out, flag="--out"):  # the first compare, still running
        assert main(["compare", "--out", str(out), *ONE_RUN]) == 2
    err = capsys.readouterr().err
    assert f"--out {out} is in use by another hvdtrain job (PID {os.getpid()} on host {HOST}" in err
    assert launched == []


def test_a_compare_takes_over_a_stale_lock_and_releases_it(tmp_path, capsys, monkeypatch):
    launched = []
    stub_runs(monkeypatch, launched)
    out = tmp_path / "out"
    dead_holder_record(out)
    assert main(["compare", "--out", str(out), *ONE_RUN]) == 1  # the stub run failed
    assert f"{out} was locked by PID {DEAD_PID}" in capsys.readouterr().out
    assert launched and (out / LOCK_NAME).read_text() == ""


# --- stale temporaries --------------------------------------------------------------------------
def test_stale_temporaries_of_best_pt_are_removed_too(tmp_path):
    dead = [tmp_path / f".checkpoint.pt.tmp{DEAD_PID}", tmp_path / f".best.pt.tmp{DEAD_PID}"]
    alive = tmp_path / f".best.pt.tmp{os.getppid()}"  # a live writer's file stays
    for path in [*dead, alive]:
        path.write_bytes(b"half a checkpoint")
    assert sorted(checkpoint.remove_stale_temporaries(tmp_path)) == sorted(dead)
    assert alive.exists() and not any(p.exists() for p in dead)
