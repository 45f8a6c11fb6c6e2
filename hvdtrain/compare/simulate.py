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
import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from ..config import Config, ConfigError
from ..loop.epoch_plan import EpochPlan
from ..loop.evaluator import EVAL_BATCH
from ..loop.hooks import TrainingError
from ..optim import build_optimizer, learning_rate, set_learning_rate
from ..precision import Precision
from ..ps.dispatch import NO_SLOT
from ..ps.protocol import chunk_bounds, chunk_elements
from ..ps.shard_optimizer import ShardOptimizer
from ..replica import Replica, batch_length, split_batch
from ..rules.local_sgd import RoundRule, round_rule
from ..scheme import Progress
from ..stragglers import StragglerModel, parse_straggler
from .plan import Mode
from .results import RunResult, time_to_target
from ..rules.balance import balance_settings
from .share_clock import ShareClock
from .sim.server_run import PushRecord, ServerRun


# --- time -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Timing:
    """What things cost on the virtual clock, in seconds. Measure them in-process with
    :func:`measure_timing`, or pass figures calibrated from real runs' logs."""

    step_seconds: float             # one worker's forward and backward pass over --batch-size
    apply_seconds: float = 0.0      # the server's update with one gradient (the optimizer step)
    allreduce_seconds: float = 0.0  # sync: averaging the gradients (local SGD: the models) once
    push_seconds: float = 0.0       # async: a worker's push and pull, in series with its step
    # The training loop's own time per step around the update (the next batch, the logs, the
    # hooks): a real straggler stretches the step's compute only (loop/hooks.py Straggler is
    # given scheme.step's time without the wait for the others), so this part is unstretched.
    loop_seconds: float = 0.0
    # The part of step_seconds that grows with the samples, per sample (measure_timing fits
    # it from two batch sizes); the rest is fixed per step. None: all of it grows with them.
    sample_seconds: float | None = None

    def compute_seconds(self, samples: int, batch_size: int) -> float:
        """A step's forward and backward pass over ``samples`` (a --balance share) when
        --batch-size is ``batch_size``: step_seconds at a full batch, a line through it."""
        if samples == batch_size:
            return self.step_seconds
        per_sample = (self.step_seconds / batch_size if self.sample_seconds is None
                      else self.sample_seconds)
        return max(0.0, self.step_seconds + per_sample * (samples - batch_size))

    def check(self) -> None:
        for name in ("step_seconds", "apply_seconds", "allreduce_seconds", "push_seconds",
                     "loop_seconds", "sample_seconds"):
            value = getattr(self, name)
            if value is None and name == "sample_seconds":
                continue
            if not (math.isfinite(value) and value >= 0):
                raise ConfigError(f"Timing.{name}: invalid value {value}; use 0 or more seconds")


def measure_timing(train_args: Sequence[str], seed: int = 0, repeats: int = 30, warmup: int = 5,
                   allreduce_seconds: float = 0.0, push_seconds: float = 0.0,
                   step_seconds: float | None = None, apply_seconds: float | None = None,
                   sample_seconds: float | None = None) -> Timing:
    """The compute time of one worker's step (the median of ``repeats`` real forward and
    backward passes over real batches, after ``warmup`` that are not counted) and the server's
    time to apply one gradient (likewise), measured in this process unless given (the measured
    figures drift with the machine's load, so invocations meant to share one clock give them).
    A measured step also gives its part per sample (Timing.sample_seconds), from half batches
    timed in turn with the whole ones; a given one has ``sample_seconds`` (None: it grows in
    proportion to its samples).
    Communication cannot be measured in one process: pass the figures, or 0 for an ideal
    network."""
    if step_seconds is not None and apply_seconds is not None:
        return Timing(step_seconds, apply_seconds, allreduce_seconds, push_seconds,
                      sample_seconds=sample_seconds)
    setup = _Setup.build(train_args, seed, "", Mode("sync", scheme="sync"))
    plan = EpochPlan(setup.cfg.run, setup.workload.train)
    plan.bind_world(0, 1)
    batches = _cycle(lambda epoch: plan.batches(Progress(epoch=epoch)))
    model = setup.model
    try:
        with _torch_threads(setup.cfg.run.threads):  # timed as the simulated runs compute
            step, per_sample = step_seconds, sample_seconds
            if step is None:
                step, per_sample = _compute_line(model, batches, warmup, repeats)
            apply = apply_seconds
            if apply is None:
                apply = _apply_seconds(model.flat, setup.cfg, warmup, repeats)
    finally:
        setup.workload.close()
    return Timing(step, apply, allreduce_seconds, push_seconds, sample_seconds=per_sample)


