"""--eval-pauses-workers: while worker 0 evaluates, the servers hold the other workers' replies,
and server 0 charges each of them the time it computed meanwhile (a debt it then sleeps)."""

from __future__ import annotations

import numpy as np

from .protocol import Tag
from ..rules.clocks import WorkerClocks


class EvalPauses:
    def __init__(self, comm, charges: bool):
        self.comm = comm
        self.charges = charges          # server 0 charges the debts: every push reaches it
        self.paused_by: int | None = None   # the worker evaluating now
        self.held: dict[int, bool] = {}     # ... the replies held until it resumes
        self.started = 0.0                  # ... since when
        self.computed: dict[int, float] = {}  # ... worker -> seconds until it pushed
        self.debts: dict[int, float] = {}   # worker -> seconds it owes, sent with its reply
        self.debt_seconds = 0.0             # all the debts charged

    def pause(self, worker: int, now: float) -> None:
        self.paused_by, self.started, self.computed = worker, now, {}

    def arrived(self, worker: int, now: float) -> None:
        """A push, IDLE or DONE from ``worker``: it stops computing here, its reply held."""
        if self.paused_by not in (None, worker):
            self.computed.setdefault(worker, now - self.started)

    def holds(self, worker: int, stopping: bool) -> bool:
        """Whether a reply to ``worker`` waits for the evaluating worker's RESUME. Its own
        replies never wait, nor does anyone once the job is stopping."""
        return self.paused_by is not None and worker != self.paused_by and not stopping

    def resume(self, now: float, clocks: WorkerClocks, stopping: bool) -> dict[int, bool]:
        """The evaluation is over: returns the held replies, to go out with the parameters of
        now.

        Server 0 also charges each other worker the time it computed during the pause (until
        its push arrived, or all of it if it is still computing), which the worker then sleeps
        (client.step_done). Every worker's timeline thus shifts by the evaluation's length, as
        if the whole job had frozen while worker 0 evaluated: nobody gains the steps under way,
        and worker 0, whose clock leaves the evaluation out, waits for nobody. A worker that
        was waiting for the others (IDLE) or done owes nothing; only server 0 charges, as
        every push reaches it."""
        if self.charges and not stopping:
            for w in range(len(clocks.clocks)):
                if w == self.paused_by or clocks.is_done(w) or (
                        w in clocks.idle and w not in self.computed):
                    continue
                debt = self.computed.get(w, now - self.started)
                self.debts[w] = self.debts.get(w, 0.0) + debt
                self.debt_seconds += debt
        self.paused_by = None
        return self.release()

    def release(self) -> dict[int, bool]:
        held, self.held = self.held, {}
        return held

    def send_debt(self, worker: int, stopping: bool) -> None:
        """Before a reply: what ``worker`` owes for the last pauses (see resume)."""
        debt = self.debts.pop(worker, 0.0)
        if debt > 0 and not stopping:
            self.comm.Send(np.array([debt], dtype=np.float64), dest=worker, tag=Tag.DEBT)
