"""How the async workers stop together: a worker's signal rides on its next push, the servers
answer every worker with one STOP each, and the workers that ran out of epochs agree whether
any of them was stopped (so that the final evaluation and checkpoint include every last update).
"""

from __future__ import annotations

from typing import Callable


class StopVotes:
    """One worker's side of the stop. ``link``: its ServerLink; ``agree(value, op, what)``: an
    agreement of one word over the workers; ``going_idle()``: tells the servers it pushes no
    more; ``MAX``: MPI's MAX operation."""

    def __init__(self, link, agree: Callable, going_idle: Callable[[], None], MAX):
        self.link, self.agree, self.going_idle, self.MAX = link, agree, going_idle, MAX
        self.wants = False  # a stop signal arrived here: the next push says so
        self.told = False  # a server's STOP arrived
        self.received = False

    def after_push(self) -> None:
        if not self.told:
            self.told = self.link.stop_arrived()

    def agree_to_stop(self, wants: bool) -> bool:
        """The servers coordinate a stop: this worker's next push carries its signal, and every
        server then sends each worker one STOP message. Without lock-step rounds each worker
        stops after its own current step; with --bsp the servers send it when the round that
        carried the signal closes, so every worker stops after that same round."""
        self.wants = self.wants or wants
        if self.told:
            self.receive()
        return self.told

    def receive(self) -> None:
        """The STOP every server sends each worker, once: none is left unreceived."""
        if self.received:
            return
        # It pushes no more, and a round still open may be waiting for it (--backup-workers).
        self.going_idle()
        self.link.receive_stops()
        self.received = True

    def end_of_training(self) -> bool:
        # The final evaluation and checkpoint must include every worker's last update; a worker
        # that finished its epochs learns here whether another one was stopped by a signal.
        self.going_idle()  # it pushes no more
        anyone = self.agree(int(self.told), self.MAX, "the end of training")
        if anyone:
            self.told = True  # the servers sent this worker a STOP too
            self.receive()
        return bool(anyone)