def _compute_line(model: _FlatModel, batches: Iterator, warmup: int,
                  repeats: int) -> tuple[float, float | None]:
    """(a full batch's forward and backward pass, the seconds each sample adds): medians over
    whole batches and their first halves, timed in turns so that a change in the machine's
    load falls on both, and the line through the two (its slope kept between 0 and the whole
    step's time per sample). None for the slope where a batch has one sample."""
    seconds: dict[int, list[float]] = {1: [], 2: []}
    counts = {1: 0, 2: 0}
    for i in range(warmup + max(1, repeats)):
        x, y = next(batches)
        halves = 2 if batch_length(y) > 1 else 1
        for parts in range(1, halves + 1):
            started = time.perf_counter()
            _, _, counts[parts] = model.gradient(split_batch(x, parts)[0],
                                                 split_batch(y, parts)[0])
            if i >= warmup:
                seconds[parts].append(time.perf_counter() - started)
    full = statistics.median(seconds[1])
    if not seconds[2] or counts[1] <= counts[2]:
        return full, None
    slope = (full - statistics.median(seconds[2])) / (counts[1] - counts[2])
    return full, min(max(slope, 0.0), full / counts[1])


def _apply_seconds(flat: torch.Tensor, cfg, warmup: int, repeats: int) -> float:
    """The server's time to apply one gradient to a copy of the parameters ``flat``."""
    params = flat.clone()
    chunks = chunk_bounds(params.numel(), chunk_elements(cfg.ps.chunk_mb))
    optimizer = ShardOptimizer(params, chunks, cfg.optim)
    gradient = torch.randn_like(params) * 1e-4  # small: the steps must not blow up
    return _median_seconds(lambda: _apply(optimizer, chunks, gradient, cfg.optim.lr), warmup,
                           repeats)


@contextmanager
def _torch_threads(threads: int) -> Iterator[None]:
    """--threads for the duration (0: this process's setting), then the caller's setting."""
    before = torch.get_num_threads()
    if threads:  # tiny models run fastest with 1
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _median_seconds(work: Callable[[], object], warmup: int, repeats: int) -> float:
    seconds = []
    for i in range(warmup + max(1, repeats)):
        started = time.perf_counter()
        work()
        if i >= warmup:
            seconds.append(time.perf_counter() - started)
    return statistics.median(seconds)


def _cycle(epoch_batches: Callable[[int], Iterator]) -> Iterator:
    epoch = 0
    while True:
        yield from epoch_batches(epoch)
        epoch += 1


