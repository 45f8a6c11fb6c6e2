"""Optimizers by name, and the learning-rate schedule as a pure function of the step."""

from __future__ import annotations

import math
from typing import Iterable, NamedTuple

import torch

from .config import OptimConfig


def build_optimizer(params: Iterable[torch.nn.Parameter], cfg: OptimConfig) -> torch.optim.Optimizer:
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum,
                               weight_decay=cfg.weight_decay)
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    raise ValueError(f"unknown optimizer {cfg.optimizer!r}")  # config validation prevents this


class LrScale(NamedTuple):
    """A scheme's learning-rate scale where the combined update multiplies its workers' own
    steps: ``workers``, the times one worker's rate it can take (--lr-scaling linear's), and
    ``gain``, DiLoCo's outer step's (lr / (1 - m) once its momentum has built up), which divides
    the rate whatever --lr-scaling says: under none it ran at 7 times the rate meant."""

    workers: float
    gain: float = 1.0


def learning_rate(step: int, total_steps: int, steps_per_epoch: int, cfg: OptimConfig,
                  lr_scale: float | LrScale) -> float:
    """The learning rate at optimizer step ``step`` (0-based).

    The target rate is ``cfg.lr * lr_scale`` where lr_scale is the number of workers under linear
    scaling (Goyal et al. 2017, "Accurate, Large Minibatch SGD"), over an LrScale's gain. During
    warmup the rate ramps linearly from ``cfg.lr`` (one worker's rate) to the target, so large
    effective batches do not diverge early. After warmup it stays constant or follows a cosine
    decay to zero.
    """
    workers, gain = lr_scale if isinstance(lr_scale, LrScale) else (lr_scale, 1.0)
    target = cfg.lr * (workers if cfg.lr_scaling == "linear" else 1.0) / gain
    warmup = int(round(cfg.warmup_epochs * steps_per_epoch))
    if step < warmup:
        return cfg.lr + (target - cfg.lr) * step / warmup
    if cfg.lr_schedule == "cosine":
        span = max(1, total_steps - warmup)
        progress = min(1.0, (step - warmup) / span)
        return target * 0.5 * (1.0 + math.cos(math.pi * progress))
    return target


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
