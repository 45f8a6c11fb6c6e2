"""Where each worker stands, as a parameter server sees it: its clock (the pushes it made) and
the parameter versions it last received. The bookkeeping that the round policies read."""

from __future__ import annotations

import math

# Whom a worker about to wait for the others (a blocking collective of workers) tells so (IDLE),
# as its round policy's ``idle_reports`` says: every server, server 0 alone, or nobody (None).
IDLE_TO_EVERY_SERVER, IDLE_TO_LEADER = "every server", "server 0"


class WorkerClocks:
    def __init__(self, num_workers: int):
        self.clocks: list[float] = [0] * num_workers  # pushes per worker; inf once done
        self.finished: set[int] = set()  # workers whose batches are all used up: no more pushes
        self.idle: set[int] = set()      # workers in a wait for the others (IDLE): no round of
                                         # backup workers waits for them; a pause charges them
                                         # nothing

    def push(self, worker: int, clock: int) -> None:
        self.clocks[worker] = clock
        self.idle.discard(worker)  # it pushes again: rounds and pauses count on it again

    def done(self, worker: int) -> None:
        self.clocks[worker] = math.inf

    def is_done(self, worker: int) -> bool:
        return math.isinf(self.clocks[worker])

    def bound_view(self) -> list[float]:
        """The clocks a staleness bound compares: a worker that will push no more (its batches
        are used up), or none until the others meet it (idle in a collective of workers), is as
        good as done, or the others would wait for it forever."""
        return [math.inf if w in self.finished or w in self.idle else c
                for w, c in enumerate(self.clocks)]

    def pushing(self, count_idle: bool = True) -> int:
        """Workers still running (and, unless ``count_idle``, not idle)."""
        return sum(1 for w, c in enumerate(self.clocks)
                   if not math.isinf(c) and (count_idle or w not in self.idle))


class Versions:
    """The parameters' version (updates applied) and what each worker last saw of it."""

    def __init__(self, num_workers: int):
        self.version = 0
        self.pulled = [0] * num_workers     # version each worker last received (staleness)
        self.pushed_on = [0] * num_workers  # version of each worker's last push reply: the
                                            # parameters its next gradient is computed on

    def start(self, version: int) -> None:
        """Every worker begins from ``version`` (a fresh start, or a checkpoint's)."""
        self.version = version
        self.pulled = [version] * len(self.pulled)
        self.pushed_on = [version] * len(self.pushed_on)

    def staleness(self, worker: int) -> int:
        """Updates applied since ``worker`` received the parameters its gradient is from."""
        return self.version - self.pulled[worker]

    def updated(self) -> None:
        self.version += 1

    def received(self, worker: int) -> None:
        self.pulled[worker] = self.version

    def replied_to_push(self, worker: int) -> None:
        self.pushed_on[worker] = self.version
