"""--slow-rank-factor: name the worker that holds the others back.

In sync every rank's step lasts as long as the slowest one's, because the allreduce evens the
step times out; what differs is how long each rank computed before it waited. A worker whose
median compute time per step is ``factor`` times the median of the others' is named by that
worker itself, so that the warning carries its own host and PID without any message to gather
them. It is named once while it stays slow: a straggler of a 100-epoch run named at every epoch
buried the rest of the output, and each epoch line's ``slow_workers`` still says whether it is.
The remedy it is told fits the run: what the run already does (--balance, --dynamic-local-steps)
is not suggested again, and a --straggler made on purpose is said to be one.

A ratio alone raised false alarms: on a shared machine a rank that loses its core for part of a
short epoch (a few steps of under a millisecond) computes 2-3 times as long for that epoch only,
and once a 0.4 ms difference was named. So a worker is named only when it is slow in two
measured epochs in a row, when even its fastest steps (the 10th percentile) are slow, and when
its extra time per step matters: at least
``MIN_EXCESS_SECONDS``, and at least ``MIN_EXCESS_FRACTION`` of the others' whole step (compute
and wait), so that a difference lost in the communication's time is not called slowness. The
figures are per step, from the start of a step to its last hook (hooks.StepTimer): the
epoch's evaluation, its line and its checkpoint, which worker 0 alone writes, come between
steps and are not in them."""

from __future__ import annotations

import os
import socket
import statistics

from ..config import Config
from .hooks import StepHook
from .step_times import RankStepTimes


# Below these, a slower worker costs the others too little to be worth a warning (see above).
MIN_EXCESS_SECONDS = 0.00075
MIN_EXCESS_FRACTION = 0.25


def slow_workers(compute_p50: tuple[float, ...], factor: float,
                 steps: tuple[int, ...] | None = None,
                 wait_p50: tuple[float, ...] | None = None,
                 compute_p10: tuple[float, ...] | None = None,
                 samples: tuple[int, ...] | None = None) -> dict[int, float]:
    """{worker: its median compute time over the median of the others'} for each worker slow in
    one epoch: at ``factor`` or more, and computing longer than the others by at least
    MIN_EXCESS_SECONDS and MIN_EXCESS_FRACTION of the median of the others' whole steps
    (compute plus ``wait_p50``) per step; and, given ``compute_p10``, its fastest steps at
    ``factor`` of the others' as well: a slow device is slow at every step, while a rank that
    lost its core to another process for part of an epoch still has steps at full speed. None
    with fewer than two workers, or factor 0. A worker that measured no step in the epoch
    (``steps``: an async worker lost, or one that trained none of its batches) has no median,
    and its zero would make the others look slow. Given ``samples`` (each worker's in the
    epoch) as well, a worker must also compute longer per sample than the others: under
    --balance a larger share makes a fast worker's steps longer (after a slow worker recovered,
    the fast one was named, at 1.6x per step and 2.5x faster per sample)."""
    measured = [w for w in range(len(compute_p50)) if steps is None or steps[w] > 0]
    per_sample = ([compute_p50[w] * steps[w] / max(1, samples[w]) for w in range(len(steps))]
                  if samples and steps else None)
    if factor <= 0 or len(measured) < 2:
        return {}
    wait = wait_p50 or (0.0,) * len(compute_p50)
    slow = {}
    for w in measured:
        others = [v for v in measured if v != w]
        compute = statistics.median(compute_p50[v] for v in others)
        step = statistics.median(compute_p50[v] + wait[v] for v in others)
        excess = compute_p50[w] - compute
        fastest = not compute_p10 or compute_p10[w] >= factor * statistics.median(
            compute_p10[v] for v in others)
        fastest = fastest and (per_sample is None or per_sample[w] >= statistics.median(
            per_sample[v] for v in others))
        if (compute > 0 and compute_p50[w] >= factor * compute and excess >= MIN_EXCESS_SECONDS
                and excess >= MIN_EXCESS_FRACTION * step and fastest):
            slow[w] = compute_p50[w] / compute
    return slow


def persisting(slow: dict[int, float], before: set[int]) -> dict[int, float]:
    """The workers of ``slow`` (this epoch's) that were slow in the epoch before as well
    (``before``): one slow epoch is a hiccup of the machine, two in a row a slow worker."""
    return {w: ratio for w, ratio in slow.items() if w in before}


