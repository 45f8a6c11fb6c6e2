"""Layer-split model parallelism inside one rank: the model's ordered layers cut into K stages,
each on its own device, fed micro-batches.

The split and the device assignment are pure functions (unit-tested without devices). The
replica below replaces ``replica.Replica`` behind the same methods, so the trainer and both
update schemes drive it unchanged: Horovod allreduces every stage's gradients (they are all
parameters of this rank's model), and the parameter server flattens every stage's parameters.

How one batch runs. The batch is cut into M micro-batches. Each stage runs in its own thread,
so stage k can work on micro-batch m while stage k+1 works on micro-batch m-1: torch releases
the GIL inside its kernels, and each device (or CPU core) computes independently. The autograd
graph is cut at every stage boundary: stage k+1 receives a detached copy of stage k's output,
and in the backward pass hands the gradient of that input back to stage k, which continues its
own backward from there. Each micro-batch's loss is weighted by its share of the batch, so the
gradients that accumulate over the M backward passes are the gradient of the whole batch's mean
loss: the update equals the unsplit model's. A gradient crosses a boundary only where one flows:
a stage whose output does not require grad (nothing up to it trains: a Flatten or a frozen layer
first, or integer token ids) hands on a plain tensor and has no backward to do, so stages without
parameters work anywhere in the split.

Schedules: ``gpipe`` (every stage does all its forwards, then all its backwards), ``1f1b`` (after
a warm-up of K-1-k forwards, stage k alternates one forward and one backward, so at most K-k
micro-batches' activations are alive in it), and ``sequential`` (one thread, one stage after
another: the naive split the benchmark compares against).
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
import torch.nn as nn

from .config import Config, ConfigError, PipelineConfig
from .layout import Layout
from .data.batches import to_device
from .precision import Precision
from .replica import BatchStats, Objective, Replica, batch_length, split_batch
from .runtime import Runtime


# --- the split: pure arithmetic ---------------------------------------------------------------
def balanced_bounds(sizes: list[int], stages: int) -> list[tuple[int, int]]:
    """Cut layers with parameter counts ``sizes`` into ``stages`` contiguous, non-empty groups
    whose largest parameter count is as small as possible (ties: the fewest layers in the
    largest group). Returns [start, end) layer ranges."""
    n = len(sizes)
    if not 1 <= stages <= n:
        raise ConfigError(f"--stages {stages}: the model has {n} layers and every stage needs at "
                          f"least one; use --stages between 1 and {n}")
    prefix = [0]
    for s in sizes:
        prefix.append(prefix[-1] + s)

    def cost(a: int, b: int) -> tuple[int, int]:
        return prefix[b] - prefix[a], b - a

    # best[k][i]: the best (largest group cost) for the first i layers in k groups; cut[k][i]: the
    # start of the last of those groups.
    inf = (float("inf"), float("inf"))
    best = [[inf] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = (0, 0)
    for k in range(1, stages + 1):
        for i in range(k, n - (stages - k) + 1):
            for j in range(k - 1, i):
                candidate = max(best[k - 1][j], cost(j, i))
                if candidate < best[k][i]:
                    best[k][i], cut[k][i] = candidate, j
    bounds, end = [], n
    for k in range(stages, 0, -1):
        start = cut[k][end]
        bounds.append((start, end))
        end = start
    return bounds[::-1]


def explicit_bounds(points: tuple[int, ...], num_layers: int) -> list[tuple[int, int]]:
    """Stages that begin at the given layer indices (stage 1 begins at 0)."""
    edges = [0, *points, num_layers]
    if any(b <= a for a, b in zip(edges, edges[1:])):
        raise ConfigError(
            f"--split-points {','.join(map(str, points))}: split points must rise strictly "
            f"between 1 and {num_layers - 1} (the model has {num_layers} layers, so the stages "
            f"would be layers {' | '.join(f'{a}..{b - 1}' for a, b in zip(edges, edges[1:]))})")
    return list(zip(edges, edges[1:]))


def sequential_layers(model: nn.Module) -> nn.Sequential:
    """The ordered layers to split: the model itself, or its ``.layers`` Sequential. The stages
    run those layers in order and never the model's own forward, so a model with parameters or
    buffers outside ``layers`` (a skip connection's) is refused: they would silently take no
    part in any step (a model with a residual around ``layers`` trained to 0.79 against 0.85
    unsplit, and its skip layer never moved)."""
    if isinstance(model, nn.Sequential):
        return model
    layers = getattr(model, "layers", None)
    if isinstance(layers, nn.Sequential):
        inside = {id(t) for t in [*layers.parameters(), *layers.buffers()]}
        outside = [name for name, t in [*model.named_parameters(), *model.named_buffers()]
                   if id(t) not in inside]
        if outside:
            shown = ", ".join(outside[:4]) + (f" and {len(outside) - 4} more"
                                              if len(outside) > 4 else "")
            raise ConfigError(
                f"--stages: {type(model).__name__} has {shown} outside its `layers` Sequential; "
                "the stages run `layers` alone, in order (not the model's forward), so those "
                "would take no part in training. Put every layer of the computation into "
                "`layers` in order, or use --stages 1")
        return layers
    hint = ("; its `layers` is a ModuleList: make it nn.Sequential(*layers) and call it in "
            "forward" if isinstance(layers, nn.ModuleList) else
            "; give it a `layers` nn.Sequential of every layer in order, which forward calls")
    raise ConfigError(f"--stages: {type(model).__name__} is not an nn.Sequential and has no "
                      f"`layers` Sequential, so it cannot be split by layers{hint}, or use "
                      "--stages 1")


def most_stages_sharing(model: nn.Module, stages: list[nn.Sequential], devices: list[str]) -> int:
    """The most stages that use one parameter: 1, or more for tied weights (a language model's
    token embedding and output head share theirs). Each stage's backward adds into the shared
    gradient, so Horovod's hook on it fires once per such stage and micro-batch, and Horovod
    must expect that many passes (its count ran out: an AssertionError inside Horovod). A
    parameter is on one device, so stages that share one must be on it: refused otherwise."""
    users: dict[int, list[int]] = {}
    for k, stage in enumerate(stages):
        for p in stage.parameters():
            users.setdefault(id(p), []).append(k)
    names = {id(p): name for name, p in model.named_parameters()}
    for key, ks in users.items():
        places = sorted({devices[k] for k in ks})
        if len(places) > 1:
            raise ConfigError(
                f"--stages: the parameter {names.get(key, '?')} is used by stages "
                f"{', '.join(map(str, ks))}, which --devices puts on {' and '.join(places)}; a "
                "parameter lives on one device, so give those stages one device (--devices), "
                "move --split-points so that one stage holds every layer that uses it, or untie "
                "it")
    return max(map(len, users.values()), default=1)


def gpipe_bubble(stages: int, micro_batches: int) -> float:
    """The idle share of each stage under GPipe with equal stage times: (K-1)/(M+K-1)."""
    return (stages - 1) / (micro_batches + stages - 1)


def stage_program(schedule: str, stage: int, stages: int, micro_batches: int) -> list[tuple[str, int]]:
    """The order of one stage's work: ("F", m) forwards and ("B", m) backwards."""
    m = micro_batches
    if schedule == "1f1b":
        warmup = min(stages - 1 - stage, m)
        ops = [("F", i) for i in range(warmup)]
        for i in range(m - warmup):
            ops += [("F", warmup + i), ("B", i)]
        return ops + [("B", i) for i in range(m - warmup, m)]
    return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]


