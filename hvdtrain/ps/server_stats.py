"""A server's own figures (pushes, samples, time, memory), reported with its rules' statistics
(rules/statistics.py) at the end of a run."""

from __future__ import annotations

import resource
import time
from collections import deque
from typing import Any

import numpy as np


def peak_rss_bytes() -> int:
    # The kernel raises ru_maxrss lazily (on unmap and exit), so it can lag the resident size
    # read now; the larger of the two is the peak so far.
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    return max(peak, current_rss_bytes() or 0)


def current_rss_bytes() -> int | None:
    """Resident memory now (Linux), to show it stays flat over a long run."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize()
    except (OSError, ValueError, IndexError):
        return None


class ServerLoad:
    # Each worker's latest push intervals, enough for steady percentiles in bounded memory.
    INTERVALS_KEPT = 4096

    def __init__(self, num_workers: int):
        self.pushes_received = 0
        self.last_push_of = [None] * num_workers  # when each worker's last push arrived
        self.intervals = [deque(maxlen=self.INTERVALS_KEPT) for _ in range(num_workers)]
        self.pushes_reported = [0] * num_workers  # each worker's own count, at DONE
        self.samples_received = 0
        self.first_push: float | None = None
        self.last_push = 0.0
        self.busy_seconds = 0.0
        self.started = time.perf_counter()
        self.rss_at_start = peak_rss_bytes()  # MPI and torch are loaded, no tensors yet
        self.rss_at_first_push: int | None = None

    def push(self, worker: int, samples: int, now: float) -> None:
        self.pushes_received += 1
        if self.last_push_of[worker] is not None:
            # The server's view of the worker's pace: its compute, its link and its waits.
            self.intervals[worker].append(now - self.last_push_of[worker])
        self.last_push_of[worker] = now
        self.samples_received += samples
        if self.first_push is None:
            self.first_push = now
            self.rss_at_first_push = current_rss_bytes()

    def report(self, index: int, updates: int, rules: dict[str, Any]) -> dict[str, Any]:
        span = self.last_push - self.first_push if self.first_push else 0.0
        return {"server": index, "pushes_applied": self.pushes_received,
                "samples": self.samples_received, "push_span_seconds": round(span, 4),
                "samples_per_sec": round(self.samples_received / span, 2) if span else None,
                "pushes_made_by_workers": sum(self.pushes_reported),
                "pushes_made_per_worker": list(self.pushes_reported),
                "peak_rss_bytes": peak_rss_bytes(), "rss_at_start_bytes": self.rss_at_start,
                "rss_at_first_push_bytes": self.rss_at_first_push,
                "rss_at_end_bytes": current_rss_bytes(),
                "updates": updates, **rules, **self.push_intervals(),
                # pushes_applied counts every push the rules took in (clocks, rounds, the batch
                # plan); a backup worker's late gradient and an fp16 step's skipped one changed
                # no parameter
                "gradients_applied": self.pushes_received - rules.get("dropped_gradients", 0)
                - rules.get("pushes_without_gradient", 0),
                "busy_seconds": round(self.busy_seconds, 3),
                "wall_seconds": round(time.perf_counter() - self.started, 3)}

    def push_intervals(self) -> dict[str, list]:
        """Each worker's p50 and p90 seconds between pushes (None: fewer than two pushes)."""
        p50, p90 = [], []
        for kept in self.intervals:
            low, high = np.percentile(kept, [50, 90]) if kept else (None, None)
            p50.append(None if low is None else round(float(low), 5))
            p90.append(None if high is None else round(float(high), 5))
        return {"push_interval_p50_seconds": p50, "push_interval_p90_seconds": p90}
