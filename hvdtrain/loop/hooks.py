"""Things that happen after every step, kept out of the loop: the straggler sleep and the step
timer here, the injected faults (faults/inject.py), and the finite-loss guard of the stopping
component (stopping.py); the next features (clipping reports) add hooks here."""

from __future__ import annotations

import statistics
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from ..config import RunConfig
from ..errors import TrainingError  # noqa: F401 (the loop's error, raised by its hooks)
from ..faults.inject import FaultInjector, record_folder
from ..stragglers import parse_straggler
from ..scheme import Progress
from .step_times import FIELDS as STEP_TIME_FIELDS


@dataclass
class StepResult:
    progress: Progress  # before the step is counted: progress.step steps of the epoch are done
    loss: float         # this worker's mean loss over the batch
    seconds: float      # how long the step computed: its time less its wait for the others
    samples: int = 0    # samples it trained (--balance gives unequal shares); 0: --batch-size
    waited: float = 0.0  # how long it waited for the others (scheme.take_wait_seconds)
    # when the step started (time.perf_counter), so that the step timer, the last hook, can
    # tell the step's whole time, the straggler's sleep included
    started: float = field(default_factory=time.perf_counter)


class StepHook:
    """A hook with no-op defaults; override what you need."""

    def bind_world(self, worker: int, num_workers: int) -> None:
        """Called at the start, and again when an elastic reset changes the workers."""

    def after_step(self, step: StepResult) -> None:
        pass

    def close(self) -> None:
        """Where the run's steps have ended (it finished or stopped)."""


class Straggler(StepHook):
    """--straggler: sleep after a step as long as the straggler model says this worker waits,
    to study slow workers (the model and its draws are in stragglers.StragglerModel). It is
    given the step's compute time, without the wait for the others, so that a factor stretches
    the worker's own work, as a slower device's would."""

    def __init__(self, spec: str, seed: int = 0, batch_size: int = 0):
        self.model = parse_straggler(spec)
        self.seed = seed  # --seed: the random forms draw from (seed, worker, global step)
        self.batch_size = batch_size  # the share a factor's time is given for
        # The compute times of this worker's latest steps of a whole --batch-size: a factor
        # stretches the samples of a smaller share (--balance) at that pace per sample, not at
        # the pace of its own shorter step, whose fixed costs would count twice.
        self.full_steps: deque[float] = deque(maxlen=32)
        self.worker, self.num_workers = 0, 1

    def bind_world(self, worker: int, num_workers: int) -> None:
        self.worker, self.num_workers = worker, num_workers

    def after_step(self, step: StepResult) -> None:
        if self.model.active:
            work = self._work(step.samples)
            if work == 1.0:
                self.full_steps.append(step.seconds)
            full = (statistics.median(self.full_steps) if work != 1.0 and self.full_steps
                    else step.seconds)  # a resumed run whose shares are unequal from the start
            seconds = self.model.delay(self.worker, self.num_workers, step.progress.global_step,
                                       full, self.seed, work)
            if seconds > 0:
                time.sleep(seconds)


    def _work(self, samples: int) -> float:
        """The step's samples over --batch-size: a factor stretches the work done."""
        return samples / self.batch_size if samples and self.batch_size else 1.0


class StepTimer(StepHook):
    """This worker's step times in the epoch under way (step_times.py): the trainer's last
    hook, so that the straggler's delay counts as compute."""

    def __init__(self):
        self.compute: list[float] = []
        self.wait: list[float] = []
        self.samples = 0

    def start_epoch(self) -> None:
        self.compute, self.wait, self.samples = [], [], 0

    def after_step(self, step: StepResult) -> None:
        seconds = time.perf_counter() - step.started
        self.record(seconds - step.waited, step.waited, step.samples)

    def record(self, compute_seconds: float, wait_seconds: float, samples: int) -> None:
        self.compute.append(compute_seconds)
        self.wait.append(wait_seconds)
        self.samples += samples

    def vector(self, worker: int, num_workers: int) -> list[float]:
        """This worker's slots filled, the others' 0: summed across workers, the table."""
        k = len(STEP_TIME_FIELDS)
        out = [0.0] * (k * num_workers)
        if self.compute:
            compute, wait = np.asarray(self.compute), np.asarray(self.wait)
            c10, c50, c90, w50, w90 = (*np.percentile(compute, [10, 50, 90]),
                                       *np.percentile(wait, [50, 90]))
            mine = [len(compute), self.samples, c50, c90, compute.mean(), w50, w90, c10,
                    wait.mean()]
            out[worker * k:(worker + 1) * k] = [float(v) for v in mine]
        return out


def default_hooks(run: RunConfig, plan=None) -> list[StepHook]:
    """The hooks the run's flags turn on (none at all without --straggler or --inject-faults).
    The faults come after the straggler: a slow fault stretches the step's own compute, as the
    straggler's factor does, and the step timer (the trainer's last hook) counts both. ``plan``
    (loop/epoch_plan.py) tells the faults the run's last step, to refuse one past it."""
    straggler = Straggler(run.straggler, run.seed, run.batch_size)
    faults = FaultInjector(run.inject_faults, record_folder(run.run_dir, run.resume),
                           (lambda: plan.total_steps) if plan is not None else None)
    return [hook for hook, on in ((straggler, straggler.model.active), (faults, faults.faults))
            if on]


def acting(hooks: list[StepHook]) -> list[StepHook]:
    """The hooks that do something after a step: the loop calls only these, so that a hook that
    only learns the world (bind_world) costs no call per step."""
    return [hook for hook in hooks if type(hook).after_step is not StepHook.after_step]