# --- random numbers: each device has one generator ----------------------------------------------
def _generator(device: torch.device) -> torch.Generator:
    """The default generator that layers on ``device`` draw from (dropout's masks)."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return torch.cuda.default_generators[index]
    return torch.default_generator


def _forked_rng(device: torch.device):
    """Every generator ``device``'s layers use, put back as it was at the end."""
    cuda = [_generator(device).device.index] if device.type == "cuda" else []
    return torch.random.fork_rng(devices=cuda)


# --- the replica ------------------------------------------------------------------------------
class _Aborted(Exception):
    """Another stage failed; this one stops waiting for it."""


class PipelineReplica(Replica):
    def __init__(self, model: nn.Module, devices: list[str], cfg: PipelineConfig,
                 objective: Objective | None = None, precision: Precision | None = None):
        layers = sequential_layers(model)
        self.objective = objective or Objective.classification()
        stages = len(devices)
        bounds = (explicit_bounds(cfg.split_points, len(layers)) if cfg.split_points else
                  balanced_bounds([sum(p.numel() for p in layer.parameters()) for layer in layers],
                                  stages))
        self.model = model
        self.devices = [torch.device(d) for d in devices]
        self.device = self.devices[0]            # where the trainer puts the inputs
        self.bounds = bounds
        sharing = most_stages_sharing(model, [layers[a:b] for a, b in bounds], devices)
        self.stages = [layers[a:b].to(dev) for (a, b), dev in zip(bounds, self.devices)]
        self.run_stages: list = list(self.stages)  # what a forward calls (--compile wraps them)
        # One loss scale and one clipping norm over every stage's parameters.
        self.precision = precision or Precision("32", self.devices)
        self.micro_batches = cfg.micro_batches
        self.schedule = cfg.schedule
        # Horovod allreduces a gradient after the last of its backward passes in a step: one
        # per micro-batch, and one per stage that uses it (tied weights, most_stages_sharing)
        self.backward_passes = cfg.micro_batches * sharing
        self._pool = (ThreadPoolExecutor(stages, thread_name_prefix="stage")
                      if cfg.schedule != "sequential" and stages > 1 else None)
        self._busy = [0.0] * stages
        self._wall = 0.0
        # Stages that share a device (every CPU stage) share its generator, and their threads
        # would draw dropout's masks from it in whatever order they run: a run could not be
        # repeated or resumed exactly. A stage that draws (learned at its first forward) seeds
        # the generator for each micro-batch and holds the device's lock while it draws.
        self._rng_locks = {d: threading.Lock() for d in set(self.devices)}
        self._draws: list[bool | None] = [None] * stages

    @contextlib.contextmanager
    def eager(self):
        compiled, self.run_stages = self.run_stages, list(self.stages)
        try:
            yield self
        finally:
            self.run_stages = compiled

    @contextlib.contextmanager
    def seeded(self, k: int, seed: int):
        """Stage k's forward, its random numbers drawn from ``seed`` whatever the other stages'
        threads draw meanwhile."""
        if self._draws[k] is False:
            yield
            return
        generator = _generator(self.devices[k])
        with self._rng_locks[self.devices[k]]:
            generator.manual_seed(seed)
            before = generator.get_state() if self._draws[k] is None else None
            yield
            if before is not None:
                self._draws[k] = not torch.equal(before, generator.get_state())

    def describe(self) -> str:
        return " | ".join(f"layers {a}-{b - 1} on {d}" for (a, b), d in zip(self.bounds, self.devices))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for stage, dev in zip(self.run_stages, self.devices):
            with self.precision.autocast(dev):
                x = stage(to_device(x, dev))
        return x

    def checked_forward(self, x: Any) -> Any:
        """forward on the start-up check's sample batch, refusing what a split cannot run: an
        input that is not one tensor (the first stage takes it whole, where the model's own
        forward would unpack a dict or a tuple), a stage that would hand the next one something
        else than a tensor, and a forward that computes more than ``layers`` in order."""
        if not isinstance(x, torch.Tensor):
            raise ConfigError(
                f"--stages: the samples' inputs are a {type(x).__name__}, and a split model's "
                "first stage takes one tensor (the stages call `layers`, not the model's "
                "forward, which would unpack it): return one input tensor per sample from the "
                "data, or use --stages 1")
        sample = x
        for k, (stage, dev) in enumerate(zip(self.run_stages, self.devices)):
            with self.precision.autocast(dev):
                x = stage(to_device(x, dev))
            if k < len(self.stages) - 1 and not isinstance(x, torch.Tensor):
                a, b = self.bounds[k]
                raise ConfigError(
                    f"--stages: stage {k + 1} (layers {a}-{b - 1}) ends with layer {b - 1}, a "
                    f"{type(self.stages[k][-1]).__name__}, which returns a {type(x).__name__}; "
                    f"a stage hands the next one a single tensor: choose --split-points so "
                    f"that no stage ends there (stage {k + 2} begins at layer {b}), or use "
                    "--stages 1")
        for training in (False, True):
            self._check_same_as_forward(sample, training)
        return x

    def _check_same_as_forward(self, sample: Any, training: bool) -> None:
        """The stages run ``layers`` alone and never the model's forward, so what forward does
        besides (a parameter-free skip connection, a scale, dropout of its own) would silently
        not be trained (sequential_layers refuses only parameters outside ``layers``). Compared
        where every stage is on one device, on which the model's forward can run: in eval mode,
        and in training mode from one seed with the BatchNorm statistics put back after."""
        if isinstance(self.model, nn.Sequential) or len(set(self.devices)) > 1:
            return
        model, dev = self.model, self.devices[0]
        was_training, saved = model.training, [b.clone() for b in model.buffers()]
        try:
            model.train(training)
            with torch.no_grad(), self.precision.autocast(dev), _forked_rng(dev):
                outputs = []
                for run in (self.forward, model):
                    torch.default_generator.manual_seed(0)
                    _generator(dev).manual_seed(0)
                    outputs.append(run(to_device(sample, dev)))
        except Exception:  # noqa: BLE001  a forward that cannot run here is not compared
            return
        finally:
            model.train(was_training)
            with torch.no_grad():
                for buffer, value in zip(model.buffers(), saved):
                    buffer.copy_(value)
        out, own = outputs
        if (isinstance(own, torch.Tensor) and isinstance(out, torch.Tensor)
                and own.shape == out.shape
                and torch.allclose(own.float(), out.float(), rtol=1e-4, atol=1e-5)):
            return
        raise ConfigError(
            f"--stages: {type(self.model).__name__}'s forward computes something else than "
            f"its `layers` in order (on a sample batch in {'training' if training else 'eval'} "
            "mode their outputs differ): the stages run `layers` alone, so what forward adds "
            "(a skip connection, a scale, an activation, dropout) would not be trained. Make "
            "forward return self.layers(x) and move the rest into `layers` as modules, or use "
            "--stages 1")

    def forward_backward(self, x: torch.Tensor, y: torch.Tensor, grad_scale: float) -> BatchStats:
        run = _Run(self, x, y, grad_scale)
        started = time.perf_counter()
        if self._pool is None:
            run.sequential()
        else:
            futures = [self._pool.submit(run.stage, k) for k in range(len(self.stages))]
            errors = []
            for f in futures:
                try:
                    f.result()
                except _Aborted:
                    pass
                except BaseException as e:  # noqa: BLE001  re-raised below, first one wins
                    errors.append(e)
            if errors:
                raise errors[0]
        self._wall += time.perf_counter() - started
        for k, seconds in enumerate(run.busy):
            self._busy[k] += seconds
        return run.stats()

    def take_epoch_metrics(self) -> dict:
        """Time each stage computed, the schedule's wall time, and the idle share (bubble)
        beside GPipe's formula; resets the counters."""
        k = len(self.stages)
        measured = 1 - sum(self._busy) / (k * self._wall) if self._wall else None
        out = {"pipeline": {"stages": k, "micro_batches": self.micro_batches,
                            "schedule": self.schedule, "devices": [str(d) for d in self.devices],
                            "layers": [list(b) for b in self.bounds],
                            "stage_busy_seconds": [round(s, 4) for s in self._busy],
                            "schedule_seconds": round(self._wall, 4),
                            "bubble_fraction": None if measured is None else round(measured, 4),
                            "gpipe_bubble_formula": round(gpipe_bubble(k, self.micro_batches), 4)}}
        self._busy, self._wall = [0.0] * k, 0.0
        return {**super().take_epoch_metrics(), **out}


