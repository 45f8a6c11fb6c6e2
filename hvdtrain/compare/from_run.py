"""``hvdtrain compare --from-run``: a finished run's per-worker step times, fitted as each
worker's persistent speed plus random delays, and the costs around a step, so that the
simulator (compare/sim/) can replay every mode on the run's own cluster.

The model of worker w's compute per step (forward, backward, its own work, any --straggler
sleep; loop/step_times.py) is ``base_w + X_w``: ``base_w`` is its persistent part (an older
device, a busy host: its ratio to the fastest worker's is the worker's factor), ``X_w`` an
exponential random delay with mean ``m_w`` (OS jitter, other jobs on the host). The fit reads
the run's log alone; nothing here runs a model, so it is unit-tested on synthetic logs.
"""

from __future__ import annotations

import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import ConfigError
from ..loop.step_times import RankStepTimes
from ..run_output import latest_attempt, read_run_log
from ..stragglers import _uniform
from .results import curve
from .sim.timing import Timing


def delay_fit(p50: float, mean: float) -> tuple[float, float]:
    """(persistent part, mean random delay) of a step time with this median and mean: the
    median is the persistent part, and the random delay, exponential, makes up the difference
    to the mean. Not a shifted exponential fitted to p50 and p90: on a shared host the tail is
    heavier than exponential (p90 - p50 of a 3x straggler is often larger than its median), so
    that fit puts the persistent part below 0 and loses the worker's factor. This one keeps
    the factor the slow-rank warning reads (the ratio of medians) and the mean step time, which
    is what a time to target adds up."""
    return max(0.0, p50), max(0.0, mean - p50)


@dataclass(frozen=True)
class EpochTimes:
    """One epoch line of the log: its training seconds, the global steps it took, and the
    workers' step times."""

    epoch: int
    seconds: float   # training seconds of the epoch (evaluations left out)
    steps: int       # global steps of the epoch (the log's step count)
    times: RankStepTimes


@dataclass(frozen=True)
class FittedDelays:
    """The fit as a delay model with StragglerModel.delay's interface, so the simulator draws a
    fitted worker's extra time per step as it draws a --straggler's: worker w waits its
    persistent extra ``extra[w]`` (in proportion to the work of its step, as a slower device
    would), a fixed ``fixed[w]`` that no share of the work removes, and an exponential draw of
    mean ``random_mean[w]``, deterministic in (seed, worker, step) like stragglers._uniform."""

    extra: tuple[float, ...]        # base_w - the fastest worker's base, seconds
    random_mean: tuple[float, ...]  # the exponential delay's mean, seconds
    fixed: tuple[float, ...] = ()   # a cost per step of its own (an async worker's slower
                                    # exchange), seconds

    kind = "fit"

    @property
    def active(self) -> bool:
        return True

    def describe(self) -> str:
        return "each worker's speed and random delays as fitted from the run"

    def delay(self, worker: int, num_workers: int, global_step: int, step_seconds: float,
              seed: int, work: float = 1.0) -> float:
        w = worker % len(self.extra)  # the fit has the run's workers; more repeat them
        u = _uniform("fit", seed, w, global_step)
        fixed = self.fixed[w] if self.fixed else 0.0
        return self.extra[w] * work + fixed - self.random_mean[w] * math.log1p(-u)


@dataclass(frozen=True)
class WorkerFit:
    base_seconds: float   # persistent compute per step
    factor: float         # base_seconds / the fastest worker's
    random_mean: float    # mean of the exponential delay per step
    wait_seconds: float   # mean wait per step (for the others, or for the server)


@dataclass(frozen=True)
class RunFit:
    """What the run's step times say: each worker's fit, the Timing of the virtual clock, the
    mean training seconds of a global step, and the extra seconds of the first epoch
    (warm-up) that every mode pays once."""

    workers: tuple[WorkerFit, ...]
    timing: Timing
    step_period: float
    warmup_seconds: float
    epochs_used: tuple[int, ...]
    own_waits: bool = False  # an async run's workers wait for nobody: a longer wait is theirs

    def delays(self, with_server: bool = True) -> FittedDelays:
        """The fit as a delay model; ``with_server``: for a mode with a parameter server, in
        which an async run's longer waits (own_waits) are the worker's own; an allreduce's
        waits are not."""
        fastest = min(w.base_seconds for w in self.workers)
        least_wait = min(w.wait_seconds for w in self.workers)
        own = self.own_waits and with_server
        return FittedDelays(tuple(w.base_seconds - fastest for w in self.workers),
                            tuple(w.random_mean for w in self.workers),
                            tuple(w.wait_seconds - least_wait if own else 0.0
                                  for w in self.workers))


def _median(values) -> float:
    return float(statistics.median(values))


