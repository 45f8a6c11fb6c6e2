"""A warning where training diverges without a NaN: an evaluation's test loss far above the
untrained model's loss, the first step's. Sync on digits at --lr 50 ended 3 epochs at chance
accuracy with test losses of 120 to 135 against a first step's 2.3, and plain async with 8
workers at --lr 0.1 reached 85.8; both exited 0. The loss guard (stopping.py) sees only NaN and
infinite losses.

A run can also diverge to chance and stay there, near the untrained loss, or never move at all
(a rate far too low, inputs and labels that do not belong together): one plain async run of 8
workers sat at 2.4 to 3.6 against 2.3, under the bound above. So the run's end says so where no
evaluation's test loss fell clearly below the untrained model's loss, and where a run that
learned ends back there (a rate that diverges late, as a warmup ends or momentum builds up): its
last model is no better than an untrained one, and only its best evaluation's is worth keeping."""

from __future__ import annotations

import math

# Times the untrained model's loss. A model that trains, overfitting included, stays below it:
# cross-entropy over 10 classes starts at 2.3, and 9.2 means confident wrong answers throughout.
RISE = 4.0
# A test loss that never fell below this share of the untrained model's loss has not learned:
# a model that trains on digits is at a tenth of it after one epoch.
FLAT = 0.95
# A run whose best test loss fell below this share of the untrained model's loss had learned
# something clear, so an end back above FLAT is a loss of what it learned, not noise.
LEARNED = 0.5


class DivergenceWatch:
    def __init__(self) -> None:
        # The loss of this process's first step of a fresh run (None on a resume: a trained
        # model's loss is no scale, since overfitting may multiply it).
        self.untrained: float | None = None
        self.warned = False  # once a run: the losses of a diverged run jump up and down
        self.lowest, self.evaluations = math.inf, 0  # of this run's finite test losses
        self.lowest_step, self.last = 0, math.inf  # where the lowest was; the latest one

    def evaluated(self, test: tuple[float, dict] | None, global_step: int) -> str | None:
        """The warning for the evaluation ``test`` ((loss, metrics), None where this process
        scored none) at ``global_step``, or None; the caller adds what to change."""
        start = self.untrained
        if test is None or self.warned or start is None or start <= 0:
            return None
        loss = test[0]
        if math.isfinite(loss):
            if loss < self.lowest:
                self.lowest, self.lowest_step = loss, global_step
            self.last, self.evaluations = loss, self.evaluations + 1
        if not math.isfinite(loss) or loss <= RISE * start:
            return None  # a NaN evaluation has its own messages (best.py, the loss guard)
        self.warned = True
        return (f"hvdtrain: warning: the test loss is {loss:.4g} at global step {global_step}, "
                f"{loss / start:.1f} times the untrained model's {start:.4g} (the first step's "
                "training loss): training is diverging")

    def ended(self) -> tuple[str, bool] | None:
        """At the run's end: the warning where two or more evaluations' test losses all stayed
        near the untrained model's loss, or where the run learned and its last evaluation is
        back there, with whether the run never learned; None otherwise. The caller adds what
        to change. Worded for a model that may have started trained (a pretrained one barely
        moves)."""
        start = self.untrained
        if self.warned or start is None or start <= 0 or self.evaluations < 2:
            return None
        if self.lowest < LEARNED * start and self.last >= FLAT * start:
            return (f"hvdtrain: warning: the last evaluation's test loss {self.last:.4g} is back "
                    f"near the first step's training loss {start:.4g}, after falling to "
                    f"{self.lowest:.4g} at global step {self.lowest_step}: training diverged "
                    "after it had learned, and the final model is no better than an untrained "
                    "one", False)
        if self.lowest < FLAT * start:
            return None
        return (f"hvdtrain: warning: in {self.evaluations} evaluations the test loss never fell "
                f"below {FLAT} times the first step's training loss {start:.4g} (its lowest: "
                f"{self.lowest:.4g}): if the model started untrained, it learned nothing (too "
                "high a rate sends a run to chance, too low a rate leaves it where it started)",
                True)
