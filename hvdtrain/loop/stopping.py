"""Whether a run stops before its epochs are done: one component, one verdict.

Four things can end a run early, and each decides through this object:

    signal           SIGTERM/SIGUSR1/SIGINT (preemption.py): a step checkpoint, exit 75 (requeue)
    target           --stop-at reached (target.py): exit 0
    early stop       --early-stop-patience ran out (best.py): after the epoch, exit 0
    non-finite loss  a NaN or infinite loss: the TrainingError that ends the run, no checkpoint

The trainer asks it after every step (decide_at_step: the stop agreement of the update scheme,
so that every worker stops at a step they all agree on; sync workers vote every few steps, at
steps they agree on, stop_cadence.py) and after every epoch
(decide_at_epoch_end); the loss guard runs as a step hook. The verdict is what code outside
the loop reads (launch.Finished, the CLI's exit code and closing line, api.FitResult).
"""

from __future__ import annotations

import math
from pathlib import Path
from collections.abc import Callable
from dataclasses import dataclass

from ..config import RunConfig
from ..rules.staleness_lr import LOWER_LR
from ..scheme import Progress, UpdateScheme
from .best import BestTracker
from .checkpointer import Checkpointer
from .clock import TrainingClock
from .divergence import DivergenceWatch
from .hooks import StepHook, StepResult, TrainingError
from .preemption import StopSignals, process_signals
from .run_log import RunLog
from .stop_cadence import StopCadence
from .target import TargetStop

SIGNAL = "signal"
TARGET = "target"
EARLY_STOP = "early stop"
NON_FINITE_LOSS = "non-finite loss"


@dataclass(frozen=True)
class Verdict:
    """Verdict() goes on. Picklable: worker 0's is given to every rank (launch.py)."""

    why: str | None = None  # SIGNAL, TARGET, EARLY_STOP, NON_FINITE_LOSS; None: no early stop
    detail: str = ""        # the signal's name, the target as reached, the early-stop reason...
    at_step: bool = False   # stop after this step (a step checkpoint), else after this epoch
    # The workers agreed on it after a step (scheme.group.agree_to_stop): async workers may stop
    # at different steps, so the log writes only the lines every worker added its share to.
    agreed: bool = False
    clock: tuple[float, float] = (0.0, 0.0)  # (wall, training) seconds when a target stopped it
    last_epoch: bool = False  # a target reached by the last epoch's evaluation: no early stop

    @property
    def ran_to_end(self) -> bool:
        """The scheme's end_of_training has run: the workers agreed on this stop through it,
        or the last epoch's evaluation came after it (Trainer._epochs)."""
        return self.agreed or self.last_epoch

    @property
    def stop(self) -> bool:
        return self.why is not None

    @property
    def requeue(self) -> bool:
        """Preempted: the job exits EXIT_PREEMPTED (75) to be requeued; a target or an early
        stop ends it for good (exit 0), and a non-finite loss raised a TrainingError."""
        return self.why == SIGNAL

    @property
    def preempted(self) -> str | None:
        """The stop signal that ended training early, or None."""
        return self.detail if self.why == SIGNAL else None

    @property
    def target(self) -> str | None:
        """The --stop-at target as it was reached, where it ended the run, or None."""
        return self.detail if self.why == TARGET else None


def non_finite_loss(loss: float, p: Progress, hint: str) -> str:
    """Why a run whose loss at the step at ``p`` is NaN or infinite ends there, and ``hint``,
    what to change (rules/staleness_lr.py divergence_hint): the loss guard's message
    (Stopping.after_step, and the simulator's virtual workers)."""
    return (f"loss became {loss} at epoch {p.epoch + 1}, step {p.step + 1} (global step "
            f"{p.global_step + 1}); {hint}")


