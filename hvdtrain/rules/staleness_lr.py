"""--staleness-lr (Zhang et al. 2016, "Staleness-aware Async-SGD"): a gradient's step is
weighted by its staleness. Asynchronous DiLoCo's rounds are weighted by theirs up to the
number of workers (RoundWeight, --round-staleness-weight)."""

from __future__ import annotations

from typing import Any

from ..errors import require
from .apply import Adjustment


def staleness_lr_factor(staleness: int) -> float:
    """A gradient computed ``staleness`` updates ago takes a step of lr / staleness; a fresh one
    (0 or 1) the full lr."""
    return 1.0 / max(1, staleness)


class StalenessWeight(Adjustment):
    def factor(self, staleness: int) -> float:
        return staleness_lr_factor(staleness)


class RoundWeight(Adjustment):
    """Asynchronous DiLoCo's pushed round, ``staleness`` pushes old, steps with the weight
    1/max(1, min(staleness, N - 1)): a round counts as one of the N workers' rounds that moved
    the model since its worker's pull, as sync DiLoCo's outer step takes their mean. Why: each
    push moves the server by a whole round of inner steps, computed from weights about N - 1
    pushes old, and nothing averages the N workers' rounds. Unweighted, a tiny GPT on 8 real
    workers diverged (test loss 7.02 after an epoch, 1.96 weighted) and 4 simulated workers
    took about 8 times sync DiLoCo's time to the target. The cap at N - 1 leaves 2 workers
    unweighted: there a straggler's rounds are about 3 pushes old, and weighing them by a third
    (--staleness-lr) made async DiLoCo slower than sync DiLoCo under the slow-link lab's 3x
    straggler, where it had been faster (docs/async.md, "Many workers")."""

    def __init__(self, num_workers: int):
        self.cap = max(1, num_workers - 1)

    def factor(self, staleness: int) -> float:
        return staleness_lr_factor(min(staleness, self.cap))  # --staleness-lr, capped


def check_options(cfg: Any) -> None:
    """--staleness-lr in a config: the combinations it cannot run; the config's validation calls
    it."""
    require(not (cfg.ps.bsp and cfg.ps.staleness_lr), "--staleness-lr", True,
            "every gradient of a --bsp round is fresh, so there is nothing to scale; drop "
            "one of them")