def _mean_wait(p50: float, p90: float) -> float:
    """The mean of a wait that has only its median and 90th percentile in the log, as the
    exponential tail that p90 - p50 implies (mean = p50 + (p90 - p50) (1 - ln 2) / ln 5)."""
    return max(0.0, p50) + max(0.0, p90 - p50) * (1 - math.log(2)) / math.log(5)


def _wait_per_step(times, worker: int, local_steps: int) -> float:
    """A worker's mean wait per step in an epoch: as recorded (wait_mean), or, in a log from
    before it was, from the median and the 90th percentile. A run with H local steps waits at
    one step in H, for the round's exchange, and barely at the others: while H < 10 the round's
    wait holds the 90th percentile, and the mean is the median at H - 1 steps in H and it at
    the round's; otherwise the wait is read as an exponential tail (_mean_wait)."""
    if times.wait_mean:
        return times.wait_mean[worker]
    p50, p90 = times.wait_p50[worker], times.wait_p90[worker]
    if 1 < local_steps < 10:
        return ((local_steps - 1) * max(0.0, p50) + max(0.0, p90)) / local_steps
    return _mean_wait(p50, p90)


def _loop_seconds(epoch: EpochTimes, local_steps: int) -> float:
    """The loop's own time per step in an epoch: the step period less the mean compute and the
    mean wait, of the worker that took the most of the epoch's steps (in an async run, the one
    whose steps fill the epoch: a worker across a slow link may take a handful, and spend the
    rest of its epoch in pushes)."""
    times = epoch.times
    w = max(range(times.num_workers), key=lambda v: times.steps[v])
    return (epoch.seconds / max(1, times.steps[w]) - times.compute_mean[w]
            - _wait_per_step(times, w, local_steps))


def _worker_fits(epochs: list[EpochTimes],
                 local_steps: int = 1) -> list[tuple[float, float, float]]:
    """(base, random mean, mean wait) per worker: each epoch's figures fitted, the median over
    the epochs (the load of a shared host changes from one epoch to the next). An async worker
    may take no batch of an epoch (the lab's worker beside the server finished whole epochs
    while the other's push crossed a slow link): those epochs say nothing of its speed, and a
    worker seen in none of them is taken to compute as the others do."""
    out: list[tuple[float, float, float] | None] = []
    for w in range(epochs[0].times.num_workers):
        seen = [e for e in epochs if e.times.steps[w] > 0]
        fits = [delay_fit(e.times.compute_p50[w], e.times.compute_mean[w]) for e in seen]
        waits = [_wait_per_step(e.times, w, local_steps) for e in seen]
        out.append((_median(f[0] for f in fits), _median(f[1] for f in fits), _median(waits))
                   if seen else None)
    known = [f for f in out if f is not None]
    if not known:
        return [(0.0, 0.0, 0.0)] * len(out)  # fit_epochs names the missing speed
    typical = tuple(_median(f[i] for f in known) for i in range(3))
    return [typical if f is None else f for f in out]


def fit_epochs(epochs: list[EpochTimes], lock_step: bool, local_steps: int = 1,
               apply_seconds: float = 0.0, first: EpochTimes | None = None,
               own_waits: bool = False) -> RunFit:
    """The fit of these epochs of a run (``first``: its first epoch, left out of the fit for
    its warm-up, whose extra time is measured against the fit). ``lock_step``: a sync or
    --bsp run, whose workers wait for each other. ``own_waits``: an async run without a
    staleness bound, whose workers wait for the server alone, so that a worker's wait beyond
    the least is a cost of its own (its host's share of the cores, its link), replayed as a
    fixed delay. ``apply_seconds``: the server's update, measured elsewhere (the log has no
    figure for it)."""
    if not epochs:
        raise ConfigError("--from-run: the run's log has no epoch with step times to fit")
    per_worker = _worker_fits(epochs, local_steps)
    fastest = min(base for base, _, _ in per_worker)
    if fastest <= 0:
        raise ConfigError("--from-run: a worker's median compute per step is 0 in the run's "
                          "log, so no speed can be fitted; train the run again for more epochs")
    workers = tuple(WorkerFit(base, base / fastest, mean, wait)
                    for base, mean, wait in per_worker)
    # The network: in a lock-step run the slowest worker arrives last, so its wait is the
    # exchange alone; in an async run the least-waiting worker's wait is a push, the server's
    # update and its reply. The other family's cost is taken to be the same trip of one
    # gradient (an allreduce and a push and pull move the same bytes): a guess, said so in
    # the output. With H local steps (local SGD, DiLoCo, async DiLoCo) a worker waits for the
    # round's exchange at one step in H, so the exchange is H times the mean wait per step.
    if lock_step:
        slowest = max(workers, key=lambda w: w.base_seconds + w.random_mean)
        exchange = slowest.wait_seconds * local_steps
        allreduce, push = exchange, max(0.0, exchange - apply_seconds)
    else:
        exchange = min(w.wait_seconds for w in workers) * local_steps
        push = max(0.0, exchange - apply_seconds)
        allreduce = push + apply_seconds
    period = _median(e.seconds / e.steps for e in epochs)
    # The loop's own time per step: a worker spends its step period computing, waiting, and
    # in the loop around the update.
    loop = _median(_loop_seconds(e, local_steps) for e in epochs)
    timing = Timing(step_seconds=fastest, apply_seconds=apply_seconds,
                    allreduce_seconds=allreduce, push_seconds=push, loop_seconds=max(0.0, loop))
    warmup = max(0.0, first.seconds - first.steps * period) if first is not None else 0.0
    return RunFit(workers, timing, period, warmup, tuple(e.epoch for e in epochs),
                  own_waits and not lock_step)


