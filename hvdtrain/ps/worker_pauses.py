"""An async worker's side of an evaluation (ps/pauses.py is the servers'): the evaluating worker
tells the servers that its silence is no hang, and with --eval-pauses-workers that the others
must pause; every other worker then sleeps the time server 0 charges it, so that nobody trains
during an evaluation, as in sync mode."""

from __future__ import annotations

import contextlib
import time

from .protocol import Kind


class WorkerPauses:
    """``link``: the worker's ServerLink; ``pauses``: --eval-pauses-workers."""

    def __init__(self, link, pauses: bool):
        self.link, self.pauses = link, pauses
        self.debt = 0.0  # seconds to sleep for an evaluation's pause

    def after_reply(self) -> None:
        """The seconds server 0 charged for an evaluation's pause (sent before the reply, so
        they have arrived), to be slept after the step (step_done), outside the step's own
        time, which a straggler's slowdown multiplies."""
        if self.pauses:
            self.debt += self.link.receive_debt()

    def step_done(self) -> None:
        if self.debt > 0:
            time.sleep(self.debt)
            self.debt = 0.0

    @contextlib.contextmanager
    def evaluating(self, clock: int, evaluates: bool):
        """While this worker (``evaluates``: it scores the test split) evaluates at ``clock``:
        the servers hold the other workers' replies (--eval-pauses-workers) and charge each of
        them the time it computed meanwhile, which it then sleeps."""
        if evaluates:
            self.link.tell(Kind.QUIET, clock)  # a long evaluation is no hang (silence.py)
        if not (self.pauses and evaluates):
            yield
            return
        self.link.tell(Kind.PAUSE, clock)
        try:
            yield
        finally:
            self.link.tell(Kind.RESUME, clock)