# --- what is trained ------------------------------------------------------------------------------
class _FlatModel:
    """The one real replica. Its trainable parameters are views of one flat vector, so loading a
    virtual worker's weights is one copy, and a gradient is one flat vector as the server sees
    it."""

    def __init__(self, replica: Replica, clip_grad_norm: float):
        self.replica = replica
        self.clip_grad_norm = clip_grad_norm
        self.params = [p for p in replica.model.parameters() if p.requires_grad]
        odd = sorted({str(p.dtype) for p in self.params if p.dtype != torch.float32})
        if odd:
            raise ConfigError(f"the simulator trains float32 parameters; this model has "
                              f"{', '.join(odd)} ones: convert the model with .float()")
        self.flat = torch.empty(sum(p.numel() for p in self.params))
        offset = 0
        for p in self.params:
            view = self.flat[offset:offset + p.numel()]
            view.copy_(p.data.reshape(-1))
            p.data = view.view_as(p)  # the weights live in the flat vector
            offset += p.numel()

    def gradient(self, x, y, clip: bool = True) -> tuple[torch.Tensor, float, int]:
        """(flat gradient of the batch's mean loss at the loaded weights, loss sum, samples).
        With ``clip``, clipped as --clip-grad-norm asks, as an async worker clips before its
        push (sync clips the average instead: :meth:`clip`)."""
        for p in self.params:
            p.grad = None
        stats = self.replica.forward_backward(x, y, grad_scale=1.0)
        if clip:
            self.clip()
        grad = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                          for p in self.params])
        return grad, stats.loss_sum.item(), stats.count

    def clip(self) -> None:
        """--clip-grad-norm on the parameters' gradients, as precision.Precision.update does."""
        if self.clip_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_([p for p in self.params if p.grad is not None],
                                           self.clip_grad_norm)

    def set_gradient(self, flat_grad: torch.Tensor) -> None:
        offset = 0
        for p in self.params:
            p.grad = flat_grad[offset:offset + p.numel()].view_as(p)
            offset += p.numel()

    def evaluate(self, test) -> tuple[float | None, float | None]:
        """(test loss, test accuracy) of the loaded weights over the whole test split."""
        if test is None:
            return None, None
        stats = self.replica.evaluate(test.eval_batches(0, 1, EVAL_BATCH))
        if stats is None or not stats.count:
            return None, None
        acc = stats.metrics.get("acc")
        return (stats.loss_sum.item() / stats.count,
                float(acc[0]) / float(acc[1]) if acc and float(acc[1]) else None)


@dataclass
class _Setup:
    """The Config a real run of these train flags gets, its workload, and the model with the
    initial weights a real run draws."""

    cfg: Config
    workload: object
    model: _FlatModel
    straggler: StragglerModel

    @classmethod
    def build(cls, train_args: Sequence[str], seed: int, straggler: str, mode: Mode) -> _Setup:
        from ..workload import workload_from_config

        cfg = config_from_train_args(train_args, {"seed": seed, "straggler": straggler,
                                                  **mode.config_options()})
        if cfg.run.precision == "fp16":
            raise ConfigError("--precision fp16: the simulator does not model the loss scale; "
                              "use 32 or bf16")
        if not mode.is_async and cfg.sync.reduce_op == "adasum":
            raise ConfigError("--reduce-op adasum: the simulator averages gradients; use average")
        workload = workload_from_config(cfg)
        device = torch.device("cpu")
        torch.manual_seed(cfg.run.seed)  # as launch.run: every replica draws these weights
        module = workload.build_model()
        workload.name = workload.name or type(module).__name__
        replica = Replica(module, device, workload.objective(), Precision(cfg.run.precision,
                                                                          [device]))
        workload.bind(device, cfg)
        replica.model.eval()  # as launch: the check must not move BatchNorm statistics
        workload.check(replica.forward, device)
        replica.model.train()
        replica.objective = workload.objective()  # without the metrics the check dropped
        model = _FlatModel(replica, cfg.optim.clip_grad_norm)
        return cls(cfg, workload, model, parse_straggler(straggler))


def config_from_train_args(train_args: Sequence[str], overrides: dict) -> Config:
    """The Config that ``hvdtrain train TRAIN_ARGS`` builds, with ``overrides`` (flag names with
    underscores) set on top. ConfigError for flags that train does not take."""
    from ..train_flags import config_from_args, parse_train_flags

    given = parse_train_flags(train_args, "train flags")
    for name, value in overrides.items():
        setattr(given, name, value)
    given.data_workers = 0  # dozens of virtual workers must not each start loader processes
    return config_from_args(given)