class Stopping(StepHook):
    def __init__(self, run: RunConfig, scheme: UpdateScheme, checkpointer: Checkpointer,
                 best: BestTracker, target: TargetStop, clock: TrainingClock,
                 signals: StopSignals = process_signals,
                 advice: Callable[[int], str] = lambda num_workers: LOWER_LR):
        self.epochs = run.epochs
        # what to change where the loss becomes NaN, given the number of workers then
        # (rules/staleness_lr.py divergence_hint)
        self.advice = advice
        self.divergence = DivergenceWatch()
        self.fresh = True  # until the first step of a run that does not resume
        self.scheme, self.checkpointer = scheme, checkpointer
        self.best, self.target, self.clock = best, target, clock
        self.signals = signals  # installed by launch.run; unset elsewhere (tests)
        self.verdict = Verdict()
        self.cadence = StopCadence()  # at which global steps the workers vote
        checkpointer.components["finished"] = self  # a target reached ends the run for good

    # --- checkpoint state -----------------------------------------------------------------------
    def state_dict(self) -> dict[str, str] | None:
        """In the checkpoint of a run that reached its --stop-at target: which target, and how,
        so that the same command run again (--auto-resume, a requeue) says it is finished
        instead of training on (Checkpointer.finished_target)."""
        if self.verdict.why != TARGET:
            return None
        return {"target": self.target.text, "reached": self.verdict.detail}

    def load_state_dict(self, state: dict[str, str] | None) -> None:
        """Read by the checkpointer on every worker (restore), not here."""

    # --- the loop's questions -------------------------------------------------------------------
    def after_step(self, step: StepResult) -> None:
        """The loss guard, a step hook: a NaN or infinite loss ends the run here, before the
        step reaches a checkpoint."""
        if math.isfinite(step.loss):  # every step: the advice is worded only for a NaN
            if self.fresh:  # the untrained model's loss: the divergence warning's scale
                self.fresh, self.divergence.untrained = False, step.loss
            return
        why = non_finite_loss(step.loss, step.progress, self._advice())
        kept = ("The last checkpoint is kept unchanged" if Path(self.checkpointer.path).exists()
                else "No checkpoint was written before it")
        self.verdict = Verdict(NON_FINITE_LOSS, f"{why}. {kept}.", at_step=True)
        raise TrainingError(self.verdict.detail)

    def evaluated(self, test: tuple[float, dict[str, float | None]] | None,
                  global_step: int) -> None:
        """After any evaluation: whether it reached the --stop-at target (TargetStop), and
        whether its test loss says training diverges (the lead warns, with what to change)."""
        self.target.evaluated(test, global_step)
        warning = self.divergence.evaluated(test, global_step)
        if warning and self.scheme.group.leads():
            print(f"{warning}; {self._advice()}", flush=True)

    def close(self) -> None:
        """The run's end (a hook's close): the lead warns where the model did not learn, or
        lost what it learned."""
        ended = self.divergence.ended()
        if ended is None or not self.scheme.group.leads():
            return
        warning, never_learned = ended
        if never_learned:
            told = ", or raise --lr if the training loss did not fall either"
        elif self.best.metric is not None:
            told = f"; the best evaluation's model is in {self.best.path}"
        else:
            told = "; --keep-best test_loss keeps the best evaluation's model as best.pt"
        print(f"{warning}; {self._advice()}{told}", flush=True)

    def _advice(self) -> str:
        """What to change, for the number of workers training now."""
        return self.advice(self.scheme.group.workers()[1])

    def decide_at_step(self, global_step: int | None = None) -> Verdict:
        """After every step, collective: stop here if any worker has a stop signal or saw the
        target reached. Given the global step just reached, the workers vote only at the steps
        the cadence names (stop_cadence.py), or at once where a target was reached."""
        reached = self.target.reached is not None
        if reached and self._everyone_judged():
            # sync: every rank scored the same sums at this step, so all stop here, without
            # the vote, which reads its sum a vote later: the checkpoint then held the model
            # of a step after the one that reached the target
            self._agreed(at_step=True)
            return self.verdict
        if global_step is not None and not (reached or self.cadence.due(global_step)):
            return self.verdict
        if self.scheme.group.agree_to_stop(self.signals.received is not None or reached):
            self._agreed(at_step=True)
        if global_step is not None:
            self.cadence.voted(global_step, self.scheme.group.vote_gap_s
                               if self.scheme.group.steps_agree else 0.0)
        return self.verdict

    def before_last_evaluation(self) -> None:
        """Async: a worker that finished its epochs learns whether another one was stopped
        (UpdateScheme.end_of_training); if so, it stops for the same reason as far as it can
        tell. Asked before the last evaluation, which stopped nobody."""
        if self.scheme.end_of_training():
            self._agreed(at_step=False)

    def decide_before_epochs(self) -> Verdict:
        """Where the epochs start (again, after an elastic reset): a resumed run whose patience
        ran out stops at once."""
        self.cadence.reset()  # an elastic reset: every worker votes again from the next step
        self.signals.started = True  # a stop signal's message says so from now on
        if self.checkpointer.resumed_from is not None:
            self.fresh = False  # a trained model's loss is no scale for the divergence warning
        reached = self.checkpointer.finished_target
        if not self.verdict.stop and reached is not None:
            self.target.reached = reached
            self.verdict = Verdict(TARGET, f"{reached}, before this resume; nothing is left to "
                                   "train", clock=self.clock.now())
        elif not self.verdict.stop and self.best.stop_reason:
            self.verdict = Verdict(EARLY_STOP, self.best.stop_reason)
        return self.verdict

    def decide_at_epoch_end(self, progress: Progress, num_workers: int) -> Verdict:
        """After an epoch and its evaluation. A target stops every worker here without a word
        where every worker scored the evaluation (sync: all received the same sums); where
        worker 0 judged alone (async), it tells the others through the next step's agreement.
        A target or patience reached by the last epoch is no early stop: the run ends there
        anyway, but a target reached there is still said (the stop line, the checkpoint that
        a resume with more epochs finds finished), by whoever judged it: after the last epoch
        no other worker is left to tell. A target wins over patience that ran out at the same
        evaluation."""
        if self.verdict.stop:
            return self.verdict
        last_epoch = progress.epoch >= self.epochs
        if self.target.reached is not None and (self._everyone_judged(num_workers) or
                                                last_epoch):
            self.verdict = Verdict(TARGET, self.target.reached, clock=self.clock.now(),
                                   last_epoch=last_epoch)
        elif self.best.stop_reason:
            self.verdict = Verdict(EARLY_STOP, self.best.stop_reason)
        return self.verdict

    def _everyone_judged(self, num_workers: int | None = None) -> bool:
        """Whether every worker scored the evaluation (sync: all received the same sums)."""
        partition = self.scheme.group.eval_partition
        workers = self.scheme.group.workers()[1] if num_workers is None else num_workers
        return partition is not None and partition[1] == workers

    def _agreed(self, at_step: bool) -> None:
        """Why this process stops: its own stop signal, else the target that it saw reached,
        else another worker's signal (or that worker's target: async workers that did not
        evaluate cannot tell). A signal wins, so that a preempted job is requeued (exit 75); a
        target ends it for good (exit 0). World rank 0's verdict is the job's (launch.py)."""
        if self.signals.received is None and self.target.reached is not None:
            self.verdict = Verdict(TARGET, self.target.reached, at_step, agreed=True,
                                   clock=self.clock.now())
        else:
            self.verdict = Verdict(SIGNAL, self.signals.received or
                                   "a stop signal on another worker", at_step, agreed=True)

    # --- what the run shows -----------------------------------------------------------------------
    def report(self, progress: Progress, log: RunLog) -> None:
        """The "stop" line of the log, and (main process) a line that says what happened,
        once the last checkpoint is on disk (--async-checkpoint: its write may be in flight)."""
        self.checkpointer.finish_writes()
        reports = {SIGNAL: self._report_preemption, TARGET: self._report_target,
                   EARLY_STOP: self._report_early_stop}
        if self.verdict.why in reports:
            reports[self.verdict.why](progress, log)

    def _report_preemption(self, p: Progress, log: RunLog) -> None:
        where = f"epoch {p.epoch + 1}, step {p.step}" if p.step else f"the end of epoch {p.epoch}"
        # ``step`` is the global step on every stop line, as on the epoch lines
        log.write("stop", epoch=p.epoch + (1 if p.step else 0), step=p.global_step,
                  step_in_epoch=p.step, global_step=p.global_step,
                  reason=f"preempted: {self.verdict.detail}")
        if log.is_main:
            print(f"hvdtrain: stopped by {self.verdict.detail} after {where} (global step "
                  f"{p.global_step}); checkpoint {self.checkpointer.path}; continue with "
                  f"--auto-resume --run-dir {self.checkpointer.run_dir}", flush=True)

    def _report_target(self, p: Progress, log: RunLog) -> None:
        wall, train = self.verdict.clock
        # Stamped as the eval lines are (wall time, and training time without the evaluations).
        log.write("stop", epoch=p.epoch + (1 if p.step else 0), step=p.global_step,
                  global_step=p.global_step, wall_seconds=round(wall, 4),
                  train_seconds=round(train, 4),
                  target=self.target.text, reason=f"reached the target: {self.verdict.detail}")
        if log.is_main:
            print(f"hvdtrain: reached the target {self.target.text} ({self.verdict.detail}); "
                  f"stopped after global step {p.global_step}; checkpoint "
                  f"{self.checkpointer.path}", flush=True)

    def _report_early_stop(self, p: Progress, log: RunLog) -> None:
        reason = f"stopped early after epoch {p.epoch}: {self.verdict.detail}"
        log.write("stop", epoch=p.epoch, step=p.global_step, global_step=p.global_step,
                  reason=reason)
        if log.is_main:
            where = (f"; the best model is in {self.best.path}" if self.best.best is not None
                     else "")  # no evaluation gave a number: no best.pt was written
            print(f"hvdtrain: {reason}{where}", flush=True)
