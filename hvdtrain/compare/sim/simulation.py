"""A simulated cluster for ``hvdtrain compare``: the comparison's modes with N virtual workers,
in one process, on a virtual clock.

What is real: the model and its initial weights (drawn as a real run draws them), the data and
each worker's batches (the same EpochPlan a real worker of rank r among N follows), the
gradients (Replica.forward_backward), the learning-rate schedule, and the update arithmetic
(torch's optimizer for sync, the server's ShardOptimizer and its staleness rules for async).
What is virtual: time. A worker's step computes for ``Timing.step_seconds`` (a fixed part and
a part per sample: ``Timing.compute_seconds``), then waits the straggler delay a real run would
sleep (StragglerModel.delay, the same draws, of that compute time and the step's samples), plus
the mode's communication costs and the loop's own time around the update (``loop_seconds``); a
single parameter server is a queue that takes ``Timing.apply_seconds`` per gradient, so with
many workers it saturates as a real one does.

    sync        rounds: the slowest worker's step, then the averaged gradient is applied at
                lr * N (sync.py)
    balanced    sync with --balance: each worker computes its share of the global batch, the
                shares re-planned at epoch ends from its speed (share_clock.py); the update
                is sync's, the global batch's gradient, so only the rounds' time differs
    local H     each worker takes H optimizer steps of its own, then the models are averaged;
                as in sync.py a round also ends at an evaluation or an epoch's end, where the
                optimizer state is averaged too
    diloco H    local H whose rounds average the pseudo-gradients and take DiLoCo's outer
                Nesterov step (rules/local_sgd.py, as local_sgd.py does)
    async, SSP  an event queue by completion time; the server applies each gradient on arrival
                at lr; SSP holds back a worker more than s pushes ahead; --staleness-lr and
                DC-ASGD: the real server's rule objects (rules/), driven on the virtual clock
    bsp/backup  rounds through the server at lr * (N - b) (ps/client.py); with b backup workers
                a round closes with the first N-b gradients computed on its parameters, and a
                later one is dropped, its worker going on from the new parameters. Plain bsp
                keeps each worker's own share; with backup workers the job's batches go to
                whoever asks, as under async (the round policy's fixed_shares)

Evaluations fall where a real run's do (the ends of epochs, --eval-every-steps), on the whole
test split, and take no virtual time. A global step, the step of the curves, is every worker's
batch once: a sync round, or N pushes. A run may stop at the first evaluation that reaches its
target (stop_at_target), all that a sweep over workers needs. Such a sweep keeps the global
batch fixed (strong_scaling_args), so that the workers share the same data and steps at every N.

Approximations, all of them deliberate: the model's buffers (BatchNorm running statistics) are
one set that every virtual worker updates; communication costs are constants per step (to be
calibrated from real runs), not a network model; one server, however many --num-servers say;
a DONE or a dropped gradient costs the server no time; the simulator computes on the CPU.
--precision fp16 and --reduce-op adasum are refused, as their arithmetic is not simulated.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence

import torch

from ...config import ConfigError
from ...loop.epoch_plan import EpochPlan
from ...loop.hooks import TrainingError
from ...optim import build_optimizer, learning_rate, set_learning_rate
from ...ps.protocol import chunk_bounds, chunk_elements
from ...ps.shard_optimizer import ShardOptimizer
from ...rules.balance import balance_settings
from ...rules.local_sgd import RoundRule, round_rule
from ...stragglers import StragglerModel
from ..plan import Mode
from ..results import RunResult, time_to_target
from ..share_clock import ShareClock
from .flat_model import _Setup
from .server_run import PushRecord, ServerRun
from .timing import Timing, _apply, _torch_threads
from .workers import _Worker


def _average_into(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Every tensor becomes their mean (an allreduce with hvd.Average); returns the first."""
    mean = torch.stack(tensors).mean(dim=0)
    for t in tensors:
        t.copy_(mean)
    return tensors[0]


class _TargetReached(Exception):
    """An evaluation reached the target of a run that stops there (stop_at_target)."""


