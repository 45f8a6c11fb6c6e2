"""A simulated cluster for ``hvdtrain compare``: the comparison's modes with N virtual workers,
in one process, on a virtual clock.

What is real: the model and its initial weights (drawn as a real run draws them), the data and
each worker's batches (the same EpochPlan a real worker of rank r among N follows), the
gradients (Replica.forward_backward), the learning-rate schedule, and the algorithm: each mode
runs the real scheme's engine (engines/: SyncStep, LocalRounds, ServerEngine, the classes a real
run runs), its virtual workers meeting in a virtual collective (collective.py) or at a virtual
server (server_run.py).
What is virtual: time. A worker's step computes for ``Timing.step_seconds`` (a fixed part and
a part per sample: ``Timing.compute_seconds``), then waits the straggler delay a real run would
sleep (StragglerModel.delay, the same draws, of that compute time and the step's samples), plus
the mode's communication costs and the loop's own time around the update (``loop_seconds``); a
single parameter server is a queue that takes ``Timing.apply_seconds`` per gradient, so with
many workers it saturates as a real one does.

    sync        rounds: the slowest worker's step, then the averaged gradient is applied at
                lr * N (sync_run.py: engines/sync_step.py)
    balanced    sync with --balance: each worker computes its share of the global batch, the
                shares re-planned at epoch ends from its speed (share_clock.py); the update
                is sync's, the global batch's gradient, so only the rounds' time differs
    local H     each worker takes H optimizer steps of its own, then the models are averaged;
                a round also ends at an evaluation or an epoch's end, where the optimizer
                state is averaged too (local_run.py: engines/local_rounds.py)
    diloco H    local H whose rounds average the pseudo-gradients and take DiLoCo's outer
                Nesterov step (rules/local_sgd.py, through the same engine)
    async, SSP  an event queue by completion time; the server applies each gradient on arrival
                at lr; SSP holds back a worker more than s pushes ahead; --staleness-lr and
                DC-ASGD: the real server's engine and rules, driven on the virtual clock
                (server_run.py: engines/server_engine.py)
    adiloco H   async whose workers take H inner steps each, then push the pseudo-gradient;
                the server applies the outer step as each arrives (diloco_run.py: the real
                server's engine and outer step)
    bsp/backup  rounds through the server at lr * (N - b) (ps/client.py); with b backup workers
                a round closes with the first N-b gradients computed on its parameters, and a
                later one is dropped, its worker going on from the new parameters. Plain bsp
                keeps each worker's own share; with backup workers the job's batches go to
                whoever asks, as under async (the round policy's fixed_shares)

Evaluations fall where a real run's do (the ends of epochs, --eval-every-steps), on the whole
test split, and take no virtual time. Where async workers take the job's batches, the epochs are
worker 0's, as a real run's log has them: it ends each when its next batch opens a later one,
and evaluates then, wherever the others are (server_run.py _end_epochs). A global step, the
step of the curves, is every worker's batch once: a sync round, or N pushes. A run may stop at
the first evaluation that reaches its target (stop_at_target), all that a sweep over workers
needs. Such a sweep keeps the global batch fixed (strong_scaling_args), so that the workers
share the same data and steps at every N.

Approximations, all of them deliberate: the model's buffers (BatchNorm running statistics) are
one set that every virtual worker updates; communication costs are constants per exchange (to
be calibrated from real runs), or a link's bandwidth and latency (link.py) without congestion
beyond the server's link being shared; one server, however many --num-servers say;
a DONE or a dropped gradient costs the server no time; the simulator computes on the CPU.
--precision fp16 and --reduce-op adasum are refused, as their arithmetic is not simulated.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import re
from collections import Counter
from collections.abc import Sequence

import torch

from ...config import ConfigError
from ...loop.epoch_plan import EpochPlan
from ...loop.evaluator import EvalCadence
from ...loop.hooks import TrainingError
from ...loop.stopping import non_finite_loss
from ...optim import learning_rate
from ...ps.protocol import chunk_bounds, chunk_elements
from ...rules.staleness_lr import divergence_hint
from ...scheme import Progress
from ...stragglers import StragglerModel
from ..plan import Mode
from ..results import RunResult, final_value, time_to_target
from ..share_clock import ShareClock
from ..target_metric import Target
from .flat_model import _Setup
from .link import gradient_bytes, wire_bytes
from .diloco_run import DiLoCoRun
from .local_run import LocalRun
from .server_run import PushRecord, ServerRun
from .sync_run import SyncRun
from .timing import Timing, _torch_threads
from .workers import _Worker


def _check_arguments(mode: Mode, workers: int, eval_every_steps: int | None) -> None:
    """ConfigError, saying what to change, for what a simulation cannot run."""
    if workers < 1:
        raise ConfigError(f"workers: invalid value {workers}; use 1 or more")
    if mode.local_steps < 1:
        raise ConfigError(f"local steps: invalid value {mode.local_steps}; use 1 or more")
    if mode.balance and (mode.is_async or mode.local_steps != 1):
        raise ConfigError(f"mode {mode.name}: --balance shares sync's global batch; use it "
                          "with sync (no --local-steps), not async or local SGD")
    if mode.bsp and not 0 <= mode.backup_workers < workers:
        raise ConfigError(f"--backup-workers {mode.backup_workers} with {workers} workers: "
                          f"a round needs at least one gradient; use 0 to {workers - 1}")
    if eval_every_steps is not None and eval_every_steps < 0:
        raise ConfigError(f"eval_every_steps: invalid value {eval_every_steps}; use 0 "
                          "(epoch ends only), a number of steps, or None for the train "
                          "flags' --eval-every-steps")


class _TargetReached(Exception):
    """An evaluation reached the target of a run that stops there (stop_at_target)."""


class Simulation:
    """One simulated run of ``mode`` with ``workers`` virtual workers (see simulate_run for the
    arguments). :meth:`run` returns the RunResult that a real run's log would give; afterwards
    ``final_parameters`` holds the flat weights, ``round_seconds`` each round's duration (sync
    modes), ``clock`` sync's round clock with each epoch's shares (``clock.plans``) and
    ``pushes`` every gradient the server received (async modes)."""

    def __init__(self, mode: Mode, workers: int, straggler: str, seed: int,
                 train_args: Sequence[str], target: Target | str | float, timing: Timing,
                 eval_every_steps: int | None = None, stop_at_target: bool = False,
                 delays: StragglerModel | None = None):
        _check_arguments(mode, workers, eval_every_steps)
        timing.check()
        self.mode, self.num_workers, self.seed = mode, workers, seed
        self.target = Target.of(target)  # a float: a test accuracy
        self.stop_at_target = stop_at_target
        self.straggler_text = straggler.strip() if straggler.strip().lower() != "none" else ""
        self.timing = timing
        self.setup = _Setup.build(train_args, seed, self.straggler_text, mode)
        if delays is not None:  # any object with StragglerModel.delay (compare --from-run's fit)
            self.setup.straggler = delays
        run = self.setup.cfg.run
        train = self.setup.workload.train  # each virtual worker reads its own batches
        self.workers = [_Worker(r, EpochPlan(run, train if r == 0 else train.another_reader()))
                        for r in range(workers)]
        for w in self.workers:
            w.plan.bind_world(w.rank, workers)  # ConfigError when N workers' batch is too big
        self.steps_per_epoch = self.workers[0].plan.steps_per_epoch
        self.total_steps = self.workers[0].plan.total_steps  # every worker's budget
        every = run.eval_every_steps if eval_every_steps is None else eval_every_steps
        self.cadence = EvalCadence(dataclasses.replace(run, eval_every_steps=every))
        self.chunks = chunk_bounds(self.setup.model.flat.numel(),
                                   chunk_elements(self.setup.cfg.ps.chunk_mb))
        # The bytes of one exchange on a Timing.link (link.py): sync's gradients, or the
        # models and pseudo-gradients that local SGD, DiLoCo and the server's workers send.
        plain_sync = not mode.is_async and mode.local_steps == 1
        self.message_bytes = self.setup.model.flat.numel() * (
            gradient_bytes(self.setup.cfg) if plain_sync else wire_bytes(self.setup.cfg))
        # what the run records
        self.now = 0.0
        self.curve: list[dict] = []
        self.staleness: Counter = Counter()
        self.round_seconds: list[float] = []
        self.clock: ShareClock | None = None  # sync rounds' clock (its shares: clock.plans)
        self.pushes: list[PushRecord] = []
        self.final_parameters: torch.Tensor | None = None
        self._worker_steps = 0   # steps taken by all workers together
        self._samples = 0
        self._loss_sum, self._loss_count = 0.0, 0
        self._checked = 0        # global steps whose evaluation, if due, is done
        self._changed = True     # the weights moved since the last evaluation
        # Async modes on the job's batches: worker 0 ends the epochs and evaluates there, at its
        # own pace (ServerRun._end_epochs), as a real lead does; not when the job's batches of
        # the epoch are done, which a worker ahead of the lead may be long before.
        self.lead_ends_epochs = False

    # --- shared pieces ----------------------------------------------------------------------------
    def _lr(self, step: int, lr_scale: float) -> float:
        return learning_rate(step, self.total_steps, self.steps_per_epoch, self.setup.cfg.optim,
                             lr_scale)

    def _gradient(self, w: _Worker, weights: torch.Tensor | None,
                  clip: bool = True) -> torch.Tensor:
        """Worker ``w``'s gradient at ``weights`` (None: those loaded already) on its next
        batch, with its own random state; counts the step."""
        x, y = w.next_batch()
        if weights is not None:
            self.setup.model.flat.copy_(weights)
        torch.set_rng_state(w.rng)
        grad, loss_sum, count, weight = self.setup.model.gradient(x, y, clip)
        w.rng = torch.get_rng_state()
        self._counted(w, loss_sum, count, weight)
        return grad

    def _counted(self, w: _Worker, loss_sum: float, count: int, weight: float) -> None:
        """Worker ``w`` took a step of ``count`` samples whose loss summed to ``loss_sum`` over
        ``weight`` (the samples, or a token loss's scored tokens: BatchStats.loss_weight); a
        non-finite loss ends the run, as a real run's loss guard ends it (loop/stopping.py)."""
        per_epoch, loss = self.steps_per_epoch, loss_sum / weight if weight else loss_sum
        if not math.isfinite(loss):  # the advice is worded only then
            why = non_finite_loss(loss, Progress(epoch=w.steps // per_epoch,
                                                 step=w.steps % per_epoch, global_step=w.steps),
                                  divergence_hint(self.setup.cfg, self.num_workers))
            raise TrainingError(f"{why} (virtual worker {w.rank})")
        w.steps += 1
        self._worker_steps += 1
        self._samples += count
        self._loss_sum, self._loss_count = self._loss_sum + loss_sum, self._loss_count + weight

    def _delay(self, w: _Worker, step: int, step_seconds: float, work: float = 1.0) -> float:
        """What the straggler hook sleeps after ``w``'s step ``step``, which computed for
        ``step_seconds`` on ``work`` times --batch-size samples."""
        return self.setup.straggler.delay(w.rank, self.num_workers, step, step_seconds, self.seed,
                                          work)

    def _due(self, step: int) -> bool:
        """Whether a real run evaluates after global step ``step`` (counted from 1), as the
        trainer asks its evaluator (loop/evaluator.py EvalCadence): every --eval-every-steps
        steps, at the end of every --eval-every-th epoch, and at the end."""
        epoch, within = divmod(step - 1, self.steps_per_epoch)
        end_of_epoch = within + 1 == self.steps_per_epoch
        return (self.cadence.due_at_step(step - 1, step, end_of_epoch, epoch) or
                (end_of_epoch and not self.lead_ends_epochs and self.cadence.due(epoch)))

    def _maybe_evaluate(self, at: float, weights: torch.Tensor | None) -> None:
        """Evaluate if an evaluation fell due since the last check. A global step is every
        worker's batch once (a sync round; N async pushes), the step count of a real run's
        log."""
        step = self._worker_steps // self.num_workers
        if any(self._due(s) for s in range(self._checked + 1, step + 1)):
            self._evaluate(at, weights)
        self._checked = step

    def _evaluate(self, at: float, weights: torch.Tensor | None, step: int | None = None) -> None:
        """A curve point for ``weights`` (None: the model's own) at virtual time ``at``, at
        global step ``step`` (None: the workers' steps so far); evaluating costs no virtual
        time."""
        if weights is not None:
            self.setup.model.flat.copy_(weights)
        test = self.setup.model.evaluate(self.setup.workload.test)
        train_loss = self._loss_sum / self._loss_count if self._loss_count else None
        if step is None:
            step = self._worker_steps // self.num_workers
        point = {"step": step, "wall_seconds": at, "train_loss": train_loss,
                 "test_acc": test.get("test_acc"), "test_loss": test.get("test_loss"), **test}
        # In time order: worker 0's epoch ends (server_run.py _end_epochs) are scored when its
        # pull lands, which may be after an evaluation the job's steps bring about meanwhile.
        at_index = bisect.bisect_right(self.curve, at, key=lambda p: p["wall_seconds"])
        self.curve.insert(at_index, point)
        self._loss_sum, self._loss_count = 0.0, 0
        self._changed = False
        # judged as a real run's --stop-at judges it: the target's metric, in its direction
        if self.stop_at_target and self.target.reached(test.get(self.target.metric)):
            del self.curve[at_index + 1:]  # the run ends here: nothing later was scored
            raise _TargetReached  # unwinds whichever mode's loop is running

    def _finish(self, weights: torch.Tensor | None) -> None:
        if self._changed or not self.curve:
            self._evaluate(self.now, weights)
        self.final_parameters = (weights if weights is not None
                                 else self.setup.model.flat).detach().clone()

    # --- the modes --------------------------------------------------------------------------------
    def run(self) -> RunResult:
        mode = self.mode
        try:
            with _torch_threads(self.setup.cfg.run.threads):
                if mode.is_async:  # with local steps, asynchronous DiLoCo
                    (DiLoCoRun if mode.local_steps > 1 else ServerRun)(self).run()
                elif mode.local_steps > 1:
                    LocalRun(self).run()
                else:
                    SyncRun(self).run()
        except _TargetReached:
            self._stop_at_last_evaluation()
        except TrainingError as e:
            return self._failed(f"training failed: {e}")
        finally:
            self.setup.workload.close()
        return self._result()

    def _stop_at_last_evaluation(self) -> None:
        """stop_at_target: the run ends at the evaluation that reached the target, with the
        weights it evaluated (loaded in the model by _evaluate)."""
        self.now = self.curve[-1]["wall_seconds"]
        self.final_parameters = self.setup.model.flat.detach().clone()

    # --- the result -------------------------------------------------------------------------------
    def _failed(self, reason: str) -> RunResult:
        """A run that a real launch would have ended with an error: recorded as read_result
        records a failed run, with no figures."""
        return failed_result(self.mode, self.num_workers, self.straggler_text, self.seed, reason)

    def _result(self) -> RunResult:
        final = self.curve[-1]
        hist = {int(k): int(v) for k, v in sorted(self.staleness.items())}
        total = sum(hist.values())
        if self.mode.is_async:
            mean_staleness = sum(k * v for k, v in hist.items()) / total if total else None
        else:
            mean_staleness = 0.0
        wall = self.now
        return RunResult(
            name=run_name(self.mode, self.num_workers, self.straggler_text, self.seed),
            mode=self.mode.name, straggler=self.straggler_text or "none", seed=self.seed,
            status="ok", reason="", final_test_acc=final["test_acc"],
            final_value=final_value(self.curve, self.target.metric),
            time_to_target=time_to_target(self.curve, self.target),
            samples_per_sec=self._samples / wall if wall > 0 else None,
            mean_staleness=mean_staleness, wall_seconds=wall, curve=self.curve,
            staleness_histogram=hist, workers=self.num_workers, simulated=True)


def run_name(mode: Mode, workers: int, straggler: str, seed: int) -> str:
    """A simulated run's name: like a real run's (plan.py), with its number of workers."""
    slug = re.sub(r"[^\w.@-]", "-", straggler)
    return f"{mode.name}-n{workers}-seed{seed}" + (f"-straggler{slug}" if straggler else "")


def failed_result(mode: Mode, workers: int, straggler: str, seed: int, reason: str) -> RunResult:
    return RunResult(run_name(mode, workers, straggler, seed), mode.name, straggler or "none",
                     seed, "failed", reason, None, None, None, None, None, [], {},
                     workers=workers, simulated=True)