class _Run:
    """One batch's trip through the stages: micro-batch tensors, the hand-offs between stages,
    and each stage's busy time."""

    def __init__(self, replica: PipelineReplica, x: torch.Tensor, y: torch.Tensor,
                 grad_scale: float):
        self.r = replica
        k = len(replica.stages)
        total = batch_length(y)
        m = min(replica.micro_batches, total)
        self.xs, self.ys = split_batch(x, m), split_batch(y, m)
        self.m = m
        self.weights = [batch_length(ys) / total * grad_scale for ys in self.ys]
        self.inputs: list[dict[int, torch.Tensor]] = [{} for _ in range(k)]
        self.outputs: list[dict[int, torch.Tensor]] = [{} for _ in range(k)]
        self.losses: dict[int, torch.Tensor] = {}
        self.sums: dict[int, BatchStats] = {}
        # activations[k]: inputs waiting for stage k; grads[k]: gradients of stage k's outputs
        self.activations = [queue.Queue() for _ in range(k)]
        self.grads = [queue.Queue() for _ in range(k)]
        self.busy = [0.0] * k
        self.failed = threading.Event()
        # drawn before the stages' threads start, so it follows the step's seed (epoch_plan.py)
        self.seed = int(torch.randint(2**62, (1,)).item())

    # --- one unit of work each ---
    def forward(self, k: int, i: int) -> None:
        dev = self.r.devices[k]
        inp = to_device(self.xs[i], dev) if k == 0 else self._take(self.activations[k])
        t0 = time.perf_counter()
        # per thread: every stage enters autocast, and seeds its dropout per micro-batch
        with self.r.precision.autocast(dev), self.r.seeded(k, hash((self.seed, k, i)) % 2**62):
            out = self.r.run_stages[k](inp)
            if k == len(self.r.stages) - 1:
                self.losses[i], self.sums[i] = self.r.objective.score(
                    out, to_device(self.ys[i], dev))
        if k < len(self.r.stages) - 1:
            # Cut the graph here: the next stage starts from a leaf that collects the gradient,
            # if there is one to collect (the stages up to here may hold nothing to train).
            self.activations[k + 1].put(
                out.detach().to(self.r.devices[k + 1]).requires_grad_(out.requires_grad))
        self._timed(k, t0)
        self.inputs[k][i], self.outputs[k][i] = inp, out

    def backward(self, k: int, i: int) -> None:
        inp, out = self.inputs[k].pop(i), self.outputs[k].pop(i)
        last = k == len(self.r.stages) - 1
        # An output that needs no gradient went on as a plain tensor: none comes back for it.
        grad = self._take(self.grads[k]) if not last and out.requires_grad else None
        t0 = time.perf_counter()
        if last:
            self.r.precision.backward(self.losses[i] * self.weights[i])
        elif grad is not None:
            out.backward(grad)
        self._timed(k, t0)
        if k > 0 and inp.requires_grad:  # stage k-1 handed on a leaf and waits for its gradient
            grad_in = inp.grad  # None when nothing in this stage depends on it differentiably
            self.grads[k - 1].put(None if grad_in is None else grad_in.to(self.r.devices[k - 1]))

    # --- drivers ---
    def stage(self, k: int) -> None:
        """Stage k's thread: its program of forwards and backwards, in order."""
        try:
            for op, i in stage_program(self.r.schedule, k, len(self.r.stages), self.m):
                (self.forward if op == "F" else self.backward)(k, i)
        except _Aborted:
            raise
        except BaseException:
            self.failed.set()  # the other stages stop waiting for this one
            raise

    def sequential(self) -> None:
        k = len(self.r.stages)
        for i in range(self.m):
            for s in range(k):
                self.forward(s, i)
        for i in range(self.m):
            for s in reversed(range(k)):
                self.backward(s, i)

    def stats(self) -> BatchStats:
        total = self.sums[0]
        for i in range(1, self.m):
            total += self.sums[i]
        return total

    # --- helpers ---
    def _take(self, channel: queue.Queue) -> torch.Tensor:
        while True:
            try:
                return channel.get(timeout=0.2)
            except queue.Empty:
                if self.failed.is_set():
                    raise _Aborted() from None

    def _timed(self, k: int, t0: float) -> None:
        dev = self.r.devices[k]
        if dev.type == "cuda":  # kernels are asynchronous: count them where they finish
            torch.cuda.synchronize(dev)
        self.busy[k] += time.perf_counter() - t0


