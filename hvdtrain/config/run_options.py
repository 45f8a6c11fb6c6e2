"""The options of the loop (how long, how big, where the results go), and the run section
that gathers them with evaluation, checkpoints, logs, the device and the study settings, each
declared and checked in its own module."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import require
from .checkpoint_options import CheckpointOptions
from .device_options import DeviceOptions
from .eval_options import EvalOptions
from .log_options import LogOptions
from .study_options import StudyOptions
from .values import MAX_SEED, SEED_RANGE, check_writable_folder, opt


@dataclass
class LoopOptions:
    """How long, how big, where the results go."""

    mode: str = opt("sync", "update scheme: sync (Horovod allreduce) or async (parameter "
                    "server over MPI; launch with mpirun)", choices=("sync", "async"))
    epochs: int = opt(20, "passes over the training split")
    batch_size: int = opt(32, "samples per worker per optimizer step; the global batch is "
                          "this times the number of workers")
    seed: int = opt(0, "seed of model initialisation and data shuffling")
    max_steps_per_epoch: int = opt(0, "stop each epoch after this many steps (0: no limit); "
                                   "for benchmarks and quick checks")
    run_dir: str | None = opt(None, "folder for the metrics log and checkpoints "
                              "(default: runs/<time>-<mode>-<dataset>-<model>)")

    def check_loop(self) -> None:
        require(self.epochs >= 1, "--epochs", self.epochs,
                "train for at least one epoch, e.g. --epochs 10")
        require(self.batch_size >= 1, "--batch-size", self.batch_size,
                "use a positive per-worker batch, e.g. --batch-size 32")
        require(self.max_steps_per_epoch >= 0, "--max-steps-per-epoch", self.max_steps_per_epoch,
                "use 0 for no limit or a positive step count")
        require(0 <= self.seed <= MAX_SEED, "--seed", self.seed, SEED_RANGE)


# The bases in reverse order of their options: the loop's come first (in --help too).
@dataclass
class RunConfig(StudyOptions, DeviceOptions, LogOptions, CheckpointOptions, EvalOptions,
                LoopOptions):
    """The run: the loop, evaluation, checkpoints, logs, the device and study settings."""

    def validate(self) -> None:
        self.check_loop()
        self.check_eval()
        self.check_checkpoints()
        self.check_logs()
        self.check_device()
        self.check_study()
        if self.run_dir:  # last: it looks at the file system
            check_writable_folder(self.run_dir, "--run-dir")
