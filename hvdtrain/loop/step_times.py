"""Per-worker step times: how long each worker computes (forward, backward, its own work and any
straggler delay) and how long it waits for the others (in the collective, or for the server's
reply) per step, so that a slow worker can be named and sync can rebalance around it. This
module holds their table; the step timer that measures them is a step hook (hooks.StepTimer).

Cost: two clock reads and two list appends per step. Nothing is sent per step: at an epoch's end
each worker's figures ride in slots of the epoch line's existing sum across workers (every
worker fills its own slots and leaves the others' at 0, so the sum is the table), and the table
comes back on every worker that takes part in the sum (run_log.RunLog)."""

from __future__ import annotations

from dataclasses import dataclass

# The figures of one worker, in order, in the epoch line's vector.
# compute_p10 and wait_mean came last, so that older logs read as before (from_record): a
# worker's fastest steps tell a slow device (every step slow) from a rank that lost its core for
# part of an epoch on a busy host (slow_ranks.py); the mean wait gives the loop's own time as
# what the step period leaves after the mean compute and it (compare/from_run.py), where the
# median and 90th percentile miss a wait at fewer than one step in ten (a round of local steps,
# a push held behind a slow link).
FIELDS = ("steps", "samples", "compute_p50", "compute_p90", "compute_mean", "wait_p50",
          "wait_p90", "compute_p10", "wait_mean")


@dataclass(frozen=True)
class RankStepTimes:
    """One epoch's step times, one entry per worker (worker index order), in seconds; the
    samples each worker trained in the epoch, and the steps that were measured."""

    steps: tuple[int, ...]
    samples: tuple[int, ...]
    compute_p50: tuple[float, ...]
    compute_p90: tuple[float, ...]
    compute_mean: tuple[float, ...]
    wait_p50: tuple[float, ...]
    wait_p90: tuple[float, ...]
    compute_p10: tuple[float, ...] = ()  # () in a log written before it was recorded
    wait_mean: tuple[float, ...] = ()    # () likewise

    @property
    def num_workers(self) -> int:
        return len(self.steps)

    def as_record(self) -> dict[str, list]:
        """The epoch line's ``step_times`` field: lists by worker, times in seconds (to 10 us)."""
        record: dict[str, list] = {}
        for name in FIELDS:
            values = getattr(self, name)
            record[name] = ([int(v) for v in values] if name in ("steps", "samples")
                            else [round(float(v), 5) for v in values])
        return record

    @classmethod
    def from_record(cls, record: dict[str, list]) -> RankStepTimes:
        """Back from an epoch line's ``step_times`` (a finished run's log, compare --from-run)."""
        return cls(**{name: tuple(record[name]) for name in FIELDS if name in record})


def table(vector: list[float], num_workers: int) -> RankStepTimes:
    """The summed vector (hooks.StepTimer.vector's layout) as a table by worker."""
    k = len(FIELDS)
    rows = [vector[w * k:(w + 1) * k] for w in range(num_workers)]
    columns = {name: tuple(row[i] for row in rows) for i, name in enumerate(FIELDS)}
    columns["steps"] = tuple(int(round(v)) for v in columns["steps"])
    columns["samples"] = tuple(int(round(v)) for v in columns["samples"])
    return RankStepTimes(**columns)
