"""What a simulated plan's budget gives sync, said before the plan runs.

The simulator cannot know in advance how many steps a workload needs to reach its target, but a
plan can say what it gives: the README's 64-worker example once spent 268 s to show sync near
chance after 60 steps of a global batch of 256 on the CNN (at sync's rate of 0.4 one seed of two
diverged; the digits MLP needed about 65 such steps to reach 95%). So every simulated plan
prints sync's steps and learning rate before it runs, and a budget under MIN_SYNC_STEPS is
named as short, with the fix."""

from __future__ import annotations

import math
from dataclasses import dataclass

from .target_metric import Target

MIN_SYNC_STEPS = 100  # fewer global steps: the plan warns that its target may be out of reach


@dataclass(frozen=True)
class SyncBudget:
    """Sync's share of a plan: ``epochs`` of ``steps_per_epoch`` global steps of ``global_batch``
    samples at the learning rate ``rate`` (the workers' --lr times N under linear scaling)."""

    epochs: int
    steps_per_epoch: int
    global_batch: int
    rate: float

    @property
    def steps(self) -> int:
        return self.epochs * self.steps_per_epoch

    def describe(self) -> str:
        return (f"sync gets {self.steps} optimizer steps ({self.epochs} epochs of "
                f"{self.steps_per_epoch} steps of {self.global_batch} samples) at a learning "
                f"rate of {self.rate:.4g}")

    def warning(self, target) -> str | None:
        """A line saying the ``target`` (a Target, or a test accuracy) may be out of reach,
        with the fix; None for a budget that leaves room."""
        if self.steps >= MIN_SYNC_STEPS:
            return None
        epochs = math.ceil(MIN_SYNC_STEPS / max(1, self.steps_per_epoch))
        return (f"warning: {self.describe()}: a budget under {MIN_SYNC_STEPS} steps is short, "
                f"and modes that do not reach {Target.of(target).short()} within it show no "
                "time to target; "
                f"raise --epochs to {epochs} or more, lower --global-batch, or lower --lr if "
                "the rate is high for the model")


def sync_budget(train_args, workers: int, under=None) -> SyncBudget:
    """The budget that ``hvdtrain train TRAIN_ARGS`` on ``workers`` workers gives sync (loads
    the training data to count its steps; ConfigError or DataError for flags that cannot work).
    ``under``: the planned Mode whose Config reads the flags (sync's by default): the steps
    and the rate do not depend on it, but a flag that suits only some modes is refused under
    the others."""
    import torch

    from ..workload import workload_from_config
    from .sim.flat_model import config_from_train_args

    cfg = config_from_train_args(train_args, under.config_options() if under else {})
    run = cfg.run
    workload = workload_from_config(cfg)
    try:
        workload.bind(torch.device("cpu"), cfg)
        per_epoch = workload.train.steps_per_epoch(run.batch_size, workers)
    finally:
        workload.close()
    if run.max_steps_per_epoch:
        per_epoch = min(per_epoch, run.max_steps_per_epoch)
    scale = workers if cfg.optim.lr_scaling == "linear" else 1
    return SyncBudget(run.epochs, per_epoch, run.batch_size * workers, cfg.optim.lr * scale)
