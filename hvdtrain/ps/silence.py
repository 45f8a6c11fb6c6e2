"""A server's watch for a worker that went silent: a wait for *any* request never notices one
worker's silence while the others push."""

from __future__ import annotations

import time
from collections.abc import Container

from ..rules.clocks import WorkerClocks
from .waiting import StuckError


class SilenceWatch:
    def __init__(self, index: int, num_workers: int, timeout_s: float):
        self.index, self.timeout_s = index, timeout_s
        self.last_heard: list[float] = [0.0] * num_workers  # each worker's last request
        self.quiet: set[int] = set()  # workers busy with their own work until their next push
        self._checked = 0.0

    def start(self) -> None:
        """Silence counts from here (INIT), however long worker 0 took to start (reading a large
        checkpoint while the others wait for it)."""
        self.last_heard = [time.perf_counter()] * len(self.last_heard)

    def heard(self, worker: int, pushed: bool, now: float) -> None:
        self.last_heard[worker] = now
        if pushed:  # back to training
            self.quiet.discard(worker)

    def overdue(self, now: float, clocks: WorkerClocks,
                waiting: list[Container[int]]) -> int | None:
        """A worker that has sent nothing for --timeout-s while the others go on (stopped, or
        hung in its own code), or None. A worker that waits on the servers (``waiting``: a
        held reply, a round, a pause), on the other workers (idle, done, its batches used up),
        or that said it is busy with its own work (QUIET: worker 0 evaluating or writing a
        checkpoint) is silent by design. The caller skips the check while stopping or paused
        (membership.py decides what a silent worker means)."""
        if not self.timeout_s or now - self._checked < 1.0:
            return None
        self._checked = now
        for w, heard in enumerate(self.last_heard):
            if now - heard <= self.timeout_s or clocks.is_done(w) or w in clocks.idle or \
                    w in clocks.finished or w in self.quiet or any(w in c for c in waiting):
                continue
            return w
        return None

    def describe(self, w: int, now: float, clocks: WorkerClocks) -> str:
        return (f"parameter server {self.index}: worker {w} (rank {w}) sent nothing for "
                f"{now - self.last_heard[w]:.0f} s while the other workers trained (its pushes "
                f"so far: {int(clocks.clocks[w])}); it has stopped or hangs (waited "
                f"{self.timeout_s:g} s, --timeout-s). Raise --timeout-s if a worker's own code "
                "may pause this long between two steps")