def split_warmup(epochs: list[EpochTimes]) -> tuple[EpochTimes | None, list[EpochTimes]]:
    """(the first epoch, the epochs to fit): the first is left out, with its warm-up (the first
    steps' allocations, the allreduce's negotiation), when two or more others remain."""
    if len(epochs) >= 3 and epochs[0].epoch == 1:
        return epochs[0], epochs[1:]
    return None, list(epochs)


SINGLE_RUNS = 200  # the single runs drawn per replay for the range of one run's time


def run_speeds(first: EpochTimes | None, later: list[EpochTimes], period: float,
               epochs_run: int, seed: int, draws: int = SINGLE_RUNS) -> np.ndarray:
    """How much slower than the fit ``draws`` single runs of ``epochs_run`` epochs go: for
    each, the mean over its epochs of their step period over the fit's, its first epoch the
    run's own first (warm-up and all), the others drawn from the run's later epochs (a seeded
    bootstrap: the same draws for every mode of a seed). A time to target is the sum of a few
    epochs, and on a shared host one epoch can take twice another (a burst of other jobs): the
    medians of the fit leave that out, and this puts it back into the range of one run's
    time. Without a first epoch apart (too few epochs), every epoch is drawn."""
    ratios = np.array([e.seconds / e.steps / period for e in later])
    rng = np.random.default_rng(seed)
    k = max(1, epochs_run)
    if first is None:
        return rng.choice(ratios, size=(draws, k)).mean(axis=1)
    rest = rng.choice(ratios, size=(draws, k - 1)).sum(axis=1)
    return (first.seconds / first.steps / period + rest) / k


# --- the run's log ----------------------------------------------------------------------------
LOG = "metrics.jsonl"


@dataclass
class RunLog:
    """What --from-run reads of a finished run: its header (the full config), its epochs' step
    times, and its evaluations (the curve of results.curve: training seconds, every test
    metric)."""

    folder: Path
    header: dict
    epochs: list[EpochTimes]
    curve: list[dict]
    cut_short: str = ""  # how a run that did not finish ended ("" for one that did)

    @property
    def config(self) -> dict:
        return self.header["config"]

    @property
    def num_workers(self) -> int:
        return int(self.header["num_workers"])

    def best_accuracy(self) -> float | None:
        scored = [p["test_acc"] for p in self.curve if p.get("test_acc") is not None]
        return max(scored) if scored else None

    def metrics(self) -> list[str]:
        """The test metrics the run's evaluations gave a value for (test_loss, test_acc, the
        user's own), in the order of its log."""
        return list(dict.fromkeys(k for p in self.curve for k, v in p.items()
                                  if k.startswith("test_") and v is not None))

    def best(self, target) -> float | None:
        """The best value of ``target``'s metric (a Target) the run reached, in its direction."""
        return target.best([p.get(target.metric) for p in self.curve])