class Simulation:
    """One simulated run of ``mode`` with ``workers`` virtual workers (see simulate_run for the
    arguments). :meth:`run` returns the RunResult that a real run's log would give; afterwards
    ``final_parameters`` holds the flat weights, ``round_seconds`` each round's duration (sync
    modes), ``clock`` sync's round clock with each epoch's shares (``clock.plans``) and
    ``pushes`` every gradient the server received (async modes)."""

    def __init__(self, mode: Mode, workers: int, straggler: str, seed: int,
                 train_args: Sequence[str], target: float, timing: Timing,
                 eval_every_steps: int | None = None, stop_at_target: bool = False,
                 delays: StragglerModel | None = None):
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
        timing.check()
        self.mode, self.num_workers, self.seed, self.target = mode, workers, seed, target
        self.stop_at_target = stop_at_target
        self.straggler_text = straggler.strip() if straggler.strip().lower() != "none" else ""
        self.timing = timing
        self.setup = _Setup.build(train_args, seed, self.straggler_text, mode)
        if delays is not None:  # any object with StragglerModel.delay (compare --from-run's fit)
            self.setup.straggler = delays
        run = self.setup.cfg.run
        self.workers = [_Worker(r, EpochPlan(run, self.setup.workload.train))
                        for r in range(workers)]
        for w in self.workers:
            w.plan.bind_world(w.rank, workers)  # ConfigError when N workers' batch is too big
        self.steps_per_epoch = self.workers[0].plan.steps_per_epoch
        self.total_steps = self.workers[0].plan.total_steps  # every worker's budget
        self.eval_every_steps = (run.eval_every_steps if eval_every_steps is None
                                 else eval_every_steps)
        self.chunks = chunk_bounds(self.setup.model.flat.numel(),
                                   chunk_elements(self.setup.cfg.ps.chunk_mb))
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
        grad, loss_sum, count = self.setup.model.gradient(x, y, clip)
        w.rng = torch.get_rng_state()
        if not math.isfinite(loss_sum):  # where a real run's stopping component ends it (its loss guard)
            per_epoch = self.steps_per_epoch
            raise TrainingError(f"loss became {loss_sum / count} on worker {w.rank} at epoch "
                                f"{w.steps // per_epoch + 1}, step {w.steps % per_epoch + 1} "
                                f"(global step {w.steps + 1}); lower --lr or check the data")
        w.steps += 1
        self._worker_steps += 1
        self._samples += count
        self._loss_sum, self._loss_count = self._loss_sum + loss_sum, self._loss_count + count
        return grad

    def _delay(self, w: _Worker, step: int, step_seconds: float, work: float = 1.0) -> float:
        """What the straggler hook sleeps after ``w``'s step ``step``, which computed for
        ``step_seconds`` on ``work`` times --batch-size samples."""
        return self.setup.straggler.delay(w.rank, self.num_workers, step, step_seconds, self.seed,
                                          work)

    def _due(self, step: int) -> bool:
        """Whether a real run evaluates after global step ``step`` (loop/evaluator.py): every
        --eval-every-steps steps, at the end of every --eval-every-th epoch, and at the end."""
        if step == self.total_steps or (self.eval_every_steps and
                                        step % self.eval_every_steps == 0):
            return True
        epochs, within = divmod(step, self.steps_per_epoch)
        return within == 0 and epochs % self.setup.cfg.run.eval_every == 0

    def _next_due(self, step: int) -> int:
        return next(s for s in range(step + 1, self.total_steps + 1) if self._due(s))

    def _maybe_evaluate(self, at: float, weights: torch.Tensor | None) -> None:
        """Evaluate if an evaluation fell due since the last check. A global step is every
        worker's batch once (a sync round; N async pushes), the step count of a real run's
        log."""
        step = self._worker_steps // self.num_workers
        if any(self._due(s) for s in range(self._checked + 1, step + 1)):
            self._evaluate(at, weights)
        self._checked = step

    def _evaluate(self, at: float, weights: torch.Tensor | None) -> None:
        """A curve point for ``weights`` (None: the model's own) at virtual time ``at``;
        evaluating costs no virtual time."""
        if weights is not None:
            self.setup.model.flat.copy_(weights)
        test_loss, test_acc = self.setup.model.evaluate(self.setup.workload.test)
        train_loss = self._loss_sum / self._loss_count if self._loss_count else None
        self.curve.append({"step": self._worker_steps // self.num_workers, "wall_seconds": at,
                           "train_loss": train_loss, "test_acc": test_acc,
                           "test_loss": test_loss})
        self._loss_sum, self._loss_count = 0.0, 0
        self._changed = False
        if self.stop_at_target and test_acc is not None and test_acc >= self.target:
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
                if not mode.is_async:
                    self._run_sync() if mode.local_steps == 1 else self._run_local()
                else:
                    ServerRun(self).run()
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

    def _run_sync(self) -> None:
        """Horovod: every round each worker computes its gradient at the same weights; the
        round lasts as long as the slowest worker's step and the allreduce (self.clock); the
        average is applied with lr * N by the same torch optimizer (sync.py). Mode balanced
        trains the same rounds: its share-weighted gradient is the global batch's, as sync's
        average is, and only its clock's shares differ (share_clock.py)."""
        model, optimizer = self.setup.model, build_optimizer(self.setup.model.params,
                                                             self.setup.cfg.optim)
        cfg = self.setup.cfg
        floor, damping = balance_settings(cfg)
        # The straggler hook of a real worker is given its step's compute time, without the
        # wait for the allreduce (scheme.take_wait_seconds), and its samples.
        self.clock = ShareClock(self.timing, cfg.run.batch_size, self.num_workers,
                                lambda rank, step, seconds, work: self._delay(
                                    self.workers[rank], step, seconds, work),
                                balance=self.mode.balance,
                                granularity=cfg.sync.backward_passes_per_step, floor=floor,
                                damping=damping)
        for step in range(self.total_steps):
            total = sum(self._gradient(w, None, clip=False) for w in self.workers)
            model.set_gradient(total / self.num_workers)  # hvd.Average: the sum over N
            model.clip()  # sync clips the averaged gradient, on every rank alike
            set_learning_rate(optimizer, self._lr(step, self.num_workers))
            optimizer.step()
            seconds = self.clock.round_seconds(step)
            if (step + 1) % self.steps_per_epoch == 0:
                self.clock.epoch_ended()  # --balance re-plans the shares here
            self.round_seconds.append(seconds)
            self.now += seconds
            self._changed = True
            self._maybe_evaluate(self.now, None)
        self._finish(None)

    def _run_local(self) -> None:
        """Local SGD (sync.py, --local-steps H): each worker steps its own optimizer, and every
        H steps the models are averaged (an allreduce); a round ends when the slowest worker
        has taken its steps. As in sync.py a round also ends early wherever the model is read
        (an evaluation, an epoch's end), and at epoch ends the optimizer state is averaged too.
        The rate is sync's (lr * N): with H = 1 this is sync training, step for step. What a
        round averages, and where the workers go on from, is the real scheme's rule
        (rules/local_sgd.py): the parameters, or DiLoCo's pseudo-gradients and outer step,
        whose workers' rate the rule scales as local_sgd.py does."""
        cfg = self.setup.cfg
        for w in self.workers:
            w.params = self.setup.model.flat.clone()
            w.optimizer = ShardOptimizer(w.params, self.chunks, cfg.optim)
        rule = round_rule([self.setup.model.flat], cfg.sync.outer_lr, cfg.sync.outer_momentum)
        scale = rule.inner_lr_scale(self.num_workers)
        step = 0
        while step < self.total_steps:
            epoch_end = (step // self.steps_per_epoch + 1) * self.steps_per_epoch
            end = min(step + self.mode.local_steps, epoch_end, self._next_due(step))
            busy = [self._local_steps(w, range(step, end), scale) for w in self.workers]
            average = self._round(rule)
            if end == epoch_end:
                for name in self.workers[0].optimizer.vectors:  # momentum, Adam's moments
                    _average_into([w.optimizer.vectors[name] for w in self.workers])
            seconds = max(busy) + self.timing.allreduce_seconds
            self.round_seconds.append(seconds)
            self.now += seconds
            step = end
            self._changed = True
            self._maybe_evaluate(self.now, average)
        self._finish(self.workers[0].params)

    def _round(self, rule: RoundRule) -> torch.Tensor:
        """One averaging round of ``rule`` over the workers' flat parameters, as an allreduce of
        what each worker sends; every worker goes on from the result, which is returned."""
        [average] = rule.merged([_average_into([rule.sent([w.params])[0]
                                                for w in self.workers])])
        for w in self.workers:
            w.params.copy_(average)
        return average

    def _local_steps(self, w: _Worker, steps: range, lr_scale: float) -> float:
        """Worker ``w``'s optimizer steps on its own weights; returns the seconds they took."""
        seconds = 0.0
        own = self.timing.step_seconds
        for step in steps:
            grad = self._gradient(w, w.params)
            _apply(w.optimizer, self.chunks, grad, self._lr(step, lr_scale))
            seconds += self.timing.loop_seconds + own + self._delay(w, step, own)
        return seconds

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

