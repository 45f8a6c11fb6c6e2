"""An exclusive lock on a run folder (or a compare folder), so that two jobs never write into one.

``flock()`` on ``<folder>/.hvdtrain.lock``: the kernel drops the lock when its holder dies, however
it dies, so a folder left by a crashed or killed run is free again, and no clock or PID guess is
needed to call a lock stale. The holder writes its host, PID and start time into the file: a
refusal names them, and a run that finds them in a free lock knows it takes over from a run that
did not end cleanly (a clean end empties the file). On NFS, Linux maps flock() to POSIX locks,
which the server arbitrates across hosts.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path

from .errors import ConfigError

LOCK_NAME = ".hvdtrain.lock"


class FolderInUse(ConfigError):
    """Another live process holds the folder (exit code 2, like any bad input)."""


class FolderLock:
    def __init__(self, folder: Path, flag: str = "--run-dir"):
        self.folder = Path(folder)
        self.flag = flag  # the option that chose the folder, for the messages
        self.path = self.folder / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> dict | None:
        """Take the lock; when the previous holder died holding it, say so and return its
        record (a stale lock taken over), else None. Raises FolderInUse while a live process
        holds it."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise ConfigError(f"{self.flag} {self.folder}: cannot create the folder's lock file "
                              f"{self.path} ({e.strerror or e}); pass a folder you can write "
                              "to") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_record(fd)
            os.close(fd)
            who = (f"PID {holder.get('pid')} on host {holder.get('host')}, since "
                   f"{holder.get('since')}" if holder else "another process")
            raise FolderInUse(
                f"{self.flag} {self.folder} is in use by another hvdtrain job ({who}); two runs "
                f"never share a folder: wait for that job to end, or pass another {self.flag}"
            ) from None
        except OSError as e:  # a file system without locks: go on, but say so
            print(f"warning: {self.flag} {self.folder}: cannot lock it ({e.strerror or e}); "
                  "nothing stops a second job from writing into it", flush=True)
            self._fd = fd
            return None
        previous = _read_record(fd)
        record = {"host": socket.gethostname(), "pid": os.getpid(),
                  "since": time.strftime("%Y-%m-%d %H:%M:%S")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
        self._fd = fd
        if previous:
            print(f"hvdtrain: {self.folder} was locked by PID {previous.get('pid')} on host "
                  f"{previous.get('host')} (since {previous.get('since')}), which ended without "
                  "releasing it; taking it over", flush=True)
        return previous or None

    def release(self) -> None:
        """Empty the record (a clean end) and drop the lock."""
        if self._fd is None:
            return
        try:
            os.ftruncate(self._fd, 0)
        except OSError:
            pass  # a full or lost disk: the lock still goes with the descriptor
        os.close(self._fd)  # closing the last descriptor releases the flock
        self._fd = None

    def __enter__(self) -> "FolderLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _read_record(fd: int) -> dict:
    try:
        text = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip()
        return json.loads(text) if text else {}
    except (OSError, ValueError):
        return {"host": "?", "pid": "?", "since": "?"}
