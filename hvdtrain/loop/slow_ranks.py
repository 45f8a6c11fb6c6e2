"""--slow-rank-factor: name the worker that holds the others back.

In sync every rank's step lasts as long as the slowest one's, because the allreduce evens the
step times out; what differs is how long each rank computed before it waited. A worker whose
median compute time per step is ``factor`` times the median of the others' is named once per
epoch, by that worker itself, so that the warning carries its own host and PID without any
message to gather them."""

from __future__ import annotations

import os
import socket
import statistics

from ..config import RunConfig
from .hooks import StepHook
from .step_times import RankStepTimes


def slow_workers(compute_p50: tuple[float, ...], factor: float,
                 steps: tuple[int, ...] | None = None) -> dict[int, float]:
    """{worker: its median compute time over the median of the others'} for each worker at
    ``factor`` or more (none with fewer than two workers, or factor 0). A worker that measured
    no step in the epoch (``steps``: an async worker lost, or one that trained none of its
    batches) has no median, and its zero would make the others look slow."""
    measured = [w for w in range(len(compute_p50)) if steps is None or steps[w] > 0]
    if factor <= 0 or len(measured) < 2:
        return {}
    slow = {}
    for w in measured:
        others = statistics.median(compute_p50[v] for v in measured if v != w)
        if others > 0 and compute_p50[w] >= factor * others:
            slow[w] = compute_p50[w] / others
    return slow


class SlowRankCheck(StepHook):
    """A step-times listener of the run log: the epoch line's ``slow_workers``, and this worker's
    warning when it is one of them. A hook only to learn its worker index."""

    def __init__(self, run: RunConfig, rank: int):
        self.factor, self.rank = run.slow_rank_factor, rank
        self.mode = "async" if run.mode == "async" else "sync"
        self.worker = 0

    def bind_world(self, worker: int, num_workers: int) -> None:
        self.worker = worker

    def __call__(self, times: RankStepTimes, epoch: int) -> dict:
        slow = slow_workers(times.compute_p50, self.factor, times.steps)
        if self.worker in slow:
            print(self.warning(times, epoch, slow[self.worker]), flush=True)
        return {"slow_workers": {str(w): round(f, 2) for w, f in slow.items()}} if slow else {}

    def warning(self, times: RankStepTimes, epoch: int, ratio: float) -> str:
        w = self.worker
        others = [v for i, v in enumerate(times.compute_p50) if i != w and times.steps[i]]
        return (f"hvdtrain: warning: slow rank {self.rank} (worker {w}, host "
                f"{socket.gethostname()}, pid {os.getpid()}): in epoch {epoch} its median "
                f"compute per step was {times.compute_p50[w] * 1000:.1f} ms, {ratio:.1f}x the "
                f"median of the others' ({statistics.median(others) * 1000:.1f} ms). "
                f"{REMEDIES.get(self.mode, REMEDIES['sync'])}")


REMEDIES = {
    "sync": "Every sync step waits for it: --balance gives it a share of the global batch that "
            "matches its speed; --mode async --backup-workers 1 drops its late gradients; "
            "--mode async lets the others go on without it (hvdtrain compare --from-run RUN_DIR "
            "predicts which is fastest). Or check the device or host it runs on.",
    "async": "Async hands the batches to whoever asks, so it trains fewer of them, but its "
             "gradients arrive stale: --staleness-lr weighs them down, --backup-workers 1 "
             "drops the late ones. Or check the device or host it runs on.",
}
