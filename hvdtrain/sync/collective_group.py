"""The sync workers as a group (scheme.py Group) over a collective port (engines/ports.py): the
loop's sums, the lead's broadcasts, the stop vote and the meeting before an evaluation."""

from __future__ import annotations

import contextlib
import time
from typing import Any

from ..engines.ports import CollectivePort
from ..scheme import Group


class CollectiveGroup(Group):
    """Every rank of ``port``; ``stall_timeout_s``: --stall-timeout-s (the port's waits have
    no timeout of their own)."""

    def __init__(self, port: CollectivePort, stall_timeout_s: float):
        self.port = port
        self._stall_timeout_s = stall_timeout_s
        self._stop_vote = None  # the pending sum of the stop vote started at the previous vote
        self._voted_at: float | None = None  # when this rank started it (time.perf_counter)

    @property
    def stall_timeout_s(self) -> float:
        return self._stall_timeout_s

    def workers(self) -> tuple[int, int]:
        return self.port.rank, self.port.size  # every rank also scores a share of the test split

    def sum_across_workers(self, values: list[float]) -> list[float]:
        return self.port.sum(values, name="metrics")

    def broadcast_object(self, obj: Any) -> Any:
        return self.port.broadcast_object(obj)

    @contextlib.contextmanager
    def evaluating(self):
        self.port.barrier()  # every rank evaluates a share: see Group.evaluating
        yield

    def agree_to_stop(self, wants: bool) -> bool:
        """Every rank's stop flag is summed in the background, started at one vote and read at
        the next, when it has long arrived; so the ranks agree on the same step without a
        blocking collective. A signal therefore stops the job one vote later. The vote also sums
        each rank's microseconds since its previous vote (integers: the sum is exact, so
        vote_gap_s is the same on every rank), which spaces the votes (loop/stop_cadence.py)."""
        port = self.port
        agreed, self.vote_gap_s = False, 0.0
        if port.size == 1:
            # Alone there is no one to agree with: a vote would still pass a tensor through
            # Horovod's background thread, which DDP's np=1 loop does not pay. It stops at once.
            return wants
        now = time.perf_counter()
        if self._stop_vote is not None:
            votes = self._stop_vote.wait()
            agreed = votes[0] > 0
            self.vote_gap_s = votes[1] / 1e6 / port.size
            self._stop_vote = None
        if not agreed:
            gap_us = int((now - self._voted_at) * 1e6) if self._voted_at is not None else 0
            self._stop_vote = port.start_sum([int(wants), gap_us], name="stop")
            self._voted_at = now
        return agreed

    def finish_vote(self) -> None:
        """At the end of training: the last step's vote, which no rank reads any more, is
        completed (a collective every rank started must be waited for)."""
        if self._stop_vote is not None:
            self._stop_vote.wait()
            self._stop_vote = None

    def forget_vote(self) -> None:
        """After an elastic reset: a vote started before it died with the old ring."""
        self._stop_vote = None
