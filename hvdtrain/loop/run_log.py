"""What a run shows and records, on the main process: the progress bar, the epoch summary line,
and the log's lines (a header, then epoch, eval, stop and scheme lines, and with --log-steps a
line per step), which go to the sinks of sinks.py: metrics.jsonl, and what else the run asks for.

Figures are sums across workers. The async scheme sums them without blocking (a fast worker
must not wait for a slow one's epoch), so a line is written once every worker has reported that
epoch or step: lines stay in order, and their wall_seconds say when worker 0 got there.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from ..config import Config
from ..errors import plain_message
from ..run_output import ProgressBar, cut_partial_line, package_versions
from ..models import count_parameters
from ..replica import BatchStats
from ..scheme import PendingSum, Progress, UpdateScheme
from .clock import TrainingClock
from .epoch_totals import EpochTotals, means
from .flops import epoch_throughput, throughput_header
from .hooks import StepTimer, TrainingError
from .sinks import LOG_NAME, Sink, SinkFactory, close_all, default_sinks
from .step_times import FIELDS as STEP_TIME_FIELDS, RankStepTimes, table


@dataclass
class EpochResult:
    epoch: int
    train_loss: float | None  # None: no step of it after a resume (it trained before the stop)
    test_loss: float | None
    seconds: float            # worker 0's training time in this epoch
    samples_per_sec: float    # every worker's samples per second, added up
    wall_seconds: float       # since training started, when worker 0 finished the epoch
    lr: float
    train_metrics: dict[str, float | None] = field(default_factory=dict)
    test_metrics: dict[str, float | None] = field(default_factory=dict)
    throughput: dict[str, float] = field(default_factory=dict)  # tflops, mfu (flops.py)

    @property
    def train_acc(self) -> float | None:
        return self.train_metrics.get("acc")

    @property
    def test_acc(self) -> float | None:
        return self.test_metrics.get("acc")

    def as_record(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "train_loss": self.train_loss, "test_loss": self.test_loss,
                **{f"train_{k}": v for k, v in self.train_metrics.items()},
                **{f"test_{k}": v for k, v in self.test_metrics.items()},
                "epoch_seconds": round(self.seconds, 4),
                "samples_per_sec": round(self.samples_per_sec, 2), **self.throughput,
                "wall_seconds": round(self.wall_seconds, 3), "lr": self.lr}


class RunLog:
    def __init__(self, epochs: int, scheme: UpdateScheme, metric_names: list[str],
                 is_main: bool, progress_bar: bool, log_steps: bool,
                 sinks: SinkFactory = default_sinks, timer: StepTimer | None = None,
                 step_times_listeners: list[Callable[[RankStepTimes, int], dict | None]] = (),
                 clock: TrainingClock | None = None):
        self.epochs = epochs
        # The training clock's evaluation seconds leave an epoch's samples/s (and TFLOP/s): an
        # evaluation inside an epoch is not training, and made evaluated epochs look slower.
        self.clock = clock
        self._eval_seconds_at_start = 0.0
        self.is_main = is_main
        self.scheme = scheme
        self.names = metric_names
        self.log_steps = log_steps
        self.make_sinks = sinks  # sinks.build_sinks for the run's config
        self.sinks: list[Sink] = []  # open on the main process only
        self.bar = ProgressBar(enabled=is_main and progress_bar)
        self.history: list[EpochResult] = []
        self.totals, self._first_step = EpochTotals(metric_names), 0
        # This worker's step times (a hook of the trainer's), summed with the epoch line; the
        # listeners, the trainer's choice, are called with each epoch's step times of every
        # worker (and the epoch, from 1), on every worker that gets the epoch line's sum, in
        # their order. What one returns (a dict, or None) goes into the epoch line; the log
        # itself decides nothing from them.
        self.timer = timer or StepTimer()
        self.step_times_listeners = list(step_times_listeners)
        # Lines waiting for their sums across workers, in the order written, each with the
        # number of the sum_later it waits for (-1: none, an eval line).
        self._pending: list[tuple[PendingSum, dict[str, Any], int]] = []
        self._posted = 0  # sum_later calls so far
        self._last_step_line = -1  # the global step of the last step line (async)
        self.header: dict[str, Any] = {}  # the run's header line: FLOPs per sample, peak
        self.logged_epochs = 0  # a new lead's: epoch lines the lost lead wrote (take_over)
        self._unwritten: list[tuple[EpochResult, dict[str, Any]]] = []  # not the lead's: last
        self._checkpoint_pending: list[dict[str, Any]] = []  # a resume's (load_state_dict)

    # --- the sinks ------------------------------------------------------------------------------
    def open(self, run_dir: Path, append: bool, header: dict[str, Any], global_step: int = 0,
             announce: bool = False) -> None:
        """global_step: where the run starts (a resumed run's checkpoint); announce: print what
        runs where (run_header). Every process keeps the header (a new lead needs its FLOPs);
        the lead alone opens the sinks."""
        self.header = header
        if not self.is_main:
            return
        # A resume into a new folder (--resume OLD --run-dir NEW) has no log to account for yet.
        path = run_dir / LOG_NAME
        covered = log_coverage(path) if append and path.exists() else None
        if append and header.get("resumed_from_epoch") == self.epochs and \
                not header.get("resumed_from_step"):
            return  # a finished run resumed with nothing left to train: its log (and trackers')
        self.sinks = self.make_sinks(run_dir, append, global_step + 1)  # stay as they were
        self.write("header", **header)
        if announce:
            print(opening_line(header, run_dir), flush=True)
        if covered is not None:
            self._account_for_gap(*covered, int(header.get("resumed_from_epoch") or 0))

    # --- a resume's gap -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """In the checkpoint: the epoch lines still waiting for their sums. The async lead
        writes an epoch's checkpoint before its line, which waits for the slowest worker's
        sums; a job killed meanwhile resumes after epochs that its log never got. Their
        evaluations (the lead's own) are kept here, and the resume writes them."""
        return {"pending_epochs": [
            {"epoch": r["epoch"], "step": r["step"], "wall_seconds": r["wall_seconds"],
             "test": r["test"], "train_seconds": r["extra"].get("train_seconds")}
            for _, r, _ in self._pending if r["type"] == "epoch"]}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        self._checkpoint_pending = list((state or {}).get("pending_epochs") or [])

    def _account_for_gap(self, covered: int, evals: set[tuple[int, int]], resumed: int) -> None:
        """A resume from epoch ``resumed`` whose log accounts only for the epochs up to
        ``covered``: the epochs between were trained (the checkpoint holds them) but their
        lines never written. Their evaluations that the checkpoint kept become eval lines,
        and one ``missing`` line names the epochs and says why, so that the log has a line
        for every epoch or says which it lacks."""
        missing = list(range(covered + 1, resumed + 1))
        if not missing:
            return
        for kept in self._checkpoint_pending:
            if kept["epoch"] in missing and kept["test"] is not None and \
                    (kept["epoch"], kept["step"]) not in evals:
                self.write("eval", **self._eval_fields(
                    kept["epoch"], kept["step"], tuple(kept["test"]), kept["wall_seconds"],
                    kept["train_seconds"]))
        span = f"{missing[0]}" if len(missing) == 1 else f"{missing[0]}-{missing[-1]}"
        reason = (f"the previous attempt wrote its epoch {resumed} checkpoint and stopped before "
                  f"the line(s) of epoch(s) {span}, which wait for every worker's sums (async); "
                  "their training is in the checkpoint, their figures are lost, and their "
                  "evaluations, where the checkpoint kept them, are eval lines")
        self.write("missing", epochs=missing, reason=reason)
        print(f"hvdtrain: the log has no epoch line for epoch(s) {span}: {reason}; a 'missing' "
              "line in the log says so", flush=True)

    def follow_main(self, is_main: bool, run_dir: Path, global_step: int | None = None) -> None:
        """After an elastic reset that lost rank 0, the new rank 0 continues the log (elastic
        requires a shared --run-dir), and a process that is no longer rank 0 stops writing."""
        was_main, self.is_main = self.is_main, is_main  # not a finished run resumed (open)
        if is_main and not (was_main or self.sinks):
            self.sinks = self.make_sinks(run_dir, True,
                                         None if global_step is None else global_step + 1)
            print(f"hvdtrain: this process is rank 0 now; it continues the log and the "
                  f"checkpoints in {run_dir}", flush=True)
        elif not is_main and self.sinks:
            self.close()

    def take_over(self, run_dir: Path, lost: list[int] = ()) -> None:
        """Async: this worker became the lead after the lead's loss (loop/lead.py). It appends
        to the run's log from here on, leaving out the epoch lines that the lost lead wrote
        already: every worker computes each epoch's line, and the lost lead may have written
        some that this worker's sums have not completed yet. Those it writes name the workers
        ``lost``: their sums are the survivors' (they were computed before the loss was known)."""
        if cut_partial_line(run_dir / LOG_NAME):
            print(f"hvdtrain: cut {run_dir / LOG_NAME} back to its last whole line (the lost "
                  "lead was killed while it wrote one)", flush=True)
        self.logged_epochs = last_logged_epoch(run_dir / LOG_NAME)
        self.is_main = True
        self.sinks = self.sinks or self.make_sinks(run_dir, True, None)
        for result, line in self._unwritten:  # done here before the lead was lost
            if result.epoch > self.logged_epochs:
                print(summary_line(result, self.epochs), flush=True)
                self.write("epoch", **{**({"workers_lost": list(lost)} if lost else {}), **line})
                self.logged_epochs = result.epoch
        self._unwritten = []

    def write(self, kind: str, **fields: Any) -> None:
        for sink in self.sinks:
            sink.record(kind, fields)

    def failed(self, why: str) -> None:
        """The last line says the run failed, and why (not under way, not killed): from close,
        or from the stall watchdog's thread before it ends the process while training hangs."""
        try:
            self.write("stop", reason=f"failed: {why}")
        except (OSError, TrainingError):  # the log was what failed (a full disk): the
            pass                           # error on its way out says so, not this one

    def close(self) -> None:
        error = sys.exc_info()[1]
        if error is not None:  # closed on the way out of an error (trainer._fit)
            self.failed((plain_message(error).splitlines() or [type(error).__name__])[0])
        sinks, self.sinks = self.sinks, []
        close_all(sinks)

    # --- the epoch ------------------------------------------------------------------------------
    def start_epoch(self, epoch: int, steps: int, first_step: int = 0) -> None:
        """``steps`` left to train from ``first_step``, above 0 where a resume (or an elastic
        reset) starts inside the epoch: its line's training figures cover only the steps from
        there, and it says so (``from_step``)."""
        self.totals, self._first_step = EpochTotals(self.names), first_step
        self._eval_seconds_at_start = self.clock.eval_seconds if self.clock else 0.0
        self.timer.start_epoch()
        self.bar.start_epoch(epoch + 1, self.epochs, steps)

    def step(self, epoch: int, global_step: int, lr: float, loss: float,
             stats: BatchStats) -> None:
        t, weight = self.totals, float(stats.loss_weight)  # samples, or a loss's scored tokens
        t.add(loss * weight, stats)
        if self.log_steps:
            values = [loss * weight, weight]
            record = {"type": "step", "epoch": epoch + 1, "step": global_step, "lr": lr}
            if self.scheme.group.steps_agree:
                self._post(values, record)
            elif global_step > self._last_step_line:
                # Async workers train unequal shares of a global step: worker 0's own figures,
                # no sum to wait for, once per global step it reached (the step axis stays
                # increasing where it trained two pieces of one step).
                self._last_step_line = global_step
                self._pending.append((PendingSum(values), record, -1))
        if self.bar.enabled:  # the running figures only when the bar shows them
            self.bar.update((time.perf_counter() - t.started) / t.steps, t.running)
        if self._pending:
            self.flush()

    def end_epoch(self, epoch: int, global_step: int, lr: float, workers: int,
                  test: tuple[float, dict[str, float | None]] | None, wall_seconds: float,
                  extra: dict[str, Any]) -> None:
        evaluating = (self.clock.eval_seconds - self._eval_seconds_at_start) if self.clock else 0
        seconds = time.perf_counter() - self.totals.started - evaluating
        self.bar.end_epoch()
        record = {"type": "epoch", "epoch": epoch + 1, "step": global_step, "lr": lr,
                  "workers": workers, "seconds": seconds, "wall_seconds": wall_seconds,
                  "test": test, "extra": extra,
                  **({"from_step": self._first_step} if self._first_step else {})}
        worker, num_workers = self.scheme.group.workers()
        self._post(self.totals.as_vector(seconds) + self.timer.vector(worker, num_workers),
                   {**record, "step_time_workers": num_workers})
        self.flush()

    def evaluation(self, epoch: int, global_step: int,
                   test: tuple[float, dict[str, float | None]] | None, wall_seconds: float,
                   train_seconds: float) -> None:
        """An evaluation inside an epoch (--eval-every-steps): an eval line, in order with the
        step and epoch lines before it."""
        if test is None:  # this worker scores nothing (async: only worker 0 evaluates)
            return
        record = {"type": "eval", **self._eval_fields(epoch + 1, global_step, test, wall_seconds,
                                                       round(train_seconds, 4))}
        self._pending.append((PendingSum([]), record, -1))
        self.flush()

    @staticmethod
    def _eval_fields(epoch: int, global_step: int, test: tuple[float, dict[str, float | None]],
                     wall_seconds: float, train_seconds: float | None) -> dict[str, Any]:
        """An eval line's fields (``epoch`` counted from 1)."""
        test_loss, metrics = test
        return {"epoch": epoch, "step": global_step, "wall_seconds": round(wall_seconds, 4),
                "train_seconds": train_seconds, "test_loss": test_loss,
                **{f"test_{k}": v for k, v in metrics.items()}}

    def _post(self, values: list[float], record: dict[str, Any]) -> None:
        self._pending.append((self.scheme.group.sum_later(values), record, self._posted))
        self._posted += 1

    def flush(self, wait: bool = False, below: int | None = None) -> None:
        """Write every line whose sums are in, in order; with wait, all of them, or those of
        the sums numbered below ``below``."""
        while self._pending and (self._pending[0][0].ready() or
                                 (wait and (below is None or self._pending[0][2] < below))):
            pending, record, _ = self._pending.pop(0)
            values = pending.wait()
            if record["type"] == "eval":
                self.write("eval", **{k: v for k, v in record.items() if k != "type"})
            elif record["type"] == "step":
                self.write("step", epoch=record["epoch"], step=record["step"], lr=record["lr"],
                           loss=values[0] / max(values[1], 1))
            else:
                self._finish_epoch(values, record)

    def finish(self, stopped_unevenly: bool) -> None:
        """Where the epochs end: every line written, or with stopped_unevenly (the workers
        agreed to stop after a step, and async ones may have stopped at different steps) those
        that every worker added its share to (drain)."""
        if stopped_unevenly:
            self.drain()  # async: a worker that stopped sooner never adds its share
        else:
            self.flush(wait=True)

    def drain(self) -> None:
        """After a stop: write the lines whose sums every worker posted. An async worker that
        stopped early never adds its share to the later lines of the others, so those step and
        epoch lines are left out rather than waited for (the workers agree how many sums all
        of them posted, scheme.group.sums_posted_everywhere); the evaluations held behind
        them, and those of the epoch lines left out, need no sums and are written as eval
        lines all the same (a run stopped at its target must keep the evaluation that
        reached it)."""
        self.flush(wait=True, below=self.scheme.group.sums_posted_everywhere(self._posted))
        left_out = [record for _, record, _ in self._pending if record["type"] != "eval"]
        for _, record, _ in self._pending:
            if record["type"] == "eval":
                self.write("eval", **{k: v for k, v in record.items() if k != "type"})
            elif record["type"] == "epoch" and record["test"] is not None:
                # the epoch's training figures need the others' sums; its evaluation does not
                self.write("eval", **self._eval_fields(
                    record["epoch"], record["step"], record["test"], record["wall_seconds"],
                    record["extra"].get("train_seconds")))
        if left_out and self.is_main:
            print(f"hvdtrain: {len(left_out)} step or epoch line(s) left out of the log: "
                  "not every worker reached them before the stop", flush=True)
        self._pending.clear()

    def _finish_epoch(self, values: list[float], record: dict[str, Any]) -> None:
        train_loss, train_metrics = means(values, self.names)
        if not values[1]:  # no sample: an epoch resumed at its end trained before the stop
            train_loss = None
        step_times, noted = self._step_times(values, record)
        test_loss, test_metrics = (record["test"] if record["test"]
                                   else (None, {name: None for name in self.names}))
        result = EpochResult(record["epoch"], train_loss, test_loss, record["seconds"],
                             values[2], record["wall_seconds"], record["lr"], train_metrics,
                             test_metrics, epoch_throughput(self.header, values[2]))
        self.history.append(result)
        rec = result.as_record()
        line = dict(epoch=result.epoch, step=record["step"], lr=result.lr,
                    workers=record["workers"], samples=int(values[1]),
                    **({"from_step": record["from_step"]} if "from_step" in record else {}),
                    train_loss=rec.pop("train_loss"),
                    **{k: v for k, v in rec.items() if k not in ("epoch", "lr")},
                    **record["extra"], step_times=step_times.as_record(), **noted)
        if not self.is_main:  # another worker writes the log; kept in case it is lost
            self._unwritten = [*self._unwritten[-(UNWRITTEN_KEPT - 1):], (result, line)]
        elif result.epoch > self.logged_epochs:  # not written by a lost lead already
            print(summary_line(result, self.epochs), flush=True)
            self.write("epoch", **line)

    def _step_times(self, values: list[float],
                    record: dict[str, Any]) -> tuple[RankStepTimes, dict[str, Any]]:
        """The epoch's step times by worker, from the slots after the totals (EpochTotals),
        and what the listeners add to the epoch line; they hear of them before the line is
        written, so that a warning comes before it."""
        workers = record["step_time_workers"]
        first = len(values) - len(STEP_TIME_FIELDS) * workers
        times = table(values[first:], workers)
        noted: dict[str, Any] = {}
        for listener in self.step_times_listeners:
            noted.update(listener(times, record["epoch"]) or {})
        return times, noted


UNWRITTEN_KEPT = 8  # epoch lines a worker that does not lead keeps for a take-over


def _whole_records(path: Path) -> Iterator[dict[str, Any]]:
    """The lines of a run's log that parse as JSON objects, in order; none where the log cannot
    be read. A line that does not parse (cut short by a kill) counts for nothing."""
    try:
        with open(path, "rb") as f:
            for raw in f:
                try:
                    record = json.loads(raw)
                except (ValueError, RecursionError):
                    continue
                if isinstance(record, dict):
                    yield record
    except OSError:
        return


def last_logged_epoch(path: Path) -> int:
    """The last epoch line's epoch of the current attempt in a run's log (0 for none, or no
    log): a resumed run starts with a header line and repeats the epochs after its
    checkpoint, so only the lines after the last header count."""
    last = 0
    for record in _whole_records(path):
        if record.get("type") == "header":
            last = 0
        elif record.get("type") == "epoch":
            last = max(last, int(record.get("epoch", 0)))
    return last


def log_coverage(path: Path) -> tuple[int, set[tuple[int, int]]]:
    """(the last epoch a run's log accounts for, the (epoch, step) of its latest attempt's eval
    lines). An attempt's header accounts for the epochs before it resumed (an attempt that
    found some unlogged says so in a ``missing`` line right after its header); its epoch and
    missing lines for theirs. Lines that do not parse (cut by a kill) count for nothing."""
    covered, evals = 0, set()
    for record in _whole_records(path):
        kind = record.get("type")
        try:
            if kind == "header":
                covered, evals = int(record.get("resumed_from_epoch") or 0), set()
            elif kind == "epoch":
                covered = max(covered, int(record.get("epoch", 0)))
            elif kind == "missing":
                covered = max(covered, *map(int, record.get("epochs") or [0]))
            elif kind == "eval":
                evals.add((int(record.get("epoch", 0)), int(record.get("step", 0))))
        except (TypeError, ValueError):
            continue
    return covered, evals


def summary_line(result: EpochResult, epochs: int) -> str:
    trained = result.train_loss is not None  # else every step was before a resume
    parts = [f"epoch {result.epoch}/{epochs}",
             f"loss: {result.train_loss:.4f}" if trained else "trained before the resume"]
    parts += [f"{k}: {v:.4f}" for k, v in result.train_metrics.items() if v is not None]
    if result.test_loss is not None:
        parts.append(f"test_loss: {result.test_loss:.4f}")
        parts += [f"test_{k}: {v:.4f}" for k, v in result.test_metrics.items() if v is not None]
    if trained:
        parts.append(f"{result.samples_per_sec:,.0f} samples/s")
    if trained and "tflops" in result.throughput:
        parts.append(f"{result.throughput['tflops']:.4g} TFLOP/s")
    if trained and "mfu" in result.throughput:
        parts.append(f"MFU {result.throughput['mfu']:.1%}")
    parts.append(f"lr: {result.lr:.4g}")
    return " - ".join(parts)


def _horovod_cycle_ms() -> float | None:
    value = os.environ.get("HOROVOD_CYCLE_TIME")
    return float(value) if value else None


def run_header(cfg: Config, runtime, workload, replica, num_workers: int, steps_per_epoch: int,
               progress: Progress) -> dict[str, Any]:
    """The log's first line: what runs where, and from which step, and the model's FLOPs per
    sample (flops.py). The count's first use of torch's flop counter loads torch._dynamo, a
    second or two, which other lazy first uses (an fp16 step) also load. So every process
    builds the header (the main process writes it), before the scheme's collective start: no
    worker starts training while another still loads, which in async would hand a short run's
    batches to the one that started first. ``cores`` and ``threads`` are the writing process's
    CPU placement (runtime.py, core_binding.py); ``horovod_wakes`` and ``horovod_cycle_ms``
    Horovod's start of a collective (on enqueue, or at its next cycle) and its cycle time, as
    hvd.init() took them, and ``keeps_freed_memory`` whether malloc keeps freed blocks for the
    next step (freed_memory.py) (sync only). ``folder``: where the run started, which its relative
    paths (a --model file, --data-path, a --dataset-args root) are relative to, so that
    ``compare --from-run`` builds its model and data from anywhere."""
    return dict(config=cfg.to_record(), folder=os.getcwd(), world_size=runtime.size,
                num_workers=num_workers,
                launcher=runtime.launcher, device=replica.describe(), versions=package_versions(),
                cores=sorted(os.sched_getaffinity(0)), threads=torch.get_num_threads(),
                horovod_wakes=runtime.horovod_wakes,
                keeps_freed_memory=runtime.keeps_freed_memory,
                horovod_cycle_ms=_horovod_cycle_ms(),
                dataset=workload.describe(), model=workload.name,
                num_parameters=count_parameters(replica.model), steps_per_epoch=steps_per_epoch,
                resumed_from_epoch=progress.epoch, resumed_from_step=progress.step,
                resumed_from_global_step=progress.global_step,
                **throughput_header(cfg, workload, replica, num_workers,
                                    announce=runtime.rank == 0))


def opening_line(header: dict[str, Any], run_dir: Path) -> str:
    """What the main process prints as a run starts, from its header."""
    return (f"hvdtrain: {header['config']['run']['mode']} training of {header['model']} "
            f"({header['num_parameters']:,} parameters) on {header['dataset']}; "
            f"{header['num_workers']} worker(s), launcher: {header['launcher']}, device: "
            f"{header['device']}; logging to {run_dir}")
