"""The shared training loop. It knows nothing of Horovod or MPI: the update scheme behind it
(scheme.UpdateScheme) does the communicating, and the components below decide their own timing.

    plan          which batches this worker trains on, from which step (epoch_plan.py)
    checkpointer  resume decisions and the checkpoint cadence (checkpointer.py)
    evaluator     scoring the test split (evaluator.py)
    log           progress bar, summary lines, JSONL log (run_log.py)
    hooks         after every step: straggler sleep, finite-loss guard (hooks.py)
    best          after every evaluation: best.pt, early stopping (best.py)
    target        after every evaluation: --stop-at, whether the target is reached (target.py)
    signals       SIGTERM/SIGUSR1/SIGINT: stop at an agreed step with a checkpoint (preemption.py)
    watchdog      --stall-timeout-s: end a job that stopped making progress (watchdog.py)
"""

from __future__ import annotations

import time
from typing import Any

from ..config import Config
from ..run_output import package_versions
from ..models import count_parameters
from ..optim import learning_rate
from ..replica import Replica
from ..runtime import Runtime
from ..scheme import Progress, UpdateScheme
from ..workload import Workload
from .best import BestTracker
from .checkpointer import Checkpointer, default_run_dir
from .epoch_plan import EpochPlan
from .evaluator import Evaluator
from .hooks import StepResult, default_hooks
from .preemption import process_signals
from .run_log import EpochResult, RunLog
from .target import TargetStop
from .watchdog import StallWatchdog


