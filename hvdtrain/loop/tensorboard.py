"""TensorBoard event files beside metrics.jsonl (``--tensorboard``), fed by the run log.

Every line the run log writes becomes TensorBoard data at the run's global step, so the curves of
a resumed run continue those of its first attempt. Tags are ``<line type>/<field>``, except that
an epoch line's ``train_*`` and ``test_*`` fields become ``train/*`` and ``test/*``:

    step/loss  step/lr                                    with --log-steps
    train/loss  train/acc  test/loss  test/acc  ...      every epoch (each metric of the workload)
    epoch/lr  epoch/samples_per_sec  epoch/epoch_seconds
    scheme/staleness_histogram  scheme/pushes_applied  ... at the end of an async run
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# Positions and counts, not figures worth a curve: the step is the x axis already.
NOT_PLOTTED = {"epoch", "step", "workers", "samples", "wall_seconds", "train_seconds"}  # clocks


def tag(kind: str, key: str) -> str:
    split = kind == "epoch" and key.startswith(("train_", "test_"))
    return key.replace("_", "/", 1) if split else f"{kind}/{key}"


class TensorBoardSink:
    """Writes the run log's step, epoch and scheme lines into event files in ``run_dir``. Only
    the main process makes one, as it does the JSONL log."""

    def __init__(self, run_dir: Path, first_step: int | None):
        from torch.utils.tensorboard import SummaryWriter  # slow to import: only when asked for

        # A run repeats the steps after its checkpoint (all of them when it starts fresh), so
        # TensorBoard is told to drop what an earlier attempt in this folder wrote from
        # first_step on; its new event file then holds the only copy of those steps.
        # None keeps everything.
        self.writer = SummaryWriter(log_dir=str(run_dir), purge_step=first_step)
        self.step = first_step - 1 if first_step else 0  # the step of a line that has none

    def record(self, kind: str, fields: dict[str, Any]) -> None:
        self.step = fields.get("step", self.step)
        for key, value in fields.items():
            if key.endswith("_histogram") and isinstance(value, dict) and value:
                self.histogram(tag(kind, key), value)
            elif (isinstance(value, (int, float)) and not isinstance(value, bool)
                  and key not in NOT_PLOTTED):
                self.writer.add_scalar(tag(kind, key), value, self.step)
        if kind != "step":  # a killed job keeps its epochs; step lines wait for the timed flush
            self.writer.flush()

    def histogram(self, name: str, counts: dict[int, int]) -> None:
        """{value: count} of integers (the staleness of every applied gradient). One bucket per
        integer from the smallest to the largest: TensorBoard takes the bucket limits as right
        edges and min and max as the outer ones, so each bucket holds exactly one integer."""
        counts = {int(k): int(v) for k, v in counts.items()}
        low, high = min(counts), max(counts)
        values = range(low, high + 1)
        self.writer.add_histogram_raw(
            name, min=low, max=high, num=sum(counts.values()),
            sum=sum(k * c for k, c in counts.items()),
            sum_squares=sum(k * k * c for k, c in counts.items()),
            bucket_limits=[k + 0.5 for k in values],
            bucket_counts=[counts.get(k, 0) for k in values], global_step=self.step)

    def close(self) -> None:
        self.writer.close()
