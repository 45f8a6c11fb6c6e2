"""--staleness-lr (Zhang et al. 2016, "Staleness-aware Async-SGD"): a gradient's step is
weighted by its staleness. Asynchronous DiLoCo takes it unless told not to (default_for)."""

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


def default_for(cfg: Any) -> bool:
    """--staleness-lr where the flag is not given: on for asynchronous DiLoCo (--mode async
    --local-steps H, not --bsp), off otherwise. Why: each of N workers' pushes moves the
    server by a whole round of H inner steps, computed from weights about N - 1 pushes old, and
    nothing averages them as sync DiLoCo's allreduce does. Unweighted, a tiny GPT on 8 real
    workers diverged (test loss 6.8 after an epoch) where plain async and sync DiLoCo trained,
    and 4 simulated workers needed 7 times sync DiLoCo's time; weighted, 8 workers reached 1.95
    after an epoch. With 2 workers a push is mostly 1 update old, which the weight leaves
    whole (docs/async.md, "Many workers: pushes weighted by their staleness")."""
    return cfg.run.mode == "async" and cfg.sync.local_steps != 1 and not cfg.ps.bsp


def check_options(cfg: Any) -> None:
    """--staleness-lr in a config: the combinations it cannot run; the config's validation calls
    it."""
    require(not (cfg.ps.bsp and cfg.ps.staleness_lr), "--staleness-lr", True,
            "every gradient of a --bsp round is fresh, so there is nothing to scale; drop "
            "one of them")
