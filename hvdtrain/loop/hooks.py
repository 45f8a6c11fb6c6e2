"""Things that happen after every step, kept out of the loop: the straggler sleep and the
finite-loss guard today; the next features (clipping reports, early stopping) add hooks here."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from ..config import RunConfig, parse_straggler
from ..scheme import Progress


class TrainingError(RuntimeError):
    """Training cannot go on (for example the loss became NaN). The message says where and why."""


@dataclass
class StepResult:
    progress: Progress  # before the step is counted: progress.step steps of the epoch are done
    loss: float         # this worker's mean loss over the batch
    seconds: float      # how long the step took


class StepHook:
    """A hook with no-op defaults; override what you need."""

    def bind_world(self, worker: int, num_workers: int) -> None:
        """Called at the start, and again when an elastic reset changes the workers."""

    def after_step(self, step: StepResult) -> None:
        pass


class Straggler(StepHook):
    """--straggler: the last worker sleeps after each step, to study slow workers."""

    def __init__(self, spec: str):
        self.factor, self.delay = parse_straggler(spec)
        self.enabled = False

    def bind_world(self, worker: int, num_workers: int) -> None:
        self.enabled = (self.factor, self.delay) != (1.0, 0.0) and worker == num_workers - 1

    def after_step(self, step: StepResult) -> None:
        if self.enabled:
            time.sleep((self.factor - 1) * step.seconds + self.delay)


class FiniteLossGuard(StepHook):
    """Stop at the first NaN or infinite loss, before it reaches a checkpoint."""

    def after_step(self, step: StepResult) -> None:
        if not math.isfinite(step.loss):
            p = step.progress
            raise TrainingError(f"loss became {step.loss} at epoch {p.epoch + 1}, step "
                                f"{p.step + 1} (global step {p.global_step + 1}); lower --lr or "
                                "check the data. The last checkpoint is kept unchanged.")


def default_hooks(run: RunConfig) -> list[StepHook]:
    return [Straggler(run.straggler), FiniteLossGuard()]
