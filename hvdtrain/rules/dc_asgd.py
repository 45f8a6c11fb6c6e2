"""Delay compensation (--dc-lambda, DC-ASGD, Zheng et al. 2017): a stale gradient is corrected
towards the gradient at the server's current parameters before it is applied."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import require
from .apply import Adjustment


def delay_compensate(grad: np.ndarray, lam: float, now: np.ndarray, pulled: np.ndarray) -> None:
    """DC-ASGD (Zheng et al. 2017), in place: g += lambda * g * g * (w_now - w_pulled).

    A gradient computed at the parameters the worker pulled (w_pulled) is corrected towards the
    gradient at the server's current parameters (w_now), using g*g as a cheap diagonal
    approximation of the Hessian."""
    grad += lam * grad * grad * (now - pulled)


class DelayCompensation(Adjustment):
    rewrites_gradient = True

    def __init__(self, lam: float):
        self.lam = lam
        self.pulled: dict[int, np.ndarray] = {}  # the parameters each worker last received

    def received(self, worker: int, params: np.ndarray) -> None:
        backup = self.pulled.setdefault(worker, np.empty_like(params))
        backup[:] = params

    def correct(self, worker: int, grad: np.ndarray, now: np.ndarray, a: int, b: int) -> None:
        backup = self.pulled.get(worker)
        if backup is not None:
            delay_compensate(grad, self.lam, now, backup[a:b])


def check_options(cfg: Any) -> None:
    """--dc-lambda in a config: the combinations it cannot run; the config's validation calls it."""
    require(not (cfg.ps.bsp and cfg.ps.dc_lambda), "--dc-lambda", cfg.ps.dc_lambda,
            "delay compensation has nothing to correct under --bsp; drop one of them")
