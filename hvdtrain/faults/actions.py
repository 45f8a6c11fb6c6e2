"""What an injected fault does to the process, and the record in the run folder of the faults
that fired, so that a job restarted from a checkpoint before the fault's step (--auto-resume, an
elastic reset) does not meet the same fault again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from .schedule import Fault

RECORD = "faults-fired.txt"

# The helper that ends a stop: it waits until this process is really stopped (state T in
# /proc), then sleeps the fault's seconds and sends SIGCONT. Waiting for the stop first means
# a helper that starts slowly cannot send its SIGCONT before the SIGSTOP and leave the
# process frozen for good; it gives up if the process is gone.
_WAKER = """
import os, signal, sys, time
pid, seconds = int(sys.argv[1]), float(sys.argv[2])
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    try:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] in "Tt":
                break
    except OSError:
        sys.exit(0)
    time.sleep(0.01)
time.sleep(seconds)
try:
    os.kill(pid, signal.SIGCONT)
except ProcessLookupError:
    pass
"""


class InjectedFault(RuntimeError):
    """The error an ``exception`` fault raises in the training loop."""


def announce(fault: Fault) -> None:
    print(f"hvdtrain: injected fault: {fault.describe()}", file=sys.stderr, flush=True)


def fire(fault: Fault) -> None:
    """Do what the fault says, now. ``slow`` is the hook's sleep, not an event."""
    announce(fault)
    if fault.kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)  # no clean-up, no message: as an OOM kill
    elif fault.kind == "stop":
        freeze(fault.seconds)
    elif fault.kind == "exception":
        raise InjectedFault(f"injected fault: exception at rank {fault.rank} after step "
                            f"{fault.step} (--inject-faults)")


def freeze(seconds: float) -> None:
    """Stop the whole process, every thread (Horovod's background thread, MPI's progress)
    included, as a node's hiccup or a ``kill -STOP`` does; a sleep in the loop would leave those
    threads answering. A helper process wakes it after ``seconds``: in a session of its own,
    so that a stop signal sent to the job's process group meanwhile (a terminal's Ctrl-C, a
    scheduler's SIGTERM) does not end the helper too and leave this process stopped for good;
    the signal is handled once it wakes."""
    subprocess.Popen([sys.executable, "-c", _WAKER, str(os.getpid()), str(seconds)],
                     stdin=subprocess.DEVNULL, close_fds=True, start_new_session=True)
    os.kill(os.getpid(), signal.SIGSTOP)


def fired_lines(folder: Path | None) -> list[str]:
    """The record of a folder: the faults that fired there, as written (Fault.text)."""
    if folder is None:
        return []
    try:
        return [line for line in (folder / RECORD).read_text().splitlines() if line.strip()]
    except OSError:
        return []


def already_fired(folder: Path | None, fault: Fault) -> bool:
    return fault.text() in fired_lines(folder)


def record_fired(folder: Path | None, fault: Fault) -> None:
    """Written, and flushed to disk, before the fault fires: a kill leaves no time after."""
    add_fired(folder, [fault.text()])


def add_fired(folder: Path | None, lines: list[str]) -> None:
    """Append to the folder's record the lines it does not hold yet."""
    new = [line for line in dict.fromkeys(lines) if line not in fired_lines(folder)]
    if folder is None or not new:
        return
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / RECORD, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, "".join(line + "\n" for line in new).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
