"""The shared training loop. It knows nothing of Horovod or MPI: the update scheme behind it
(scheme.UpdateScheme) does the communicating, and the components below decide their own timing.

    plan          which batches this worker trains on, from which step (epoch_plan.py)
    checkpointer  resume decisions and the checkpoint cadence (checkpointer.py)
    evaluator     scoring the test split, timed on the run's clocks (evaluator.py, clock.py)
    log           progress bar, summary lines, the log's lines to its sinks (run_log.py, sinks.py)
    lead          who evaluates, checkpoints and writes the log, and its hand-over (lead.py)
    hooks         after every step: straggler sleep, the loss guard, step times (hooks.py)
    best          after every evaluation: best.pt, and whether patience ran out (best.py)
    stopping      after every step and epoch: one verdict on a stop signal (preemption.py), the
                  --stop-at target (target.py), early stopping, or a non-finite loss (stopping.py)
    watchdog      --stall-timeout-s: end a job that stopped making progress (watchdog.py)
"""

from __future__ import annotations

import time
from functools import partial

from ..config import Config, RunConfig
from ..replica import Replica
from ..rules.staleness_lr import divergence_hint
from ..runtime import Runtime
from ..scheme import Progress, UpdateScheme
from ..workload import Workload
from .best import BestTracker
from .checkpointer import Checkpointer, default_run_dir, run_identity
from .clock import TrainingClock
from .epoch_plan import EpochPlan
from .evaluator import Evaluator
from .hooks import StepResult, StepTimer, acting, default_hooks
from .lead import take_lead
from .profiling import profile_window
from .run_log import EpochResult, RunLog, run_header
from .sinks import build_sinks
from .slow_ranks import SlowRankCheck
from .stopping import Stopping, Verdict
from .target import TargetStop
from .watchdog import StallWatchdog


