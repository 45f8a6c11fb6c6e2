"""Asynchronous updates with a staleness bound: SSP (Ho et al. 2013), fully asynchronous with the
bound at infinity (Downpour, MXNet dist_async). Every gradient is applied on arrival; only the
reply to a push may wait, while its worker is too far ahead of the slowest."""

from __future__ import annotations

import math
from collections.abc import Iterable

from .clocks import IDLE_TO_EVERY_SERVER, IDLE_TO_LEADER, WorkerClocks


def may_proceed(clock: int, clocks: list[float], bound: float) -> bool:
    """SSP rule (Ho et al. 2013): a worker that has made ``clock`` pushes may start its next step
    only while it is at most ``bound`` clocks ahead of the slowest worker still running.
    ``clocks`` holds every worker's count, with ``inf`` for workers that have finished.
    bound = 0 is lock-step, bound = inf fully asynchronous."""
    slowest = min(clocks)
    return math.isinf(slowest) or clock - slowest <= bound


class StalenessBound:
    """The round policy of async and SSP: no rounds; a reply goes now unless the bound holds
    it, and a held one goes once the slowest has caught up."""

    lock_step = False  # gradients are applied on arrival, not summed into rounds
    fixed_shares = False  # the job's batches go to whoever asks (ps/dispatch.py)

    def __init__(self, bound: float):
        self.bound = bound

    def lr_scale(self, num_workers: int) -> float:
        return 1.0  # each update applies one worker's gradient alone

    def may_reply(self, clocks: WorkerClocks, worker: int) -> bool:
        return may_proceed(clocks.clocks[worker], clocks.bound_view(), self.bound)

    def released(self, clocks: WorkerClocks, held: Iterable[int]) -> list[int]:
        """The held workers that may go on now."""
        view = clocks.bound_view()  # replies move no clock: once for all held workers
        return [w for w in held if may_proceed(clocks.clocks[w], view, self.bound)]

    def is_late(self, versions, worker: int) -> bool:
        return False  # every gradient counts, stale or not

    def idle_reports(self, eval_pauses_workers: bool, recovery: bool) -> str | None:
        """Whom a worker that waits for the others tells (clocks.IDLE_TO_*). A finite bound
        must not hold the others back for its clock (the job's batches are not shared out
        evenly, so a worker meeting the others at an epoch's end may be behind them), nor may an
        evaluation's pause charge it: every server. Under mpirun's recovery settings server 0,
        which would otherwise take the silent worker for lost before a dead one it waits for
        (silence.py)."""
        if eval_pauses_workers or not math.isinf(self.bound):
            return IDLE_TO_EVERY_SERVER
        return IDLE_TO_LEADER if recovery else None
