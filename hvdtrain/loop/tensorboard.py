"""TensorBoard event files beside metrics.jsonl (``--tensorboard``): a sink of the run log
(sinks.py).

Every line the run log writes becomes TensorBoard data at the run's global step, so the curves of
a resumed run continue those of its first attempt. Tags are ``<line type>/<field>``, except that
an epoch line's ``train_*`` and ``test_*`` fields become ``train/*`` and ``test/*``:

    step/loss  step/lr                                    with --log-steps
    train/loss  train/acc  test/loss  test/acc  ...      every epoch (each metric of the workload)
    epoch/lr  epoch/samples_per_sec  epoch/epoch_seconds
    scheme/staleness_histogram  scheme/pushes_applied  ... at the end of an async run
    step_times/compute_p50/worker1  step_times/wait_p90/worker0  ...  every epoch, by worker
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

from ..checkpoint import intact_note
from .hooks import TrainingError

# Positions and counts, not figures worth a curve: the step is the x axis already.
NOT_PLOTTED = {"epoch", "step", "global_step", "step_in_epoch", "from_step",  # positions,
               "workers", "samples",                                          # counts,
               "wall_seconds", "train_seconds"}                               # clocks


def line_step(fields: dict[str, Any]) -> int | None:
    """The global step of a line (``global_step``, else ``step``, which is the global step too on
    this version's lines; a preemption's stop line once had its step in the epoch there);
    scheme lines have none."""
    step = fields.get("global_step", fields.get("step"))
    return int(step) if isinstance(step, (int, float)) and not isinstance(step, bool) else None


def tag(kind: str, key: str) -> str:
    split = kind == "epoch" and key.startswith(("train_", "test_"))
    return key.replace("_", "/", 1) if split else f"{kind}/{key}"


class TensorBoardSink:
    """Writes the run log's step, epoch and scheme lines into event files in ``run_dir``; the
    header, which describes the run, holds no figure to plot. Only the main process makes one.

    A write that fails (a full disk, a quota, a lost mount) stops the run as a failed write to
    metrics.jsonl does: a TrainingError saying what is intact. TensorBoard writes from a thread
    of its own, which reports the error to the next write; the thread's own traceback is held
    back, so it cannot bury that message."""

    def __init__(self, run_dir: Path, first_step: int | None):
        from torch.utils.tensorboard import SummaryWriter  # slow to import: only when asked for

        _quiet_writer_threads()
        self.run_dir = run_dir
        self.failed = False
        # A run repeats the steps after its checkpoint (all of them when it starts fresh), so
        # TensorBoard is told to drop what an earlier attempt in this folder wrote from
        # first_step on; its new event file then holds the only copy of those steps.
        # None keeps everything.
        try:
            self.writer = SummaryWriter(log_dir=str(run_dir), purge_step=first_step)
        except Exception as e:
            self._stop(e)
        self.step = first_step - 1 if first_step else 0  # the step of a line that has none

    def record(self, kind: str, fields: dict[str, Any]) -> None:
        if self.failed or kind == "header":
            return
        try:
            self._record(kind, fields)
        except Exception as e:  # OSError from the file, re-raised from the writer thread
            self._stop(e)

    def _record(self, kind: str, fields: dict[str, Any]) -> None:
        step = line_step(fields)  # the x axis is the global step, a preempted stop line's too
        self.step = self.step if step is None else step
        for key, value in fields.items():
            if key.endswith("_histogram") and isinstance(value, dict) and value:
                self.histogram(tag(kind, key), value)
            elif key == "step_times" and isinstance(value, dict):
                self.per_worker(value)
            elif (isinstance(value, (int, float)) and not isinstance(value, bool)
                  and key not in NOT_PLOTTED):
                self.writer.add_scalar(tag(kind, key), value, self.step)
        if kind != "step":  # a killed job keeps its epochs; step lines wait for the timed flush
            self.writer.flush()

    def per_worker(self, step_times: dict[str, list]) -> None:
        """An epoch's step times (loop/step_times.py): a curve per figure and worker, in
        seconds, so that a slow worker's curve stands apart from the others'."""
        for name, values in step_times.items():
            if name not in ("steps", "samples"):
                for worker, value in enumerate(values):
                    self.writer.add_scalar(f"step_times/{name}/worker{worker}", value, self.step)

    def _stop(self, error: Exception) -> None:
        self.failed = True
        reason = getattr(error, "strerror", None) or str(error) or type(error).__name__
        raise TrainingError(f"could not write TensorBoard events to {self.run_dir} ({reason}); "
                            f"metrics.jsonl holds every line written so far; "
                            f"{intact_note(self.run_dir, 'free space')}") from None

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
        """Never raises: it runs while another error may be on its way out."""
        try:
            self.writer.close()
        except Exception as e:
            if not self.failed:
                self.failed = True
                print(f"hvdtrain: could not finish the TensorBoard events in {self.run_dir} "
                      f"({getattr(e, 'strerror', None) or e}); metrics.jsonl holds every line",
                      file=sys.stderr, flush=True)


def _quiet_writer_threads() -> None:
    """Hold back the traceback of TensorBoard's writer thread when a write fails: the writer
    raises the same error at the next write, where the sink reports it in one line."""
    if getattr(threading.excepthook, "hvdtrain_quiet", False):
        return
    previous = threading.excepthook

    def excepthook(args: threading.ExceptHookArgs) -> None:
        if type(args.thread).__module__.startswith("tensorboard.summary.writer"):
            return
        previous(args)

    excepthook.hvdtrain_quiet = True  # type: ignore[attr-defined]
    threading.excepthook = excepthook