def build_replica(model: nn.Module, cfg: Config, runtime: Runtime, layout: Layout,
                  objective: Objective) -> Replica:
    """The plain replica, or the pipelined one when --stages > 1."""
    pl = cfg.pipeline
    if pl.stages == 1:
        replica = Replica(model, runtime.device, objective,
                          Precision(cfg.run.precision, [runtime.device], cfg.optim.clip_grad_norm))
        return compile_replica(replica) if cfg.run.compile else replica
    _check_batchnorm_micro_batches(model, cfg)
    devices = list(layout.stage_devices)
    if devices[0].startswith("cuda"):
        torch.cuda.set_device(torch.device(devices[0]))
    if not cfg.run.threads and pl.schedule != "sequential" and "cpu" in devices:
        # The stages' threads compute at the same time: share this process's cores among them.
        torch.set_num_threads(max(1, torch.get_num_threads() // devices.count("cpu")))
    replica = PipelineReplica(model, devices, pl, objective,
                              Precision(cfg.run.precision, [torch.device(d) for d in devices],
                                        cfg.optim.clip_grad_norm))
    return compile_replica(replica) if cfg.run.compile else replica


def _check_batchnorm_micro_batches(model: nn.Module, cfg: Config) -> None:
    """BatchNorm cannot take a micro-batch of one sample in training (torch raises at the first
    step, after the start-up check in eval mode passed)."""
    per_pass = cfg.run.batch_size // cfg.sync.backward_passes_per_step
    norm = next((m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)),
                None)
    if norm is not None and per_pass // cfg.pipeline.micro_batches < 2:
        raise ConfigError(
            f"--micro-batches {cfg.pipeline.micro_batches}: a backward pass of {per_pass} "
            f"samples would be cut into micro-batches of a single sample, and the model's "
            f"{type(norm).__name__} needs 2 or more in training; use at most {per_pass // 2} "
            "micro-batches, or a larger --batch-size")


def compile_replica(replica: Replica) -> Replica:
    """--compile: what the forward passes call becomes torch.compile's wrapper (compile.py)."""
    from .compile import compile_module

    if isinstance(replica, PipelineReplica):
        replica.run_stages = [compile_module(stage, f"pipeline stage {k + 1}")
                              for k, stage in enumerate(replica.stages)]
    else:
        replica.run_model = compile_module(replica.model, type(replica.model).__name__)
    return replica
