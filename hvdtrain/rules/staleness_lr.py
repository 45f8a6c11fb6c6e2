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


LOWER_LR = "lower --lr or check the data"  # the loss guard's advice where staleness plays no part


def divergence_hint(cfg: Any, num_workers: int) -> str:
    """The loss guard's advice (loop/stopping.py) for a run whose loss became NaN or infinite:
    beside a lower rate, for an async run the weight on stale updates where it has none. Plain
    async with 8 workers on digits (SGD, --lr 0.1) diverged (test accuracy 0.10 after 6 epochs)
    where --staleness-lr reached 0.64: each gradient there is about 7 updates old, a step that a
    fresh one of that rate would not take."""
    ps = cfg.ps
    if cfg.run.mode != "async":
        if cfg.sync.compression == "fp16" and cfg.sync.local_steps == 1:
            # a gradient over 65504 becomes inf in the compressed allreduce, whatever --lr
            return ("drop --compression fp16: fp16 holds values up to 65504 only, and a larger "
                    "gradient becomes inf in the allreduce; or lower --lr, or check the data")
        return LOWER_LR
    if ps.wire_dtype == "fp16":  # a gradient over 65504 becomes inf on the wire, whatever --lr
        return ("use --wire-dtype bf16: fp16 messages hold values up to 65504 only, and a "
                "larger gradient becomes inf on the wire (bf16 has float32's range); or lower "
                "--lr, or check the data")
    if cfg.sync.local_steps > 1:  # async DiLoCo: an outer step on each pushed round
        unweighted = not (ps.round_staleness_weight or ps.staleness_lr or ps.bsp)
        return ("lower --lr (the inner rate) or --outer-lr"
                + (", drop --no-round-staleness-weight" if unweighted else "")
                + ", or check the data")
    if ps.bsp or ps.staleness_lr or num_workers < 2:
        return LOWER_LR
    old = "1 update" if num_workers == 2 else f"{num_workers - 1} updates"
    return (f"lower --lr, or weigh each gradient by its staleness with --staleness-lr (with "
            f"{num_workers} workers a gradient is about {old} old), or check the data")


def check_options(cfg: Any) -> None:
    """--staleness-lr in a config: the combinations it cannot run; the config's validation calls
    it."""
    require(not (cfg.ps.bsp and cfg.ps.staleness_lr), "--staleness-lr", True,
            "every gradient of a --bsp round is fresh, so there is nothing to scale; drop "
            "one of them")
