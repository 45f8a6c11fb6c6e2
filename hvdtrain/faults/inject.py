"""The step hook of --inject-faults (in loop/hooks.py's default_hooks): after each step, on the
rank a fault names, it fires the fault once the job's step count reaches the fault's step, or
stretches the step (slow). It has a step hook's methods (loop/hooks.StepHook) without
importing the loop, which imports it."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Callable

from ..checkpoint import checkpoint_path
from ..errors import ConfigError
from . import actions
from .schedule import Fault, check_within, parse_faults


def record_folder(run_dir: str | None, resume: str | None) -> Path | None:
    """Where the fired faults are recorded: the run folder, when it is known before the run
    claims it (--run-dir, or the folder of --resume); a run in a new default folder cannot be
    resumed into the same folder, so it needs no record."""
    if run_dir:
        return Path(run_dir)
    return checkpoint_path(resume).parent if resume else None


class FiredRecord:
    """The record of fired faults in every checkpoint (a component of loop/checkpointer.py),
    so that ``--resume OLD --run-dir NEW`` meets no fault again that fired in OLD's run: at the
    resume the lead adds to NEW's record the checkpoint's lines and those of OLD's folder (the
    faults that fired after that checkpoint, such as the kill that ended OLD's run)."""

    def __init__(self, folder: Callable[[], Path], resumed: str | None):
        self.folder = folder    # the run's folder, as claimed
        self.resumed = resumed  # --resume: a run folder or a checkpoint file

    def state_dict(self) -> list[str]:
        return actions.fired_lines(self.folder())

    def load_state_dict(self, state: list[str] | None) -> None:
        """On the lead, as the run resumes, before any step (a collective start follows)."""
        old = checkpoint_path(self.resumed).parent if self.resumed else None
        actions.add_fired(self.folder(), [*(state or []), *actions.fired_lines(old)])


class FaultInjector:
    def __init__(self, schedule: str, folder: Path | None = None,
                 last_step: Callable[[], int] | None = None):
        self.faults = parse_faults(schedule)
        self.folder = folder
        self.last_step = last_step  # the run's length in global steps, once the world is known
        self.rank = 0
        self.start: int | None = None  # the global step at this process's first step
        self.done: set[Fault] = set()  # fired, or (slow) begun
        self.ended: set[Fault] = set()  # slow faults whose steps are over

    def bind_world(self, worker: int, num_workers: int) -> None:
        # Workers' indices are their world ranks: sync's Horovod rank, async's ranks 0..W-1.
        self.rank = worker
        missing = sorted({f.rank for f in self.faults if f.rank >= num_workers})
        if missing and self.start is None:  # at the start: an elastic job may shrink later
            raise ConfigError(
                f"--inject-faults: rank {missing[0]} is not a training process: this job has "
                f"{num_workers} (ranks 0..{num_workers - 1}; async servers come after the "
                "workers, and a server has no step to fire at); name a rank below "
                f"{num_workers}")
        if self.last_step is not None and self.start is None:
            try:
                check_within(self.faults, self.last_step())
            except ValueError as e:
                raise ConfigError(str(e)) from None

    def close(self) -> None:
        """Nothing to end: a fault that did not fire by the run's end never fires."""

    def after_step(self, step) -> None:
        if not self.faults:
            return
        before = step.progress.global_step  # steps done before this one
        if self.start is None:
            self.start = before
        for fault in self.faults:
            if fault.rank != self.rank:
                continue
            if fault.kind == "slow":
                if fault.step <= before + 1 <= fault.last_step:
                    self._announce(fault, "slows this rank's steps", self.done)
                    time.sleep((fault.factor - 1) * step.seconds)
                elif fault in self.done:  # its steps are over (a job's steps may skip some)
                    self._announce(fault, "is over", self.ended)
            elif self._due(fault, before):
                self.done.add(fault)
                if actions.already_fired(self.folder, fault):
                    print(f"hvdtrain: injected fault {fault.text()} not fired again: "
                          f"{self.folder / actions.RECORD} says it fired in this run "
                          "folder before", file=sys.stderr, flush=True)
                    continue
                actions.record_fired(self.folder, fault)
                actions.fire(fault)

    def _announce(self, fault: Fault, what: str, said: set[Fault]) -> None:
        """Once: a slow fault leaves no other trace than longer steps."""
        if fault not in said:
            said.add(fault)
            print(f"hvdtrain: injected fault {fault.text()} {what}", file=sys.stderr, flush=True)

    def _due(self, fault: Fault, before: int) -> bool:
        """This step took the job to the fault's step or past it (async: a worker's steps skip
        the job's steps that the others train), and this process started before it (a resume
        from a checkpoint at or past the step does not fire it)."""
        return (fault not in self.done and before + 1 >= fault.step
                and self.start is not None and self.start < fault.step)