class Trainer:
    def __init__(self, cfg: Config, runtime: Runtime, scheme: UpdateScheme, workload: Workload,
                 replica: Replica):
        self.cfg, self.runtime, self.scheme = cfg, runtime, scheme
        self.workload, self.replica = workload, replica
        names = sorted(replica.objective.metrics)
        run = cfg.run
        self.plan = EpochPlan(run, workload.train)
        self.evaluator = Evaluator(run, workload.test, scheme, names)
        self.run_dir = default_run_dir(cfg, workload.data_name, workload.name)
        self.checkpointer = Checkpointer(cfg, scheme, self.run_dir, self.identity,
                                         self.replica.model.state_dict)
        self.best = BestTracker(run, scheme, self.checkpointer, names, workload.test is not None)
        self.target = TargetStop(run, names, workload.test is not None)
        self.hooks = default_hooks(run)
        self._bind_world()
        self.log = RunLog(run.epochs, scheme, names, self.is_main, run.progress, run.log_steps,
                          run.tensorboard)
        self.progress = Progress(workers=self.num_workers)
        self.started = 0.0
        self.eval_seconds = 0.0  # spent evaluating since `started`: not training time
        self.signals = process_signals  # installed by launch.run; unset elsewhere (tests)
        self.preempted: str | None = None  # the signal that stopped the run, once it did
        self.target_stop: str | None = None  # the --stop-at target reached, when it ended the run
        self.stop_clock = (0.0, 0.0)  # (wall, training) seconds when the target stopped it
        self.stopped_at_step = False  # the workers agreed to stop inside an epoch
        self.stopped_elsewhere = False  # async: this worker finished, another was stopped
        # Started by fit(); until then (a benchmark driving _train_epoch) its beats do nothing.
        self.watchdog = StallWatchdog(scheme.stall_timeout_s, runtime.rank, runtime.size,
                                      exit_code=1)

    def _bind_world(self) -> None:
        """Everything that depends on which worker this is and how many there are; again after
        an elastic reset."""
        self.worker_rank, self.num_workers = self.scheme.workers()
        self.is_main = self.worker_rank == 0  # elastic: another process, after rank 0 died
        self.plan.bind_world(self.worker_rank, self.num_workers)
        for hook in self.hooks:
            hook.bind_world(self.worker_rank, self.num_workers)

    def identity(self) -> dict[str, Any]:
        """What must match for a checkpoint to be loadable into this run."""
        return {"mode": self.cfg.run.mode, "model": self.workload.name,
                **self.workload.identity(),
                "num_parameters": count_parameters(self.replica.model),
                "optimizer": self.cfg.optim.optimizer}

    @property
    def history(self) -> list[EpochResult]:
        return self.log.history

    # --- the run --------------------------------------------------------------------------------
    def fit(self) -> list[EpochResult]:
        self.scheme.attach(self.replica)
        self.run_dir = self.checkpointer.claim()  # locked until the run ends
        self.watchdog.start(self.run_dir)
        try:
            self._fit()
        finally:
            self.watchdog.stop()
            self.checkpointer.release()
        return self.history

    def _fit(self) -> None:
        if self.plan.source.random_access:
            self.plan.use_feed(self.scheme.batch_feed(self.plan.steps_per_epoch,
                                                      self.cfg.run.epochs,
                                                      self.plan.source.lookahead))
        state, self.progress = self.checkpointer.restore(self.num_workers)
        self.scheme.start(state, resuming=self.checkpointer.resumed_from is not None)
        if self.is_main:
            self._open_log()
        self.started = time.perf_counter()
        try:
            self.scheme.run(self._epochs, self.progress)
            summary = self.scheme.close()
            if summary:
                self.log.write("scheme", **summary)
        finally:
            self.log.close()

    def _open_log(self) -> None:
        run, p, n = self.cfg.run, self.progress, count_parameters(self.replica.model)
        self.log.open(self.run_dir / "metrics.jsonl", append=self.checkpointer.resumed_from is not None,
                      header=dict(config=self.cfg.to_dict(), world_size=self.runtime.size,
                                  num_workers=self.num_workers, launcher=self.runtime.launcher,
                                  device=self.replica.describe(), versions=package_versions(),
                                  dataset=self.workload.describe(), model=self.workload.name,
                                  num_parameters=n, steps_per_epoch=self.plan.steps_per_epoch,
                                  resumed_from_epoch=p.epoch, resumed_from_step=p.step),
                      global_step=p.global_step)
        print(f"hvdtrain: {run.mode} training of {self.workload.name} ({n:,} parameters) on "
              f"{self.workload.describe()}; {self.num_workers} worker(s), launcher: "
              f"{self.runtime.launcher}, device: {self.replica.describe()}; logging to "
              f"{self.run_dir}", flush=True)

    def _epochs(self) -> None:
        """The epochs from self.progress on. An elastic scheme may run this again after a reset,
        with the progress of its last commit and a new set of workers."""
        self._bind_world()
        self.log.follow_main(self.is_main, self.run_dir / "metrics.jsonl", self.progress.global_step)
        self.plan.rescale(self.progress)
        self.best.start(self.progress)
        while self.progress.epoch < self.cfg.run.epochs and not self._stops_after_epoch():
            self._train_epoch()
            if self.stopped_at_step:
                break  # _stop_at_step wrote the checkpoint
            last = self._stops_after_epoch()
            if last:
                self.scheme.end_of_training()  # the final checkpoint sees every worker's update
            self.checkpointer.epoch_done(self.progress, last=last)
            self.scheme.epoch_done(self.progress)
        if self.stopped_at_step or self.stopped_elsewhere:
            self.log.drain()  # async: a worker that stopped sooner never adds its share
        else:
            self.log.flush(wait=True)
        if self.preempted:
            self._report_preemption()
        if self.target_stop:
            self._report_target()
        if self.best.stop_reason:
            reason = f"stopped early after epoch {self.progress.epoch}: {self.best.stop_reason}"
            self.log.write("stop", epoch=self.progress.epoch, reason=reason)
            if self.is_main:
                print(f"hvdtrain: {reason}; the best model is in {self.best.path}", flush=True)

    def _train_epoch(self) -> None:
        p, epoch = self.progress, self.progress.epoch
        batches = self.plan.batches(p)  # seeds torch; the rest of the epoch after a resume
        self.replica.model.train()
        self.log.start_epoch(epoch, self.plan.steps_per_epoch - p.step)
        lr = self._learning_rate()  # for the epoch line, also when no step is left (a resume)
        for x, y in batches:
            lr = self._learning_rate()
            started = time.perf_counter()
            stats = self.scheme.step(x, y, lr)
            loss = stats.loss_sum.item() / stats.count
            done = StepResult(p, loss, time.perf_counter() - started)
            for hook in self.hooks:
                hook.after_step(done)
            before = p.global_step
            self.plan.advance(p)
            self.scheme.step_done(p)
            self.checkpointer.step_done(before, p, self.plan.steps_per_epoch)
            self.log.step(epoch, p.global_step, lr, loss, stats)
            if self.evaluator.due_at_step(before, p.global_step,
                                          p.step == self.plan.steps_per_epoch, epoch):
                test, wall_seconds, train_seconds = self._timed_evaluation()
                self.log.evaluation(epoch, p.global_step, test, wall_seconds, train_seconds)
                self.target.evaluated(test, p.global_step)
            self.watchdog.beat(f"in step {p.global_step + 1}")
            if self.scheme.agree_to_stop(self.signals.received is not None or
                                         self.target.reached is not None):
                self._stop_at_step()
                return
        self.watchdog.beat("at the end of an epoch (evaluation, checkpoint)")
        if epoch + 1 == self.cfg.run.epochs and self.scheme.end_of_training():
            # the last evaluation and checkpoint see every update; another worker was stopped
            self.stopped_elsewhere = True
            self._note_why_stopped()  # before the last evaluation: it did not stop anybody
        due = self.evaluator.due(epoch)
        if due:
            test, wall_seconds, train_seconds = self._timed_evaluation()
        else:
            test, (wall_seconds, train_seconds) = None, self._clock()
        self.plan.finish_epoch(p)
        # train_seconds is rounded as the epoch line rounds wall_seconds (to 1 ms), so that
        # train_seconds <= wall_seconds holds in the log as it does here.
        self.log.end_epoch(epoch, p.global_step, lr, self.num_workers, test, wall_seconds,
                           {**self.replica.take_epoch_metrics(), **self.scheme.take_epoch_metrics(),
                            "train_seconds": round(train_seconds, 3)})
        if due:
            self.best.evaluated(test, p)
            self.target.evaluated(test, p.global_step)
        self._stop_at_epoch_end_if_all_judged()  # also for a step evaluation at the last step

    def _stop_at_epoch_end_if_all_judged(self) -> None:
        """Where every worker scored the evaluation (sync: all received the same sums), all
        reach the target alike and stop before the next epoch without a word. Where worker 0
        judged alone (async), it tells the others through the next step's stop agreement."""
        if self.target.reached is None or self.progress.epoch >= self.cfg.run.epochs:
            return  # the last epoch ends the run anyway: that is no early stop
        partition = self.scheme.eval_partition
        if partition is not None and partition[1] == self.num_workers:
            self.target_stop, self.stop_clock = self.target.reached, self._clock()

    def _stops_after_epoch(self) -> bool:
        """Every worker stops at this epoch's end: early stopping, or a target all judged."""
        return bool(self.best.stop_reason or self.target_stop)

    def _clock(self) -> tuple[float, float]:
        """(wall seconds since training started, training seconds: the evaluations' left out)."""
        wall = time.perf_counter() - self.started
        return wall, wall - self.eval_seconds

    def _timed_evaluation(self):
        """(test figures, wall seconds when evaluated, training seconds by then): the time of
        an evaluation is the moment its weights were taken, and its own duration is kept out of
        the training time, so frequent evaluations do not slow the clock they are read on.
        Inside scheme.evaluating(), nobody trains off this clock: waiting for a straggler is
        training time."""
        with self.scheme.evaluating():
            before, evaluated = self.eval_seconds, time.perf_counter()
            test = self.evaluator.evaluate()
            self.eval_seconds += time.perf_counter() - evaluated
        wall = evaluated - self.started
        return test, wall, wall - before

    # --- stopping inside an epoch: a stop signal, or the --stop-at target ------------------------
    def _stop_at_step(self) -> None:
        """The workers stop here (agree_to_stop: sync and --bsp after the same step, other async
        workers each after its own): a step checkpoint holds it, and after a signal
        --auto-resume continues from the next step as if nothing had happened."""
        self.stopped_at_step = True
        self._note_why_stopped()
        self.scheme.end_of_training()  # the checkpoint sees every worker's last update
        self.watchdog.beat("writing the stop checkpoint")
        self.checkpointer.save(self.progress)

    def _note_why_stopped(self) -> None:
        """Why this process stops before its epochs are done: its own stop signal, else the
        target that it saw reached, else another worker's signal (or that worker's target: async
        workers that did not evaluate cannot tell). A signal wins, so that a preempted job is
        requeued (exit 75); a target ends it for good (exit 0). World rank 0's verdict is the
        job's (launch.py)."""
        if self.signals.received is None and self.target.reached is not None:
            self.target_stop, self.stop_clock = self.target.reached, self._clock()
        else:
            self.preempted = self.signals.received or "a stop signal on another worker"

    def _report_preemption(self) -> None:
        p = self.progress
        where = f"epoch {p.epoch + 1}, step {p.step}" if p.step else f"the end of epoch {p.epoch}"
        self.log.write("stop", epoch=p.epoch + (1 if p.step else 0), step=p.step,
                       global_step=p.global_step,
                       reason=f"preempted: {self.preempted}")
        if self.is_main:
            print(f"hvdtrain: stopped by {self.preempted} after {where} (global step "
                  f"{p.global_step}); checkpoint {self.checkpointer.path}; continue with "
                  f"--auto-resume --run-dir {self.run_dir}", flush=True)

    def _report_target(self) -> None:
        p = self.progress
        wall, train = self.stop_clock
        # Stamped as the eval lines are (wall time, and training time without the evaluations).
        self.log.write("stop", epoch=p.epoch + (1 if p.step else 0), step=p.global_step,
                       wall_seconds=round(wall, 4), train_seconds=round(train, 4),
                       target=self.target.text, reason=f"reached the target: {self.target_stop}")
        if self.is_main:
            print(f"hvdtrain: reached the target {self.target.text} ({self.target_stop}); "
                  f"stopped after global step {p.global_step}; checkpoint "
                  f"{self.checkpointer.path}", flush=True)

    def _learning_rate(self) -> float:
        return learning_rate(self.progress.global_step, self.plan.total_steps,
                             self.plan.steps_per_epoch, self.cfg.optim, self.scheme.lr_scale)
