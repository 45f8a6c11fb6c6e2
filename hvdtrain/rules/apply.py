"""The apply step: what one gradient does to the parameters. The optimizer's own step
(ps/shard_optimizer.ShardOptimizer, chunk by chunk), after the adjustments a rule adds: a weight
on the learning rate (staleness_lr.py) or a correction of the gradient (dc_asgd.py)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class Adjustment:
    """One change to the plain step. Every hook defaults to changing nothing."""

    rewrites_gradient = False  # correct() writes into the gradient: hand it a copy

    def factor(self, staleness: int) -> float:
        """The learning rate's weight for a gradient ``staleness`` updates old."""
        return 1.0

    def correct(self, worker: int, grad: np.ndarray, now: np.ndarray, a: int, b: int) -> None:
        """Rewrite elements [a, b) of ``worker``'s gradient in place; ``now`` holds the
        parameters' current values there."""

    def received(self, worker: int, params: np.ndarray) -> None:
        """``worker`` was sent the parameters ``params`` (the whole shard)."""


class ApplyStep:
    def __init__(self, adjustments: Sequence[Adjustment] = ()):
        self.adjustments = list(adjustments)

    @property
    def rewrites_gradient(self) -> bool:
        return any(a.rewrites_gradient for a in self.adjustments)

    def rate(self, lr: float, staleness: int) -> tuple[float, float]:
        """(the rate a gradient ``staleness`` updates old steps with, its weight)."""
        factor = 1.0
        for adjustment in self.adjustments:
            factor *= adjustment.factor(staleness)
        return (lr * factor if self.adjustments else lr), factor

    def apply_chunk(self, optimizer, chunk: int, grad: np.ndarray, lr: float,
                    worker: int | None = None) -> None:
        """Step chunk ``chunk`` of the optimizer's parameters with ``grad``, corrected first when
        it is ``worker``'s own gradient (a round's mean is nobody's: it is applied as it is)."""
        import torch  # here: the registry names modes for `hvdtrain --help`, which needs no torch

        if worker is not None:
            a, b = optimizer.chunks[chunk]
            for adjustment in self.adjustments:
                adjustment.correct(worker, grad, optimizer.params.numpy()[a:b], a, b)
        optimizer.apply(chunk, torch.from_numpy(grad), lr)

    def apply_all(self, optimizer, grad: np.ndarray, lr: float, worker: int | None = None) -> None:
        """The same over every chunk of a whole gradient. The update rules are elementwise, so
        chunked application is the same arithmetic as one step over the whole shard."""
        for i, (a, b) in enumerate(optimizer.chunks):
            self.apply_chunk(optimizer, i, grad[a:b], lr, worker)

    def received(self, worker: int, params: np.ndarray) -> None:
        for adjustment in self.adjustments:
            adjustment.received(worker, params)
