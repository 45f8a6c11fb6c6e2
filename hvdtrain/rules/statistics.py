"""What the update rules record, as the server reports it (and the simulator's result shows)."""

from __future__ import annotations

from collections import Counter
from typing import Any


class RuleStatistics:
    def __init__(self, staleness: Counter | None = None):
        self.staleness = Counter() if staleness is None else staleness  # of every applied gradient
        self.lr_factor_sum = 0.0          # --staleness-lr: the weights applied
        self.gradients_per_round = Counter()  # lock-step: rounds closed, by the gradients they took
        self.dropped_gradients = 0        # --backup-workers: late gradients, never applied
        self.pushes_without_gradient = 0  # fp16 steps the workers skipped

    def pushed(self, has_gradient: bool) -> None:
        self.pushes_without_gradient += not has_gradient

    def applied(self, staleness: int, factor: float = 1.0) -> None:
        self.staleness[staleness] += 1
        self.lr_factor_sum += factor

    def round_closed(self, gradients: int) -> None:
        self.gradients_per_round[gradients] += 1
        self.staleness[0] += gradients  # every gradient of a round is fresh

    def dropped(self) -> None:
        self.dropped_gradients += 1

    def report(self, lock_step: bool, staleness_lr: bool) -> dict[str, Any]:
        return {"pushes_without_gradient": self.pushes_without_gradient,
                "dropped_gradients": self.dropped_gradients,
                **({"gradients_per_round": {int(k): int(v) for k, v in
                                            sorted(self.gradients_per_round.items())}}
                   if lock_step else {}),
                **({"mean_lr_factor": round(self.lr_factor_sum / max(1, sum(
                    self.staleness.values())), 6)} if staleness_lr else {}),
                "staleness_histogram": {int(k): int(v) for k, v in sorted(self.staleness.items())}}