def read_run(folder: str | Path) -> RunLog:
    """The run in ``folder``; ConfigError, saying what to do, for a folder without a log, a
    log from before step times were recorded, or a run that never evaluated."""
    folder = Path(folder)
    path = folder / LOG
    if not path.is_file():
        raise ConfigError(f"--from-run: {folder} has no {LOG}; give the --run-dir of a finished "
                          "hvdtrain train run")
    try:
        records, cut = read_run_log(path)
        records = latest_attempt(records)
    except ValueError as e:  # not a log: binary, a line that is not one
        raise ConfigError(f"--from-run: {e}; give the folder of a finished run") from None
    if cut:  # a killed run's log: its whole lines are the run
        print(f"hvdtrain compare: warning: {cut}", file=sys.stderr, flush=True)
    if not any(isinstance(r, dict) and r.get("type") == "header" for r in records):
        raise ConfigError(f"--from-run: {path} has no header line: the run ended before it "
                          "began to train, or the file is not an hvdtrain log; give the folder "
                          "of a finished run")
    try:
        # the latest attempt's world: a run resumed with another number of workers has epochs
        # of both, whose per-worker figures do not line up (an IndexError)
        header = [r for r in records if r.get("type") == "header"][-1]
        epochs = [_epoch_times(r, i, records) for i, r in enumerate(records)
                  if r.get("type") == "epoch"]
        epochs = _of_one_world(epochs)
    except (ValueError, StopIteration, KeyError, TypeError, AttributeError) as e:
        raise ConfigError(f"--from-run: {path} cannot be read ({type(e).__name__}: {e}); give "
                          "the folder of a finished run, whose log hvdtrain wrote") from None
    epochs = [e for e in epochs if e is not None]
    if not epochs:
        raise ConfigError(f"--from-run: {path} has no step times (no epoch line with "
                          "'step_times'): the run was made by an hvdtrain from before they were "
                          "recorded, or ended before its first epoch; train it again with this "
                          "hvdtrain for at least 3 epochs")
    if int(header.get("num_workers", 2)) < 2:
        raise ConfigError(f"--from-run: {folder} is a run of 1 worker: it exchanged nothing "
                          "between workers, and that exchange is what the schemes differ in, "
                          "so there is nothing to fit them to; give a run of 2 or more workers, "
                          "or compare at the size you plan with hvdtrain compare --simulate "
                          "--workers N")
    _check_rebuildable(folder, header)
    run = RunLog(folder, header, epochs, curve(records), _cut_short(records, header))
    if not run.metrics():  # a language model's run has a test_loss and no test_acc
        raise ConfigError(f"--from-run: {path} has no test figures: the run never evaluated "
                          "(a dataset without a test split, or --eval-every 0); train it again "
                          "with evaluations (--eval-every 1)")
    return run


def _cut_short(records: list[dict], header: dict) -> str:
    """How the run ended where it did not finish: a failure its log recorded, or a log that
    stops before its last epoch with no stop line (a killed run); "" for a run that trained
    all its epochs or stopped as asked (--stop-at, a stop signal)."""
    stops = [r for r in records if r.get("type") == "stop"]
    reason = str(stops[-1].get("reason", "")) if stops else ""
    if reason.startswith("failed"):
        return f"the run ended in failure ({reason[:120]}{'...' if len(reason) > 120 else ''})"
    planned = header.get("config", {}).get("run", {}).get("epochs")
    last = max((r.get("epoch", 0) for r in records if r.get("type") == "epoch"), default=0)
    if not stops and isinstance(planned, int) and last < planned:
        return (f"the run's log ends after epoch {last} of {planned} with no stop line (the "
                "run was killed, or is still running)")
    return ""


def _check_rebuildable(folder: Path, header: dict) -> None:
    """The replay rebuilds the run's model from its config's --model. A run of hvdtrain.fit
    trained Python objects, and its config holds the defaults (mlp on digits): its header
    names the model it really trained, which the config's --model then is not."""
    config = header.get("config", {}).get("model", {})
    trained, named = header.get("model"), config.get("model")
    if trained and named and trained != named:
        raise ConfigError(
            f"--from-run: {folder} trained {trained}, which its config does not name (--model "
            f"{named}): a run of hvdtrain.fit, whose model, data and loss are Python objects "
            "the replay cannot rebuild; put them in files and compare a run of hvdtrain train "
            "--model FILE:FACTORY --dataset FILE:LOADER --loss FILE:LOSS, or pass those flags "
            "to hvdtrain compare --simulate")


def _of_one_world(epochs: list[EpochTimes | None]) -> list[EpochTimes | None]:
    """The epochs of the latest attempt's number of workers: a run resumed with another has
    epochs of both, whose per-worker figures do not line up (they ended in an IndexError)."""
    timed = [e for e in epochs if e is not None]
    if not timed:
        return epochs
    world = timed[-1].times.num_workers
    return [e for e in timed if e.times.num_workers == world]


def _epoch_times(record: dict, index: int, records: list[dict]) -> EpochTimes | None:
    """An epoch line as EpochTimes (None without step times): its seconds are the increase of
    the training clock since the previous epoch line, which counts what falls between two
    epochs' steps (a checkpoint) as epoch_seconds does not."""
    if "step_times" not in record:
        return None
    before = [r for r in records[:index] if r.get("type") == "epoch"]
    start_clock = before[-1].get("train_seconds", before[-1]["wall_seconds"]) if before else 0.0
    start_step = before[-1]["step"] if before else 0
    seconds = record.get("train_seconds", record["wall_seconds"]) - start_clock
    steps = record["step"] - start_step
    if steps < 1 or seconds <= 0:
        return None
    return EpochTimes(int(record["epoch"]), float(seconds), int(steps),
                      RankStepTimes.from_record(record["step_times"]))
