"""Waiting on MPI requests with a deadline, so that a stopped or diverged peer ends the job with
an error instead of a silent hang. MPI's own waits have no timeout; this polls ``Testany``, which
costs what ``Waitany`` costs (Open MPI spins in both) and checks the clock every 1024 polls."""

from __future__ import annotations

import time
from typing import Callable


class StuckError(RuntimeError):
    """A peer sent nothing for longer than --timeout-s. The message says who waited for what."""


def wait_any(MPI, requests: list, timeout_s: float, explain: Callable[[], str],
             status=None, check: Callable[[], None] | None = None,
             limit: str = "--timeout-s") -> int:
    """Index of one completed request, or MPI.UNDEFINED once none is active. ``check`` runs
    every 1024 polls meanwhile, and may raise (a lost worker told that the job ended).
    ``limit``: what ``timeout_s`` is, for the message."""
    if not timeout_s and check is None:
        return MPI.Request.Waitany(requests, status)
    deadline = time.monotonic() + timeout_s if timeout_s else float("inf")
    polls = 0
    while True:
        index, done = MPI.Request.Testany(requests, status)
        if done:
            return index
        polls += 1
        if polls & 1023:
            continue
        if check is not None:
            check()
        if time.monotonic() > deadline:
            raise StuckError(f"{explain()} (waited {timeout_s:g} s, {limit}); a process has "
                             "stopped or hangs. Raise --timeout-s if it may pause this long.")
