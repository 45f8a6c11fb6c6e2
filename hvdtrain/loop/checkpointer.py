"""The run folder's checkpoint: whether this run continues one, reading it on the right
processes, and when to write the next (every N epochs, every N steps, at the end).

A fresh run never overwrites a checkpoint: a --run-dir that holds one is an error unless the run
continues it (--resume, --auto-resume). Worker 0 decides and reads; the scheme tells the others
(see UpdateScheme.main_decides), so a bad file stops every rank with the same message.
"""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

from .. import checkpoint
from ..config import Config
from ..scheme import Progress, UpdateScheme
from .hooks import TrainingError


def default_run_dir(cfg: Config, data_name: str, model_name: str) -> Path:
    run = cfg.run
    if run.run_dir:
        return Path(run.run_dir)
    if run.resume:  # keep writing into the run being resumed
        return checkpoint.checkpoint_path(run.resume).parent
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    label = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{run.mode}-{data_name}-{model_name}")[:80]
    return Path("runs") / f"{stamp}-{label}"


class Checkpointer:
    def __init__(self, cfg: Config, scheme: UpdateScheme, run_dir: Path,
                 identity: Callable[[], dict[str, Any]], model_state: Callable[[], dict]):
        self.cfg = cfg
        self.run = cfg.run
        self.scheme = scheme
        self.run_dir = run_dir
        self.identity = identity        # what must match for a checkpoint to load into this run
        self.model_state = model_state  # this run's model.state_dict(), to name a mismatch
        self.resumed_from: str | None = None
        # Elastic training starts processes during the run (an added host); they find the
        # checkpoint this run wrote and must continue the run, so elastic implies auto-resume.
        self.auto_resume = cfg.run.auto_resume or cfg.sync.elastic

    @property
    def path(self) -> Path:
        return self.run_dir / checkpoint.CHECKPOINT_NAME

    def _is_main(self) -> bool:
        return self.scheme.workers()[0] == 0

    # --- resume ---------------------------------------------------------------------------------
    def restore(self, num_workers: int) -> tuple[dict[str, Any] | None, Progress]:
        """(the checkpoint's state where it was read, else None; where training starts)."""
        if self._is_main() and self.run_dir.is_dir():
            for tmp in checkpoint.remove_stale_temporaries(self.run_dir):
                print(f"hvdtrain: removed {tmp}, left by a process killed while it wrote a "
                      "checkpoint", flush=True)
        source = self._resume_source()
        self.resumed_from = source
        if source is None:
            return None, Progress(workers=num_workers)
        state: dict[str, Any] | None = None

        def read() -> dict[str, Any]:
            nonlocal state
            try:
                state = checkpoint.load(source)
                identity = self.identity()
                # The parameter count last: the state check names the first tensor that differs.
                checkpoint.check_compatible(
                    state, {k: v for k, v in identity.items() if k != "num_parameters"}, source)
                checkpoint.check_model_state(state["model"], self.model_state(), source)
                checkpoint.check_compatible(state, identity, source)
            except checkpoint.CheckpointError as e:
                return {"error": str(e)}
            return {"progress": Progress(state["epoch"], state.get("step", 0),
                                         state["global_step"], state["num_workers"])}

        answer = self.scheme.main_decides(read)
        if "error" in answer:
            raise checkpoint.CheckpointError(answer["error"])
        progress = answer["progress"]
        if progress.workers != num_workers and self._is_main():
            print(f"warning: checkpoint was written with {progress.workers} workers, this run "
                  f"has {num_workers}; the data order differs from an uninterrupted run",
                  flush=True)
        return state, progress

    def _resume_source(self) -> str | None:
        """--resume, or the run folder's checkpoint under --auto-resume; None for a fresh run."""
        run = self.run
        if run.resume:
            return run.resume
        if not run.run_dir:
            return None

        def decide() -> dict[str, str] | None:
            if not self.path.exists():
                return None
            if self.auto_resume:
                return {"resume": run.run_dir}
            return {"error": (
                f"{run.run_dir} already holds a checkpoint ({self.path}) and this run would "
                f"overwrite it; continue that run with --resume {run.run_dir} (or "
                f"--auto-resume), or pass another --run-dir for a new run")}

        decision = self.scheme.main_decides(decide)
        if decision and "error" in decision:
            raise checkpoint.CheckpointError(decision["error"])
        if decision and self._is_main():
            print(f"hvdtrain: continuing the checkpoint in {run.run_dir}", flush=True)
        return decision["resume"] if decision else None

    # --- cadence --------------------------------------------------------------------------------
    def step_done(self, progress: Progress, steps_per_epoch: int) -> None:
        every = self.run.checkpoint_steps
        # The epoch's last step is left to epoch_done, which writes its own checkpoint.
        if every and progress.global_step % every == 0 and progress.step < steps_per_epoch:
            self.save(progress)

    def epoch_done(self, progress: Progress) -> None:
        every = self.run.checkpoint_every
        if progress.epoch == self.run.epochs or (every and progress.epoch % every == 0):
            self.save(progress)

    def save(self, progress: Progress) -> Path | None:
        """A checkpoint after ``progress.epoch`` whole epochs and ``progress.step`` steps of the
        next one. Collective (the async scheme asks the servers); worker 0 writes it."""
        state = self.scheme.state_dict()
        if not self._is_main():
            return None
        try:
            return checkpoint.save_atomic(
                {**state, "identity": self.identity(), "epoch": progress.epoch,
                 "step": progress.step, "global_step": progress.global_step,
                 "num_workers": progress.workers, "config": self.cfg.to_dict()}, self.path)
        except checkpoint.CheckpointWriteError as e:  # full disk, quota, lost mount
            kept = (f"the previous checkpoint {self.path} is intact; free space and continue "
                    f"with --resume {self.run_dir}" if self.path.exists()
                    else "no earlier checkpoint exists")
            where = (f"epoch {progress.epoch}" if not progress.step
                     else f"epoch {progress.epoch + 1}, step {progress.step}")
            raise TrainingError(f"could not write the {where} checkpoint to {self.path} "
                                f"({e}); {kept}") from None
