"""Launch the planned runs one after another, each with a timeout. A run that already finished
with the same command is skipped; a failed run is recorded with its exit code and output, and
tried again next time."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ..errors import ConfigError
from .plan import PlannedRun

STATUS = "status.json"
OUTPUT = "output.txt"


def launch_env() -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if hasattr(os, "geteuid") and os.geteuid() == 0:  # Open MPI refuses root without these
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return env


def _finished_status(run_dir: Path) -> dict | None:
    """The recorded status of a run that finished (ok), whatever its command, else None."""
    try:
        status = json.loads((run_dir / STATUS).read_text())
    except (OSError, ValueError):
        return None
    return status if status.get("status") == "ok" else None


# the flags whose values name the user's code as MODULE:CALLABLE (--metrics: NAME=...,NAME=...)
CODE_FLAGS = ("--model", "--dataset", "--loss", "--metrics", "--collate")


def user_code(command: list[str]) -> dict[str, str]:
    """The SHA-256 of each .py file the command's --model, --dataset, --loss, --metrics or
    --collate names: an edited model file leaves the command as it was, and its finished runs
    were of another model."""
    values = [value for flag, value in zip(command, command[1:]) if flag in CODE_FLAGS]
    values += [word.partition("=")[2] for word in command
               if word.partition("=")[0] in CODE_FLAGS and "=" in word]
    digests = {}
    for value in values:
        for spec in value.split(","):
            module = spec.rpartition("=")[2].rpartition(":")[0]
            if module.endswith(".py"):
                with contextlib.suppress(OSError):
                    digests[module] = hashlib.sha256(Path(module).read_bytes()).hexdigest()
    return digests


def previous_status(run_dir: Path, command: list[str]) -> dict | None:
    """The recorded status of a finished run with exactly this command and user code, else
    None."""
    status = _finished_status(run_dir)
    if (status and status.get("command") == command and (run_dir / "metrics.jsonl").is_file()
            and _code_as_recorded(status, command)):
        return status
    return None


def check_no_other_plan(runs: list[PlannedRun], out: Path) -> None:
    """Refuse, before any run starts, a plan whose run folders hold finished runs of other
    flags (an earlier plan's, another --target): running it would replace their logs and
    checkpoints, which --force alone may do."""
    for run in runs:
        run_dir = out / "runs" / run.name
        status = _finished_status(run_dir)
        command = run.command(sys.executable, str(run_dir))
        if status is None or status.get("command") is None:
            continue
        if status["command"] == command:
            if not _code_as_recorded(status, command):
                now = user_code(command)
                edited = sorted(name for name in {**status["user_code"], **now}
                                if status["user_code"].get(name) != now.get(name))
                raise ConfigError(f"--out {out}: {run_dir} holds a finished run of "
                                  f"{', '.join(edited)} as it was before an edit; pass another "
                                  "--out to keep it, or --force to run the plan again")
            continue
        before, now = _flags(status["command"]), _flags(command)
        differ = (f"it had {' '.join(sorted(before - now)) or 'no other flag'} where this plan "
                  f"has {' '.join(sorted(now - before)) or 'none'}")
        raise ConfigError(f"--out {out}: {run_dir} holds a finished run of another plan "
                          f"({differ}); pass another --out to keep it, or --force to replace "
                          "the runs of that plan")


def _code_as_recorded(status: dict, command: list[str]) -> bool:
    """Whether the user's files are as the finished run recorded them (a run recorded before
    hvdtrain kept their digests is taken as it is)."""
    return "user_code" not in status or status["user_code"] == user_code(command)


def _flags(command: list[str]) -> set[str]:
    """A command's words, each value with its flag (``--stop-at test_acc>=0.9``)."""
    return {f"{command[i - 1]} {word}" if i and command[i - 1].startswith("--")
            and not word.startswith("-") else word for i, word in enumerate(command)}


def run_one(run: PlannedRun, out: Path, timeout: float, force: bool,
            max_restarts: int = 0) -> dict:
    """Run (or skip) one planned run; returns its status record. A restartable run (--faults,
    sync) that fails is launched again, up to ``max_restarts`` times: its command resumes the
    run's checkpoint (--auto-resume), and ``seconds`` is the whole job's, failed attempts and
    restarts included."""
    run_dir = out / "runs" / run.name
    command = run.command(sys.executable, str(run_dir))
    if not force:
        done = previous_status(run_dir, command)
        if done:
            return {**done, "skipped": True}
    if run_dir.exists():  # a failed or different earlier attempt: start clean
        for child in run_dir.iterdir():
            if child.is_file():
                child.unlink()
    run_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    restarts = 0
    with open(run_dir / OUTPUT, "w") as log:
        code, reason = _attempt(command, log, timeout)
        while code != 0 and run.restartable and restarts < max_restarts:
            restarts += 1
            log.write(f"\nhvdtrain compare: the run failed ({reason}); restart {restarts} of "
                      f"at most {max_restarts}, with --auto-resume\n")
            log.flush()
            code, reason = _attempt(command, log, timeout)
    status = {"status": "ok" if code == 0 else "failed", "reason": reason, "returncode": code,
              "seconds": round(time.perf_counter() - started, 2), "command": command,
              "user_code": user_code(command),
              **({"restarts": restarts} if run.faults else {})}
    (run_dir / STATUS).write_text(json.dumps(status, indent=1))
    return {**status, "skipped": False}


def _attempt(command: list[str], log, timeout: float) -> tuple[int | None, str]:
    """One launch of the command, its output into ``log``: (exit code, why it failed)."""
    # A session of its own, so a timeout can stop mpirun and every rank it started.
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=launch_env(),
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        code = proc.wait(timeout=timeout)
        return code, "" if code == 0 else f"exit code {code}"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return None, f"timed out after {timeout:g} s"
    except BaseException:  # compare itself stopped (Ctrl-C, stop_on_sigterm): the run's job too
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise


@contextlib.contextmanager
def stop_on_sigterm():
    """Inside it, a SIGTERM (a scheduler's, ``kill``) ends compare as Ctrl-C does, through its
    finally clauses: they stop the run under way (a session of its own, which the signal never
    reaches), remove the slow-link lab's namespaces and free the --out folder. Python's default
    for SIGTERM ends the process at once and leaves all three behind."""
    def stop(signum, frame):
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def last_lines(path: Path, n: int = 3) -> str:
    try:
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    errors = [line for line in lines if "error" in line.lower()]
    return " | ".join((errors or lines)[-n:])
