"""The options of checkpoints: how often one is written, how, and which one a run continues."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError, require
from .values import opt


@dataclass
class CheckpointOptions:
    """When checkpoints are written, and which one the run continues."""

    checkpoint_every: int = opt(1, "write a checkpoint every N epochs (0: only at the end)")
    checkpoint_steps: int = opt(0, "also write one every N steps inside an epoch, so a crash "
                                "in a long epoch loses at most N steps (0: at epoch ends only)")
    async_checkpoint: bool = opt(False, "write checkpoints in a background thread: a step "
                                 "waits only while the state is copied to CPU memory, then "
                                 "training goes on while the copy is written (atomically, as "
                                 "always). A save waits for the write before it; a stop, "
                                 "best.pt and the end of the run wait for the last one")
    resume: str | None = opt(None, "resume from this checkpoint file or run folder")
    auto_resume: bool = opt(False, "continue the checkpoint in --run-dir when there is one, "
                            "else start fresh: for jobs that a scheduler restarts (Kubernetes, "
                            "Slurm requeue). Without it or --resume, hvdtrain refuses a --run-dir "
                            "that holds a checkpoint instead of overwriting it")

    def check_checkpoints(self) -> None:
        require(self.checkpoint_every >= 0, "--checkpoint-every", self.checkpoint_every,
                "use 0 (only at the end) or a positive number of epochs")
        require(self.checkpoint_steps >= 0, "--checkpoint-steps", self.checkpoint_steps,
                "use 0 (at epoch ends only) or a positive number of steps")
        if self.auto_resume and not self.run_dir:
            # With --resume A as well: a requeued job continues its own checkpoint in --run-dir
            # once it has written one, and starts from A before that (loop/resume_source.py).
            raise ConfigError("--auto-resume continues the checkpoint in --run-dir: pass "
                              "--run-dir")
