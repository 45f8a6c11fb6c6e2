"""--staleness-lr (Zhang et al. 2016, "Staleness-aware Async-SGD"): a gradient's step is
weighted by its staleness."""

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


def check_options(cfg: Any) -> None:
    """--staleness-lr in a config: the combinations it cannot run; the config's validation calls
    it."""
    require(not (cfg.ps.bsp and cfg.ps.staleness_lr), "--staleness-lr", True,
            "every gradient of a --bsp round is fresh, so there is nothing to scale; drop "
            "one of them")
