"""Asynchronous local SGD / DiLoCo rounds (``--mode async --local-steps H``; Liu et al. 2024,
"Asynchronous Local-SGD Training for Language Modeling"), one worker's side, written once for
every backend: the worker steps its own (inner) optimizer; every H steps it pushes its
pseudo-gradient (the parameters it last received minus its own) and takes the parameters that
come back, which are both its live weights and the next round's start. The server applies the
outer optimizer to each push as it arrives (ps/shard_optimizer.py, rules/local_sgd.OuterStep).

Unlike sync's rounds (local_rounds.py) nothing here is collective: a worker never waits for
another, only for the server's reply. Where the model is read (a checkpoint, the end of
training, an evaluation at an epoch's end) the round ends early (``share_model``), so that the
server's model holds this worker's progress; an evaluation inside an epoch scores the round's
start (``pulled``) and ends nothing (ps/diloco_client.py eval_replica).
"""

from __future__ import annotations

from typing import Callable, Protocol

import torch


class PushPort(Protocol):
    """What the engine asks of the server's client."""

    def push_round(self, steps: int) -> None:
        """Push the pseudo-gradient that the engine wrote into the push buffer (a round of
        ``steps`` inner steps) and receive the server's current parameters into the live
        weights."""

    def pull(self) -> None:
        """Receive the server's current parameters into the live weights."""


class AsyncRounds:
    """One worker's rounds. ``port``: the server (PushPort). ``local_steps``: H. ``weights``:
    this worker's live parameters as one flat tensor; ``push_buffer``: the flat tensor a push
    carries (both callables, asked afresh each time: a backend may rebind its buffers).

    The driver calls ``start()`` once the live weights hold the server's parameters,
    ``stepped()`` after each inner optimizer step and ``share_model()`` wherever the model is
    read. Counters: ``unshared_steps`` (inner steps since the last push), ``rounds_total``
    (pushes made) and ``rounds`` (this epoch's: ``take_epoch_rounds``)."""

    def __init__(self, port: PushPort, local_steps: int, weights: Callable[[], torch.Tensor],
                 push_buffer: Callable[[], torch.Tensor]):
        if local_steps < 1:
            raise ValueError(f"local_steps must be 1 or more, not {local_steps}")
        self.port, self.local_steps = port, local_steps
        self._weights, self._push_buffer = weights, push_buffer
        self.pulled: torch.Tensor | None = None  # the round's start: the parameters received
        self.unshared_steps = 0
        self.rounds = 0
        self.rounds_total = 0

    def start(self) -> None:
        """The live weights hold the server's parameters (a start, a resume, a pull): the
        round starts from them."""
        weights = self._weights()
        if self.pulled is None:
            self.pulled = weights.detach().clone()
        else:
            self.pulled.copy_(weights)

    def stepped(self) -> bool:
        """After an inner step: a push once H steps are unshared. True if it pushed."""
        self.unshared_steps += 1
        return self.unshared_steps >= self.local_steps and self.share_model()

    def share_model(self) -> bool:
        """End the round now if any inner step is unshared: push the pseudo-gradient, go on from
        the parameters that come back. True if it pushed."""
        if not self.unshared_steps:
            return False
        with torch.no_grad():
            torch.sub(self.pulled, self._weights(), out=self._push_buffer())
        self.port.push_round(self.unshared_steps)
        self.start()
        self.unshared_steps = 0
        self.rounds += 1
        self.rounds_total += 1
        return True

    def refresh(self) -> None:
        """Where the model is read: the server's current parameters in the live weights, with
        this worker's progress pushed first (a round under way ends early)."""
        if not self.share_model():
            self.port.pull()
            self.start()

    def model_to_score(self) -> torch.Tensor | None:
        """Where an evaluation inside an epoch reads the model: while a round is under way its
        start (the server's parameters of the last reply), and the round goes on untouched;
        None at a round's start, where the live weights are those."""
        return self.pulled if self.unshared_steps else None

    def take_epoch_rounds(self) -> int:
        rounds, self.rounds = self.rounds, 0
        return rounds
