"""Sync's step, written once for every backend: each worker adds its gradient of the batch (k
backward passes over equal slices where gradients accumulate), the workers average the
gradients through the port, and each worker clips the mean and steps. Every worker holds the
same parameters before and after: the Horovod and torch.distributed schemes (sync/) and the
simulator's virtual workers (compare/sim/) run this class.

The engine owns the order of those calls and the accumulation's scale; what a backward pass is
and what a step is belong to the learner it is given (``Learner``): the real schemes give it a
replica and its torch optimizer (``ReplicaLearner``), the simulator a flat parameter vector and
its optimizer. It keeps no clock: a backend that times the wait for the other workers times
``update()``, which holds the averaging.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, ContextManager, Protocol, Sequence

import torch

from ..replica import Replica, split_batch
from .ports import CollectivePort


class Learner(Protocol):
    """One worker's model and optimizer, as the sync engine steps them."""

    def zero_grad(self) -> None:
        """Zero the gradients before a step's first backward pass."""

    def forward_backward(self, x: Any, y: Any, grad_scale: float) -> Any:
        """Add ``grad_scale`` times the gradient of the mean loss over (x, y) to the gradients;
        return the batch's statistics, which add with ``+=`` across the passes of a step."""

    def gradients_of(self) -> Sequence[torch.Tensor]:
        """The tensors whose ``.grad`` the workers average (the port's average_gradients)."""

    def apply(self) -> None:
        """Clip the averaged gradient (and unscale it under a loss scale), then step. Every
        worker holds the same mean, so every worker clips, skips or steps alike."""


class SyncStep:
    """The sync engine. ``port``: the other workers; ``learner``: this worker's model and
    optimizer; ``accumulation``: backward passes per step (--backward-passes-per-step k), over
    k equal slices of the batch, each scaled by 1/k, so that their sum is the gradient of the
    whole batch's mean loss and the update matches k = 1.

    ``step(x, y, weight)`` is the whole step; a backend that times the averaging calls its two
    halves, ``backward`` then ``update``. ``weight`` multiplies this worker's gradient before the
    average (1 where every worker trains an equal share; --balance weighs unequal shares, so that
    the average is the global batch's mean-loss gradient)."""

    def __init__(self, port: CollectivePort, learner: Learner, accumulation: int = 1):
        if accumulation < 1:
            raise ValueError(f"accumulation must be 1 or more, not {accumulation}")
        self.port = port
        self.learner = learner
        self.accumulation = accumulation

    def backward(self, x: Any, y: Any, weight: float = 1.0) -> Any:
        """Zero the gradients and add this worker's (weighted) gradient of the batch; returns the
        batch's statistics. No collective (a backend may start one in its backward hooks)."""
        learner, k = self.learner, self.accumulation
        learner.zero_grad()
        scale = weight / k
        if k == 1:
            return learner.forward_backward(x, y, scale)
        stats = None
        for xs, ys in zip(split_batch(x, k), split_batch(y, k)):
            part = learner.forward_backward(xs, ys, scale)
            if stats is None:
                stats = part
            else:
                stats += part
        return stats

    def update(self) -> None:
        """Collective: average the gradients across workers, then clip the mean and step."""
        self.port.average_gradients(self.learner.gradients_of())
        self.learner.apply()

    def step(self, x: Any, y: Any, weight: float = 1.0) -> Any:
        """One sync step: ``backward`` then ``update``; returns the batch's statistics."""
        stats = self.backward(x, y, weight)
        self.update()
        return stats


class ReplicaLearner:
    """A replica and its torch optimizer as the sync engine's learner.

    ``zero_grad``: what zeroes the gradients (default the optimizer's; Horovod's zero-copy
    buffer zeroes its own, sync/flat_gradients.py). ``stepping``: the context the step runs in
    once the gradients are averaged (Horovod: ``optimizer.skip_synchronize``, so that its
    optimizer does not average again). Without a loss scale or clipping the optimizer steps
    directly (no gradient list to build: the cheapest step); with them the replica unscales,
    clips the mean and steps (precision.py)."""

    def __init__(self, replica: Replica, optimizer: torch.optim.Optimizer,
                 zero_grad: Callable[[], None] | None = None,
                 stepping: Callable[[], ContextManager] | None = None):
        self.replica = replica
        self.optimizer = optimizer
        self.zero_grad = zero_grad or optimizer.zero_grad
        self.forward_backward = replica.forward_backward
        self._stepping = stepping or contextlib.nullcontext
        self._params = [p for group in optimizer.param_groups for p in group["params"]]

    def gradients_of(self) -> Sequence[torch.Tensor]:
        return self._params

    def apply(self) -> None:
        with self._stepping():
            if self.replica.precision.needs_synchronized_gradients:
                self.replica.update(self.optimizer)
            else:
                self.optimizer.step()
