"""A lock-step round's gradients: summed as they come, then averaged over those that came.

Every push joins the round and counts for its quorum, with or without a gradient (a skipped fp16
step, whose worker pushed nothing to add); the mean is over the gradients that came."""

from __future__ import annotations

import numpy as np


class RoundSum:
    def __init__(self, length: int):
        self.total = np.zeros(length, dtype=np.float32)
        self.pushes = 0     # pushes that joined this round
        self.gradients = 0  # ... that carried a gradient

    def add(self, a: int, b: int, grad: np.ndarray) -> None:
        """Add elements [a, b) of a joining push's gradient (the server adds chunk by chunk)."""
        self.total[a:b] += grad

    def join(self, has_gradient: bool) -> None:
        """A push joined the round (after its gradient's chunks were added)."""
        self.pushes += 1
        self.gradients += bool(has_gradient)

    def mean(self) -> np.ndarray | None:
        """The mean of the gradients that came, in place; None when none came."""
        if not self.gradients:
            return None
        self.total /= self.gradients  # the sum, then the mean: the same arithmetic everywhere
        return self.total

    def clear(self) -> None:
        if self.gradients:
            self.total[:] = 0
        self.pushes = self.gradients = 0
