"""--staleness-lr (Zhang et al. 2016, "Staleness-aware Async-SGD"): a gradient's step is
weighted by its staleness."""

from __future__ import annotations

from .apply import Adjustment


def staleness_lr_factor(staleness: int) -> float:
    """A gradient computed ``staleness`` updates ago takes a step of lr / staleness; a fresh one
    (0 or 1) the full lr."""
    return 1.0 / max(1, staleness)


class StalenessWeight(Adjustment):
    def factor(self, staleness: int) -> float:
        return staleness_lr_factor(staleness)
