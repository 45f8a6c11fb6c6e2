"""--balance: each worker's share of a fixed global batch, in proportion to its measured speed.

One definition, used by the real run (balance.py, re-planned at epoch ends from the measured
step times) and by the simulator (compare/sim/, mode ``balanced``).

A worker that computed ``samples[i]`` samples per step in ``compute[i]`` seconds per step has a
throughput of ``samples[i] / compute[i]``; the next shares are the global batch split in
proportion to those throughputs. If a step's time were proportional to its samples, the next
steps would take equally long on every worker. Where a step also has a fixed part, the shares
approach that point over a few re-plans instead, so each re-plan moves only ``damping`` of the
way (1: all of it), which keeps the shares from swinging. A floor keeps every worker in the
round, so that its speed is still measured and a device that recovers gets its share back.

Gradients: each worker's mean-loss gradient is weighted by its share of the global batch
(``gradient_weight``), so that Horovod's average of them is the mean-loss gradient of the
whole global batch, as one process computes it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ..errors import ConfigError, require


def equal_shares(global_batch: int, workers: int) -> list[int]:
    """The shares before anything is measured: the global batch split evenly."""
    base, extra = divmod(global_batch, workers)
    return [base + (1 if w < extra else 0) for w in range(workers)]


def plan_shares(global_batch: int, samples: Sequence[int], compute: Sequence[float],
                floor: int = 1, granularity: int = 1, damping: float = 0.5,
                fixed: float = 0.0) -> list[int]:
    """The next shares of ``global_batch`` (each a multiple of ``granularity``, at least
    ``floor``, adding up to ``global_batch``) from the shares ``samples`` that took ``compute``
    seconds per step, of which ``fixed`` seconds (FixedCost) are a step's cost whatever its
    samples: a worker's speed is its samples over the rest, its time per sample. A worker
    without a figure (compute 0) keeps its share."""
    n = len(samples)
    if n != len(compute) or n == 0:
        raise ValueError(f"{n} shares but {len(compute)} step times")
    least = least_share(floor, granularity)
    if granularity < 1 or global_batch % granularity or global_batch < n * least:
        raise ValueError(f"a global batch of {global_batch} cannot give {n} workers at least "
                         f"{least} samples each in multiples of {granularity}")
    if not 0 < damping <= 1:
        raise ValueError(f"damping {damping}: must be in (0, 1]")
    if any(c <= 0 or not math.isfinite(c) for c in compute):
        return list(samples)
    fixed = min(max(0.0, fixed), MAX_FIXED_FRACTION * min(compute))
    speed = [s / (c - fixed) for s, c in zip(samples, compute)]
    target = [global_batch * v / sum(speed) for v in speed]
    wanted = [s + damping * (t - s) for s, t in zip(samples, target)]
    return apportion(global_batch, wanted, floor, granularity)


# The fixed part is never taken as more than this much of the fastest step: an estimate near
# the whole step would make its small remainder, and the speeds planned from it, mostly noise.
MAX_FIXED_FRACTION = 0.9


class FixedCost:
    """The part of a step's compute that does not grow with its samples (the optimizer's step,
    each layer's launch and Python's overhead): on a small model most of the step. Planned from
    the whole step time, a worker with a small share looks slow for that part alone, and a
    device that recovered never got its share back (issue 41: 50/14 for five epochs). So the
    step is taken as ``fixed + per_sample x share``, with ``fixed`` the same on every worker
    (the same model and optimizer); the per-sample costs then differ where the devices do.

    ``fixed`` is learned from the epochs: a worker measured at two shares at least
    ``min_move`` apart (the plan moves them) gives a line whose value at no samples is it.
    A line that does not rise (the worker's speed changed between the two epochs) tells
    nothing, and so does one that meets 0 below no samples (noise: one such estimate, as the
    smallest, had kept the fixed cost at 0 for the rest of a run, and a recovered worker got its
    share back a sample an epoch). Each worker's latest estimate is kept, and the smallest of
    them is used: a worker
    whose device changed speed between its two points tends to overstate it. 0 (the whole step
    time, as before) until an estimate exists. Plain arithmetic on figures every rank has, so
    every rank learns the same value."""

    def __init__(self, min_move: int = 1):
        self.min_move = max(1, min_move)
        self.before: tuple[list[int], list[float]] | None = None
        self.estimates: dict[int, float] = {}

    def update(self, samples: Sequence[int], compute: Sequence[float]) -> float:
        """Take an epoch's shares (``samples`` per step) and median ``compute`` per step;
        the fixed cost to plan its next shares with."""
        if self.before is not None and len(self.before[0]) == len(samples):
            for w, (s0, c0, s1, c1) in enumerate(zip(*self.before, samples, compute)):
                if abs(s1 - s0) >= self.min_move and min(c0, c1) > 0 and \
                        (c1 - c0) / (s1 - s0) > 0:
                    fixed = c1 - (c1 - c0) / (s1 - s0) * s1
                    if fixed > 0:  # below 0 is noise, and as the smallest it had set 0 for good
                        self.estimates[w] = fixed
        elif self.before is not None:
            self.estimates = {}  # another world: other workers
        self.before = (list(samples), list(compute))
        return max(0.0, min(self.estimates.values())) if self.estimates else 0.0


def least_share(floor: int, granularity: int = 1) -> int:
    """apportion's smallest share: ``floor`` rounded up to a whole multiple of
    ``granularity``, and at least one."""
    return max(1, math.ceil(floor / granularity)) * granularity


def apportion(total: int, wanted: Sequence[float], floor: int = 1,
              granularity: int = 1) -> list[int]:
    """Whole shares, multiples of ``granularity`` and at least ``floor`` (rounded up to one),
    that add up to ``total`` and are as close to ``wanted`` as the largest remainders allow."""
    if not wanted or min(wanted) < 0 or sum(wanted) <= 0:
        raise ValueError(f"wanted shares {list(wanted)}: need non-negative ones, not all 0")
    units = total // granularity
    least = max(1, math.ceil(floor / granularity))
    scale = sum(wanted)
    ideal = [units * w / scale for w in wanted]
    # Raise the workers below the floor to it, and share the rest among the others in
    # proportion; repeat, since the rest shrinks as workers reach the floor.
    fixed: dict[int, int] = {}
    while True:
        free = [i for i in range(len(ideal)) if i not in fixed]
        left = units - least * len(fixed)
        weight = sum(ideal[i] for i in free)
        share = {i: left * ideal[i] / weight for i in free}
        low = [i for i in free if share[i] < least]
        if not low:
            break
        for i in low:
            fixed[i] = least
    whole = {i: int(v) for i, v in share.items()}
    for i in sorted(share, key=lambda i: share[i] - whole[i], reverse=True)[
            :left - sum(whole.values())]:
        whole[i] += 1
    return [(fixed.get(i) or whole[i]) * granularity for i in range(len(ideal))]


def balance_settings(cfg, model=None) -> tuple[int, float]:
    """--balance's floor in samples and its damping for the Config ``cfg``: at least
    --balance-floor of --batch-size, and a sample per backward pass and pipeline micro-batch
    (every rank makes the same number of backward passes: Horovod allreduces after a fixed
    count of them), two in a ``model`` with BatchNorm where the model is known
    (batchnorm_floor). The real scheme (sync/shares.py) and the simulator
    (compare/sim/sync_run.py) both take them from here."""
    sync = cfg.sync
    passes = passes_per_step(cfg)
    floor = max(math.ceil(sync.balance_floor * cfg.run.batch_size), passes)
    if model is not None:
        floor = batchnorm_floor(floor, model, passes)
    return floor, sync.balance_damping


def passes_per_step(cfg) -> int:
    """The backward passes a rank makes per step: --backward-passes-per-step x the pipeline's
    micro-batches."""
    micro = cfg.pipeline.micro_batches if cfg.pipeline.stages > 1 else 1
    return cfg.sync.backward_passes_per_step * micro


def batchnorm_floor(floor: int, model, passes: int) -> int:
    """``floor`` for ``model``: at least 2 samples per backward pass where it has BatchNorm,
    which normalizes each pass's samples by their own statistics, and which torch refuses to
    train on one sample (a straggler's share at a floor of a sample per micro-batch crashed the
    run in its second epoch)."""
    from torch.nn.modules.batchnorm import _BatchNorm

    normed = any(isinstance(m, _BatchNorm) for m in model.modules())
    return max(floor, 2 * passes) if normed else floor


def gradient_weight(share: int, global_batch: int, workers: int) -> float:
    """What worker's mean-loss gradient is multiplied by, so that the average over ``workers``
    (Horovod's Average) is the global batch's mean-loss gradient: ``workers * share / global``."""
    return workers * share / global_batch


def check_sync_options(sync: Any) -> None:
    """The balance options of the sync section (config/sync_options.py): their ranges, the
    combinations where unequal shares of a weighted average have no correct form, and the
    tuning options given without --balance; the config's validation calls it."""
    require(0 < sync.balance_floor <= 1, "--balance-floor", sync.balance_floor,
            "use a fraction of the equal share in (0, 1], e.g. 0.25")
    require(0 < sync.balance_damping <= 1, "--balance-damping", sync.balance_damping,
            "use a value in (0, 1], e.g. 0.5 (1: move all the way at each re-plan)")
    if sync.balance:
        _check_combinations(sync)
        return
    for name in ("balance_floor", "balance_damping"):  # silently ignored, they would look
        flag = "--" + name.replace("_", "-")           # like settings that took effect
        require(getattr(sync, name) == getattr(type(sync), name), flag, getattr(sync, name),
                f"it tunes --balance, which this run does not use: add --balance, or "
                f"drop {flag}")


def _check_combinations(sync: Any) -> None:
    """Where unequal shares of a weighted average have no correct form."""
    if sync.reduce_op == "adasum":
        raise ConfigError("--balance weights each worker's gradient by its share of the "
                          "global batch and averages them; --reduce-op adasum combines "
                          "gradients by their directions, not as a weighted average, so the "
                          "shares would change the update: drop one of them")
    if sync.local_steps > 1:
        raise ConfigError(f"--balance gives the workers unequal shares of each step's "
                          f"gradient, and --local-steps {sync.local_steps} averages "
                          "parameters after local steps, where a worker with a smaller share "
                          "takes noisier steps of the same weight: use --local-steps 1 with "
                          "--balance, or drop --balance")
    if sync.elastic:
        raise ConfigError("--balance does not work with --elastic: a reset changes the "
                          "workers, and with them the shares, in the middle of an epoch; "
                          "drop one of them")


def check_room(cfg: Any) -> None:
    """--balance where its shares can move: a share's smallest size (balance_settings) below
    --batch-size. The world size is the scheme's check."""
    r, s = cfg.run, cfg.sync
    if not s.balance:
        return
    require(r.mode != "async", "--balance", s.balance,
            "balancing is for --mode sync; async workers already take batches as "
            "they are ready, a fast one more of them: drop --balance")
    floor, _ = balance_settings(cfg)
    least = least_share(floor, s.backward_passes_per_step)
    if least >= r.batch_size:
        raise ConfigError(
            f"--balance: no share can move: every worker's share must be at least {least} "
            f"sample{'s' if least > 1 else ''} (--balance-floor {s.balance_floor:g} of "
            f"--batch-size {r.batch_size}, and a sample per backward pass and pipeline "
            f"micro-batch), which is all of --batch-size {r.batch_size}; use a larger "
            "--batch-size (or fewer --backward-passes-per-step / --micro-batches), or drop "
            "--balance")