class SlowRankCheck(StepHook):
    """A step-times listener of the run log: the epoch line's ``slow_workers``, and this worker's
    warning when it is one of them. A hook only to learn its worker index."""

    def __init__(self, cfg: Config, rank: int):
        self.factor, self.rank = cfg.run.slow_rank_factor, rank
        self.remedy = remedy(cfg)
        self.worker = 0
        self.before: set[int] = set()  # the workers slow in the epoch before (persisting)
        self.named: set[int] = set()  # the workers named in the epoch before (a streak)
        self.workers_before = 0

    def bind_world(self, worker: int, num_workers: int) -> None:
        self.worker = worker

    def __call__(self, times: RankStepTimes, epoch: int) -> dict:
        now = slow_workers(times.compute_p50, self.factor, times.steps, times.wait_p50,
                           times.compute_p10, times.samples)
        if times.num_workers != self.workers_before:  # the first epoch, or an elastic reset
            self.before, self.named = set(), set()
        slow, self.before = persisting(now, self.before), set(now)
        self.workers_before = times.num_workers
        if self.worker in slow and self.worker not in self.named:
            print(self.warning(times, epoch, slow[self.worker]), flush=True)
        self.named = set(slow)
        return {"slow_workers": {str(w): round(f, 2) for w, f in slow.items()}} if slow else {}

    def warning(self, times: RankStepTimes, epoch: int, ratio: float) -> str:
        w = self.worker
        others = [v for i, v in enumerate(times.compute_p50) if i != w and times.steps[i]]
        return (f"hvdtrain: warning: slow rank {self.rank} (worker {w}, host "
                f"{socket.gethostname()}, pid {os.getpid()}): in epoch {epoch} its median "
                f"compute per step was {times.compute_p50[w] * 1000:.1f} ms, {ratio:.1f}x the "
                f"median of the others' ({statistics.median(others) * 1000:.1f} ms), and it was "
                f"slow in the epoch before as well (named once while it stays slow; the epoch "
                f"lines' slow_workers say whether it still is). {self.remedy}")


def remedy(cfg: Config) -> str:
    """What to do about a slow worker, for this run's scheme, leaving out what it already does."""
    made = (f"--straggler {cfg.run.straggler} slows a worker on purpose. "
            if cfg.run.straggler else "")
    if cfg.run.mode != "async":
        balance = ("--balance is on and moves its share of the global batch toward its speed "
                   "over the next epochs; if its epoch lines still name it after that, its "
                   "step is mostly a cost that no share of the batch removes" if cfg.sync.balance
                   else
                   "--balance gives it a share of the global batch that matches its speed")
        what = (f"Every sync step waits for it: {balance}; --mode async --bsp --backup-workers "
                f"1 drops its late gradients; --mode async lets the others go on without it "
                f"(hvdtrain compare --from-run RUN_DIR predicts which is fastest).")
    elif cfg.sync.local_steps > 1 and cfg.sync.dynamic_local_steps:
        what = ("--dynamic-local-steps already gives it fewer inner steps a round, so that its "
                "rounds take about as long as the others'.")
    elif cfg.sync.local_steps > 1 and not cfg.ps.bsp:
        what = ("Its rounds take longer than the others' and arrive staler: --local-steps auto "
                "(--dynamic-local-steps) gives it fewer inner steps a round, so that they take "
                "about as long.")
    elif cfg.ps.bsp and cfg.ps.backup_workers:
        what = (f"--backup-workers {cfg.ps.backup_workers} already closes each --bsp round "
                "without its late gradient, which is then dropped: its work is mostly lost; "
                "without --bsp the others go on without it and its gradients count, staler.")
    elif cfg.ps.bsp:
        what = ("Every --bsp round waits for it: --backup-workers 1 drops its late gradients; "
                "without --bsp the others go on without it.")
    else:
        what = "Async hands the batches to whoever asks, so it trains fewer of them, but its " + (
            "gradients arrive stale (--staleness-lr already weighs them down)"
            if cfg.ps.staleness_lr else "gradients arrive stale: --staleness-lr weighs them "
            "down") + ", and --bsp --backup-workers 1 drops the late ones."
    return f"{made}{what} Or check the device or host it runs on."
