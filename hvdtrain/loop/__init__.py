"""The shared training loop and its components."""

from .hooks import StepHook, TrainingError
from .run_log import EpochResult
from .trainer import Trainer

__all__ = ["EpochResult", "StepHook", "Trainer", "TrainingError"]
