"""A server's watch for a worker that went silent: a wait for *any* request never notices one
worker's silence while the others push."""

from __future__ import annotations

import itertools
import time
from collections.abc import Container, Sequence

from ..rules.clocks import WorkerClocks
from .waiting import StuckError


# Under recovery a worker is taken for dead once it has been silent this many times its longest
# recent gap between pushes, but never sooner than the floor, nor later than --timeout-s: a job
# that can train on without it should not wait --timeout-s (300 s by default) for a SIGKILLed
# worker, and a live worker between two pushes is never silent for 50 of its slowest steps
# (its own pauses, evaluation and checkpoints, are announced as QUIET and count only past
# --timeout-s).
LOST_AFTER_GAPS = 50
LOST_AFTER_FLOOR_S = 10.0
RECENT_GAPS = 64


class SilenceWatch:
    def __init__(self, index: int, num_workers: int, timeout_s: float,
                 paces: list[Sequence[float]] | None = None):
        self.index, self.timeout_s = index, timeout_s
        self.paces = paces  # under recovery: each worker's push intervals (server_stats.py)
        self.last_heard: list[float] = [0.0] * num_workers  # each worker's last request
        self.quiet: set[int] = set()  # workers busy with their own work until their next push
        # Workers that said they wait for the others (IDLE) and sent nothing since: a worker's
        # next request of any kind ends it (the lead goes on to evaluate, QUIET, and to write
        # the final checkpoint, SAVE), so that a lead that dies there is still found.
        self.waiting_for_others: set[int] = set()
        self._checked = 0.0

    def start(self) -> None:
        """Silence counts from here (INIT), however long worker 0 took to start (reading a large
        checkpoint while the others wait for it)."""
        self.last_heard = [time.perf_counter()] * len(self.last_heard)

    def heard(self, worker: int, pushed: bool, now: float) -> None:
        self.last_heard[worker] = now
        self.waiting_for_others.discard(worker)  # an IDLE puts it back (server.py)
        if pushed:  # back to training
            self.quiet.discard(worker)

    def resumed(self, held: dict[int, bool], now: float) -> dict[int, bool]:
        """An evaluation pause is over: the workers whose replies it held were waiting by design,
        so their silence counts from now. A worker that never arrived to be held (a dead one)
        keeps its count, so a job that pauses often still finds it."""
        for w in held:
            self.last_heard[w] = max(self.last_heard[w], now)
        return held

    def overdue(self, now: float, clocks: WorkerClocks,
                waiting: list[Container[int]]) -> int | None:
        """A worker that has sent nothing for --timeout-s while the others go on (stopped, or
        hung in its own code), or None. A worker that waits on the servers (``waiting``: a
        held reply, a round, a pause), on the other workers (idle, done, its batches used up),
        is silent by design. One that said it is busy with its own work (QUIET: the lead
        evaluating or writing a checkpoint) is too; under recovery only for up to --timeout-s,
        not the limit of its pace (membership.py decides what a silent worker means)."""
        if not self.timeout_s or now - self._checked < 1.0:
            return None
        self._checked = now
        for w, heard in enumerate(self.last_heard):
            if now - heard <= self.limit(w) or clocks.is_done(w) or \
                    w in self.waiting_for_others or w in clocks.finished or \
                    any(w in c for c in waiting):
                continue
            if w in self.quiet and (self.paces is None or now - heard <= self.timeout_s):
                continue  # busy with its own work; under recovery for up to --timeout-s, as a
                # lead that dies while it evaluates must be found for another to take over
            return w
        return None

    def limit(self, w: int) -> float:
        """How long worker ``w`` may be silent: --timeout-s, or under recovery sooner for a
        worker whose pace is known (LOST_AFTER_GAPS)."""
        gaps = self.paces[w] if self.paces is not None else ()
        if len(gaps) < 2:
            return self.timeout_s
        recent = max(itertools.islice(reversed(gaps), RECENT_GAPS))
        return min(self.timeout_s, max(LOST_AFTER_FLOOR_S, LOST_AFTER_GAPS * recent))

    def describe(self, w: int, now: float, clocks: WorkerClocks) -> str:
        return (f"parameter server {self.index}: worker {w} (rank {w}) sent nothing for "
                f"{now - self.last_heard[w]:.0f} s while the other workers trained (its pushes "
                f"so far: {int(clocks.clocks[w])}); it has stopped or hangs (waited "
                f"{self.limit(w):g} s, --timeout-s). Raise --timeout-s if a worker's own code "
                "may pause this long between two steps")