class Trainer:
    def __init__(self, cfg: Config, runtime: Runtime, scheme: UpdateScheme, workload: Workload,
                 replica: Replica):
        self.cfg, self.runtime, self.scheme = cfg, runtime, scheme
        self.workload, self.replica = workload, replica
        run, names, has_test = cfg.run, sorted(replica.objective.metrics), workload.test is not None
        self.plan = EpochPlan(run, workload.train)
        self.evaluator = Evaluator(run, workload.test, scheme, names)
        self.run_dir = default_run_dir(cfg, workload.data_name, workload.name)
        self.checkpointer = Checkpointer(cfg, scheme, self.run_dir, partial(
            run_identity, cfg, workload, replica.model), replica.model.state_dict)
        self.best = BestTracker(run, scheme, self.checkpointer, names, has_test)
        self.clock = TrainingClock()
        self.stopping = Stopping(run, scheme, self.checkpointer, self.best, TargetStop(
            run, names, has_test), self.clock, advice=partial(divergence_hint, cfg))
        self.step_timer, slow_ranks = StepTimer(), SlowRankCheck(cfg, runtime.rank)
        self.hooks = [*default_hooks(run, self.plan), self.stopping, slow_ranks, self.step_timer,
                      *profile_window(run, lambda: self.run_dir, runtime)]  # last: untimed
        self._bind_world()
        self.log = build_log(run, scheme, names, self.is_main, self.step_timer, slow_ranks,
                             self.clock)
        self.history: list[EpochResult] = self.log.history  # the epochs' results, in order
        self.checkpointer.components["log"] = self.log  # its epoch lines still pending
        self.progress = Progress(workers=self.num_workers)
        # Started by fit(); until then (a benchmark driving _train_epoch) its beats do nothing.
        self.watchdog = StallWatchdog(scheme.group.stall_timeout_s, runtime.rank, runtime.size)
        scheme.group.when_leading(partial(take_lead, self))  # async: the lead was lost (lead.py)

    def _bind_world(self) -> None:
        """What depends on this worker's rank and the number of workers; again after a reset."""
        self.worker_rank, self.num_workers = self.scheme.group.workers()
        self.is_main = self.scheme.group.leads()  # elastic: another process, after rank 0 died
        self.plan.bind_world(self.worker_rank, self.num_workers, self.scheme.group)
        for hook in self.hooks:
            hook.bind_world(self.worker_rank, self.num_workers)
        self.step_hooks = acting(self.hooks)  # those called after each step (hooks may be added)

    # --- the run --------------------------------------------------------------------------------
    def fit(self) -> list[EpochResult]:
        self.scheme.attach(self.replica)
        self.run_dir = self.checkpointer.claim()  # locked until the run ends
        self.watchdog.start(self.run_dir, self.log.failed)
        try:
            self._fit()
        finally:
            self.watchdog.stop()
            self.checkpointer.release()
        return self.history

    def _fit(self) -> None:
        self.plan.ask_for_feed(self.scheme)
        state, self.progress = self.checkpointer.restore(self.num_workers)
        resuming = self.checkpointer.resumed_from is not None
        header = run_header(  # on every process, before the start: see run_header
            self.cfg, self.runtime, self.workload, self.replica, self.num_workers,
            self.plan.steps_per_epoch, self.progress)
        self.scheme.start(state, resuming=resuming)
        self.log.open(self.run_dir, resuming, header, self.progress.global_step, announce=True)
        self.clock.start()
        try:
            self.scheme.run(self._epochs, self.progress)
            for hook in self.hooks:
                hook.close()
            summary = self.scheme.close()
            if summary:
                self.log.write("scheme", **summary)
        finally:
            self.log.close()

    def _epochs(self) -> None:
        """The epochs from self.progress on. An elastic scheme may run this again after a reset,
        with the progress of its last commit and a new set of workers."""
        self._bind_world()
        self.log.follow_main(self.is_main, self.run_dir, self.progress.global_step)
        self.plan.rescale(self.progress)
        self.best.start(self.progress)
        verdict = self.stopping.decide_before_epochs()
        while self.progress.epoch < self.cfg.run.epochs and not verdict.stop:
            verdict = self._train_epoch()
            if verdict.at_step:
                break  # _stop_at_step wrote the checkpoint
            last = verdict.stop and not verdict.ran_to_end  # an early stop: the scheme is told
            if last:
                self.scheme.end_of_training()  # the final checkpoint sees every worker's update
            self.checkpointer.epoch_done(self.progress, last=last)
            self.scheme.epoch_done(self.progress)
        self.log.finish(stopped_unevenly=verdict.agreed)
        self.stopping.report(self.progress, self.log)

    def _train_epoch(self) -> Verdict:
        p, epoch = self.progress, self.progress.epoch
        batches = self.plan.batches(p)  # seeds torch; the rest of the epoch after a resume
        self.watchdog.stepped(p.global_step)  # past the last epoch's end: "in step N+1" again
        self.replica.model.train()
        self.log.start_epoch(epoch, self.plan.steps_per_epoch - p.step, p.step)
        rate = partial(self.plan.learning_rate, p, self.cfg.optim)
        lr = rate(self.scheme.lr_scale)  # for the epoch line, also when no step is left (a resume)
        for x, y in batches:
            lr = rate(self.scheme.lr_scale)
            if self._step(x, y, lr).at_step:
                self._stop_at_step()
                return self.stopping.verdict
        return self._end_epoch(lr)

    def _step(self, x, y, lr: float) -> Verdict:
        p, epoch = self.progress, self.progress.epoch
        started = time.perf_counter()
        stats = self.scheme.step(x, y, lr)
        loss = stats.mean_loss()
        waited = self.scheme.take_wait_seconds()
        done = StepResult(p, loss, time.perf_counter() - started - waited, stats.count, waited,
                          started)
        for hook in self.step_hooks:  # the last, the step timer, counts the straggler's delay
            hook.after_step(done)
        before = self.plan.advance(p)  # the global step before this one
        self.scheme.step_done(p)
        self.checkpointer.step_done(before, p, self.plan.steps_per_epoch)
        self.log.step(epoch, p.global_step, lr, loss, stats)
        if self.evaluator.due_at_step(before, p.global_step,
                                      p.step == self.plan.steps_per_epoch, epoch):
            test, wall_seconds, train_seconds = self.evaluator.timed(self.clock)
            self.log.evaluation(epoch, p.global_step, test, wall_seconds, train_seconds)
            self.stopping.evaluated(test, p.global_step)
        self.watchdog.stepped(p.global_step)
        return self.stopping.decide_at_step(p.global_step)

    def _end_epoch(self, lr: float) -> Verdict:
        p, epoch = self.progress, self.progress.epoch
        self.watchdog.beat("at the end of an epoch (evaluation, checkpoint)")
        if epoch + 1 == self.cfg.run.epochs:
            self.stopping.before_last_evaluation()  # the last evaluation sees every update
        due = self.evaluator.due(epoch)
        test, wall_seconds, train_seconds = (self.evaluator.timed(self.clock, closing=True)
                                             if due else (None, *self.clock.now()))
        self.plan.finish_epoch(p)
        # rounded as the line rounds wall_seconds (1 ms): train <= wall holds in the log too
        self.log.end_epoch(epoch, p.global_step, lr, self.num_workers, test, wall_seconds,
                           {**self.replica.take_epoch_metrics(), **self.scheme.take_epoch_metrics(),
                            "train_seconds": round(train_seconds, 3)})
        if due:
            self.best.evaluated(test, p)
            self.stopping.evaluated(test, p.global_step)
        return self.stopping.decide_at_epoch_end(p, self.num_workers)  # also a step evaluation's

    def _stop_at_step(self) -> None:
        """Stopped after this step (async: each worker after its own): a step checkpoint."""
        self.scheme.end_of_training()  # the checkpoint sees every worker's last update
        self.watchdog.beat("writing the stop checkpoint")
        self.checkpointer.save(self.progress)


def build_log(run: RunConfig, scheme: UpdateScheme, names: list[str], is_main: bool,
              timer: StepTimer, slow_ranks: SlowRankCheck, clock: TrainingClock) -> RunLog:
    """The run log, and whom the trainer has it tell each epoch's step times of every worker
    once the epoch line's sum is in (in sync at the epoch's end, on every rank, before the
    next epoch's batches are planned): the slow-rank check, then the scheme, which re-plans
    --balance's shares (scheme.batches.step_times_measured). The log only writes lines."""
    return RunLog(run.epochs, scheme, names, is_main, run.progress, run.log_steps,
                  partial(build_sinks, run), timer,
                  [slow_ranks, scheme.batches.step_times_measured], clock)