def _average_into(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Every tensor becomes their mean (an allreduce with hvd.Average); returns the first."""
    mean = torch.stack(tensors).mean(dim=0)
    for t in tensors:
        t.copy_(mean)
    return tensors[0]


def _apply(optimizer: ShardOptimizer, chunks: list[tuple[int, int]], grad: torch.Tensor,
           lr: float) -> None:
    for i, (a, b) in enumerate(chunks):
        optimizer.apply(i, grad[a:b], lr)


# --- the virtual workers --------------------------------------------------------------------------
@dataclass
class _Worker:
    rank: int
    plan: EpochPlan
    steps: int = 0                        # steps taken: the global_step of a real worker
    batches: Iterator | None = None
    rng: torch.Tensor | None = None       # its own torch generator state (dropout and the like)
    params: torch.Tensor | None = None    # async and local SGD: its own copy of the weights
    pulled_version: int = 0               # async: the server's version it last received
    optimizer: ShardOptimizer | None = None  # local SGD: its own optimizer state
    started: float = 0.0                  # virtual time its current step began
    piece: tuple[int, int, int] | None = None  # the job's batches: the piece of the plan it holds
    slot: int = NO_SLOT                   # ... and its slot number
    position: int = 0                     # ... the job's global step after its last piece
    _pieces: list = field(default_factory=list)  # ... fed to its batch source
    _piece_batches: Iterator | None = None
    _seeded_epoch: int = -1

    def next_batch(self):
        """The batch a real worker of this rank trains on at its next step: its own share's
        next one, or the piece of the job's plan it was handed (async, backup workers:
        ps/dispatch.py)."""
        if self.piece is not None:
            return self._piece_batch()
        per_epoch = self.plan.steps_per_epoch
        if self.steps % per_epoch == 0:  # an epoch begins; the plan seeds torch as a real one does
            self.batches = self.plan.batches(Progress(epoch=self.steps // per_epoch,
                                                      global_step=self.steps,
                                                      workers=self.plan.num_workers))
            self.rng = torch.get_rng_state()
        return next(self.batches)

    def _piece_batch(self):
        epoch, step, _ = self.piece
        if epoch != self._seeded_epoch:  # as EpochPlan.batches seeds a real worker's epoch
            self.plan.seed_epoch(epoch)
            self.rng, self._seeded_epoch = torch.get_rng_state(), epoch
        if self._piece_batches is None:
            run = self.plan.run
            pieces = iter(lambda: self._pieces.pop(0), None)  # read lazily, one at a time
            self._piece_batches = self.plan.source.part_batches(pieces, self.plan.num_workers,
                                                                run.batch_size, run.seed)
        self._pieces.append(self.piece)
        self.position = max(self.position, epoch * self.plan.steps_per_epoch + step + 1)
        return next(self._piece_batches)


# --- the run --------------------------------------------------------------------------------------
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


# --- entry points ---------------------------------------------------------------------------------
def run_name(mode: Mode, workers: int, straggler: str, seed: int) -> str:
    """A simulated run's name: like a real run's (plan.py), with its number of workers."""
    slug = re.sub(r"[^\w.@-]", "-", straggler)
    return f"{mode.name}-n{workers}-seed{seed}" + (f"-straggler{slug}" if straggler else "")


def failed_result(mode: Mode, workers: int, straggler: str, seed: int, reason: str) -> RunResult:
    return RunResult(run_name(mode, workers, straggler, seed), mode.name, straggler or "none",
                     seed, "failed", reason, None, None, None, None, None, [], {},
                     workers=workers, simulated=True)


def simulate_run(mode: Mode, workers: int, straggler: str, seed: int, train_args: Sequence[str],
                 target: float, timing: Timing, eval_every_steps: int | None = None,
                 stop_at_target: bool = False,
                 delays: StragglerModel | None = None) -> RunResult:
    """One simulated run: the RunResult a real run of ``mode`` on ``workers`` workers would
    report, on the virtual clock. ``train_args`` are hvdtrain train flags (dataset, model,
    epochs, batch size, optimizer...). Evaluations fall where a real run's do: at the ends of
    epochs (--eval-every) and every --eval-every-steps global steps, which ``eval_every_steps``
    overrides (a global step is every worker's batch once: a sync round, N async pushes).
    With ``stop_at_target`` the run ends at the first evaluation at or above ``target`` (its
    figures are then those up to there), as the time to target is all a sweep needs.
    ``delays``, in place of ``straggler``'s model, gives each worker's delay per step (an
    object with StragglerModel.delay, e.g. the per-worker fit of compare --from-run).
    Raises ConfigError for what cannot run (e.g. too few samples for N workers)."""
    return Simulation(mode, workers, straggler, seed, train_args, target, timing,
                      eval_every_steps, stop_at_target, delays).run()


def strong_scaling_args(train_args: Sequence[str], workers: int,
                        global_batch: int) -> list[str]:
    """``train_args`` for ``workers`` workers that share a global batch of ``global_batch``
    samples (strong scaling): --batch-size global_batch / workers, and --lr scaled with the
    per-worker batch (lr x batch / the flags' batch), so that under --lr-scaling linear sync's
    rate, lr x workers, is the same at every number of workers (with --lr-scaling none sync's
    rate is --lr itself, which is then kept). Only the warmup differs: it ramps from one
    worker's rate, which is lower with more workers. The number of global steps per epoch,
    samples // workers // batch, is then samples // global_batch whatever the workers, and
    so are the global batches themselves (data/builtin.py epoch_batches): sync trains the
    same model at every N. ConfigError if ``workers`` does not divide ``global_batch``."""
    if workers < 1 or global_batch % workers:
        raise ConfigError(f"{workers} workers cannot split the global batch of {global_batch} "
                          "evenly; use numbers of workers that divide it, or another "
                          "--global-batch")
    cfg = config_from_train_args(train_args, {})
    batch = global_batch // workers
    lr = cfg.optim.lr
    if cfg.optim.lr_scaling == "linear":
        lr *= batch / cfg.run.batch_size
    return [*train_args, "--batch-size", str(batch), "--lr", repr(lr)]  # the later flags win


def sweep(modes: Sequence[Mode], worker_counts: Sequence[int], train_args: Sequence[str],
          target: float, timing: Timing | Callable[[int], Timing],
          stragglers: Sequence[str] = ("",), seeds: Sequence[int] = (0,),
          eval_every_steps: int | None = None,
          progress: Callable[[RunResult], None] | None = None,
          global_batch: int | None = None, stop_at_target: bool = False) -> list[RunResult]:
    """Every (straggler, workers, mode, seed), simulated. ``timing`` may depend on the number of
    workers (a callable), as a calibrated allreduce or a per-worker batch does. With
    ``global_batch`` the workers share that global batch (strong scaling, see
    strong_scaling_args); without, each worker takes the flags' --batch-size (weak scaling).
    A combination that cannot run (too few samples for N workers' batches, a global batch that
    N workers cannot share) is a failed RunResult with the reason, not an exception."""
    results = []

    def record(result: RunResult) -> None:
        results.append(result)
        if progress is not None:
            progress(result)

    for straggler in stragglers:
        straggler = "" if straggler.strip().lower() in ("", "none") else straggler.strip()
        for workers in worker_counts:
            runs = [(mode, seed) for mode in modes for seed in seeds]
            try:
                args = (strong_scaling_args(train_args, workers, global_batch)
                        if global_batch else list(train_args))
                figures = timing(workers) if callable(timing) else timing
            except ConfigError as e:  # every run at this number of workers fails alike
                for mode, seed in runs:
                    record(failed_result(mode, workers, straggler, seed, str(e)))
                continue
            for mode, seed in runs:
                try:
                    record(simulate_run(mode, workers, straggler, seed, args, target, figures,
                                        eval_every_steps, stop_at_target))
                except ConfigError as e:
                    record(failed_result(mode, workers, straggler, seed, str(e)))
    return results
