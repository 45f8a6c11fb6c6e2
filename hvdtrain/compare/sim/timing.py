"""What things cost on the simulator's virtual clock (Timing), and measuring them in-process
(measure_timing): a worker's step and the server's update, timed on real batches."""

from __future__ import annotations

import math
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from ...config import ConfigError
from ...loop.epoch_plan import EpochPlan
from ...ps.protocol import chunk_bounds, chunk_elements
from ...ps.shard_optimizer import ShardOptimizer
from ...replica import batch_length, split_batch
from ...scheme import Progress
from ..plan import Mode
from .flat_model import _FlatModel, _Setup
from .link import Link


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
    # A link that prices each exchange by its bytes (link.py); given, it wins over
    # allreduce_seconds and push_seconds.
    link: Link | None = None
    # The server's link where it is not the ring's (compare --links: the pairs of the server's
    # host); None: the server's pushes and replies cross ``link``.
    server_link: Link | None = None
    # The workers on the server's host (the lab's worker 1, link_lab.py): their pushes and
    # replies move through shared memory, off the link. The other workers' pushes cross the
    # link without holding the server, which takes a slow link's gradient in the background
    # (ps/arrivals.py; until stop 57 it waited in the receive, 61 ms for a 77 KB push at
    # 10 Mbit/s, and held worker 1 as long). Empty: every push and reply crosses the server's
    # link, queued there in turn (link.py SharedLink).
    beside_server: tuple[int, ...] = ()

    def average_seconds(self, nbytes: float, workers: int) -> float:
        """One average of ``nbytes`` over ``workers``: the link's ring, or allreduce_seconds."""
        return self.link.ring_seconds(nbytes, workers) if self.link else self.allreduce_seconds

    def describe_network(self) -> str:
        """What the exchanges cost, in words, for the report."""
        if self.server_link is not None and self.link is not None:
            return (f"links price each exchange by its bytes: a ring average's of "
                    f"{self.link.mbit:.4g} Mbit/s and {self.link.latency_seconds * 1000:.3g} ms "
                    f"latency, the server's shared link of {self.server_link.mbit:.4g} Mbit/s "
                    f"and {self.server_link.latency_seconds * 1000:.3g} ms (frames, as the "
                    "link model counts)")
        if self.link is not None:
            return (f"a link of {self.link.mbit:g} Mbit/s and {self.link.latency_seconds * 1000:g}"
                    " ms latency prices each exchange by its bytes (a ring average; a push and "
                    "a pull over the server's shared link)")
        return (f"an average costs {self.allreduce_seconds * 1000:g} ms and a push "
                f"{self.push_seconds * 1000:g} ms")

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
        for link in (self.link, self.server_link):
            if link is not None:
                link.check()


def measure_timing(train_args: Sequence[str], seed: int = 0, repeats: int = 30, warmup: int = 5,
                   allreduce_seconds: float = 0.0, push_seconds: float = 0.0,
                   step_seconds: float | None = None, apply_seconds: float | None = None,
                   sample_seconds: float | None = None, link: Link | None = None,
                   under: Mode | None = None) -> Timing:
    """The compute time of one worker's step (the median of ``repeats`` real forward and
    backward passes over real batches, after ``warmup`` that are not counted) and the server's
    time to apply one gradient (likewise), measured in this process unless given (the measured
    figures drift with the machine's load, so invocations meant to share one clock give them).
    A measured step also gives its part per sample (Timing.sample_seconds), from half batches
    timed in turn with the whole ones; a given one has ``sample_seconds`` (None: it grows in
    proportion to its samples).
    Communication cannot be measured in one process: pass the figures or a ``link``, or 0 for
    an ideal network. ``under``: the mode whose Config reads the flags (sync's by default; the
    server's update is then --optimizer's, as plain async's)."""
    if step_seconds is not None and apply_seconds is not None:
        return Timing(step_seconds, apply_seconds, allreduce_seconds, push_seconds,
                      sample_seconds=sample_seconds, link=link)
    setup = _Setup.build(train_args, seed, "", under or Mode("sync", scheme="sync"))
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
    return Timing(step, apply, allreduce_seconds, push_seconds, sample_seconds=per_sample,
                  link=link)


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
            _, _, counts[parts], _ = model.gradient(split_batch(x, parts)[0],
                                                    split_batch(y, parts)[0])
            if i >= warmup:
                seconds[parts].append(time.perf_counter() - started)
    full = statistics.median(seconds[1])
    _warn_if_loaded(seconds[1])
    if not seconds[2] or counts[1] <= counts[2]:
        return full, None
    slope = (full - statistics.median(seconds[2])) / (counts[1] - counts[2])
    return full, min(max(slope, 0.0), full / counts[1])


# Quartiles of one step's time further apart than this: other work shared the cores while it
# was timed (on a quiet host they lie within a few percent), and the median may be off by
# as much, which every simulated run then carries.
LOADED_SPREAD = 1.5


def _warn_if_loaded(seconds: list[float]) -> None:
    if len(seconds) < 4:
        return
    low, _, high = statistics.quantiles(seconds, n=4)
    if low > 0 and high / low > LOADED_SPREAD:
        print(f"hvdtrain compare: warning: a step's compute time varied from {low * 1e3:.3g} "
              f"to {high * 1e3:.3g} ms (quartiles) while it was measured: other work shares "
              "this host's cores, and the simulated times carry the error; measure on a quiet "
              "host, or give the step's time with --sim-step-ms", file=sys.stderr, flush=True)


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


def _apply(optimizer: ShardOptimizer, chunks: list[tuple[int, int]], grad: torch.Tensor,
           lr: float) -> None:
    for i, (a, b) in enumerate(chunks):
        optimizer.apply(i, grad[a:b], lr)

