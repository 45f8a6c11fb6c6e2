"""A warning where training diverges without a NaN: an evaluation's test loss far above the
run's first. Plain async with 8 workers on digits at --lr 0.1 reached a test loss of 85.8 after
the 2.49 of its first epoch, then settled at chance accuracy (0.10) with finite losses and exit
code 0; the loss guard (stopping.py) sees only NaN and infinite losses."""

from __future__ import annotations

import math

# Times the first evaluation's test loss. The first evaluation comes early, when the loss is
# still near its start, and a run that trains, overfitting included, ends far below it.
RISE = 4.0


class DivergenceWatch:
    def __init__(self) -> None:
        self.first: float | None = None  # the first evaluation's test loss of this process's run
        self.warned = False  # once a run: the losses of a diverged run jump up and down

    def evaluated(self, test: tuple[float, dict] | None, global_step: int) -> str | None:
        """The warning for the evaluation ``test`` ((loss, metrics), None where this process
        scored none) at ``global_step``, or None; the caller adds what to change."""
        if test is None or self.warned or not math.isfinite(test[0]):
            return None  # a NaN evaluation has its own messages (best.py, the loss guard)
        loss = test[0]
        if self.first is None:
            self.first = loss
            return None
        if self.first <= 0 or loss <= RISE * self.first:
            return None
        self.warned = True
        return (f"hvdtrain: warning: the test loss is {loss:.4g} at global step {global_step}, "
                f"{loss / self.first:.1f} times the first evaluation's {self.first:.4g}: "
                "training is diverging")
