"""One row of figures per run, read from its metrics log."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from ..run_output import latest_attempt, read_jsonl
from .plan import PlannedRun
from .target_metric import Target


@dataclass
class RunResult:
    name: str
    mode: str
    straggler: str
    seed: int
    status: str                 # ok | failed
    reason: str
    final_test_acc: float | None
    time_to_target: float | None  # seconds of training until the first evaluation that reaches
                                  # the target (--target: a metric, >= or <=, a value)
    samples_per_sec: float | None  # samples trained on / worker 0's training time (see below)
    mean_staleness: float | None   # async: mean over every applied gradient; sync: 0
    wall_seconds: float | None
    curve: list[dict]              # per evaluation: step, wall_seconds (of training: the
                                   # evaluations' own time left out), train_loss, test_acc and
                                   # every other test_ metric it reported (test_loss...)
    staleness_histogram: dict[int, int]
    workers: int | None = None     # the workers: a real run's log header, a simulated one's
    simulated: bool = False        # True: on the simulator's virtual clock, not a real launch
    # --faults: launches after the first, and goodput: the final model's samples (its global
    # steps x the global batch) over the whole job's seconds, failed attempts, restarts and
    # start-ups included; 0 when the job never finished
    restarts: int | None = None
    goodput: float | None = None
    final_value: float | None = None  # the last evaluation's value of the --target's metric

    def row(self) -> dict:
        out = asdict(self)
        out.pop("curve")
        out.pop("staleness_histogram")
        return out


def time_to_target(curve: list[dict], target: Target | str | float) -> float | None:
    """Training seconds at the first evaluation that reaches ``target`` (a float: a test
    accuracy), None if none did."""
    point = Target.of(target).first_reached(curve)
    return None if point is None else point["wall_seconds"]


def final_value(curve: list[dict], metric: str) -> float | None:
    """The last evaluation's value of ``metric`` (test_loss, test_acc...)."""
    scored = [p[metric] for p in curve if p.get(metric) is not None]
    return scored[-1] if scored else None


def training_seconds(record: dict) -> float:
    """Seconds of training when a line was written: evaluations left out (logs before
    --eval-every-steps have only the wall time)."""
    return record.get("train_seconds", record["wall_seconds"])


def curve(records: list[dict]) -> list[dict]:
    """Every evaluation in the order of steps, step evaluations (eval lines) and epoch ends
    alike (after a stop, an epoch's evaluation whose line could not be completed is written as
    an eval line, after the later ones); the training loss is an epoch's mean, so only epoch
    points have one."""
    points = [{"step": r["step"], "wall_seconds": training_seconds(r),
               "train_loss": r.get("train_loss") if r["type"] == "epoch" else None,
               "test_acc": r.get("test_acc"),
               **{k: v for k, v in r.items() if k.startswith("test_")}}
              for r in records if r["type"] in ("eval", "epoch")]
    return sorted(points, key=lambda p: p["step"])  # stable: log order within a step


def samples_trained(header: dict, scheme: dict | None, end: dict, epochs: list[dict]) -> int:
    """The samples trained on by the end of the run. Async: the servers' count of every push
    (dropped backup gradients included: work done), as the workers do not keep step with worker
    0, whose steps the log counts. Sync: every worker trains every global step. Read against worker 0's training
    time this is exact when the run stops at its target (every worker stops within a step or
    two); an async run that trains its whole budget counts the steps a slower worker still
    trains after worker 0 has finished."""
    if scheme and scheme.get("samples") is not None:
        return int(scheme["samples"])
    return model_samples(header, epochs, end)


def model_samples(header: dict, epochs: list[dict], end: dict) -> int:
    """The final model's samples: its global steps times the global batch, while the job kept
    its workers. An elastic job's world shrinks when a worker is lost, and its steps after that
    take fewer samples: then the epochs' own counts (the latest line of each, should a reset
    repeat one), plus the steps after the last epoch line at the batch of its workers."""
    batch, workers = header["config"]["run"]["batch_size"], header["num_workers"]
    if all(e.get("workers", workers) == workers for e in epochs):
        return end["step"] * batch * workers
    latest = {e["epoch"]: e for e in epochs if e["step"] <= end["step"]}
    done = sorted(latest.values(), key=lambda e: e["step"])
    since, now = (done[-1]["step"], done[-1].get("workers", workers)) if done else (0, workers)
    return sum(e["samples"] for e in done) + (end["step"] - since) * batch * now


def read_result(run: PlannedRun, run_dir: Path, status: dict,
                target: Target | str | float) -> RunResult:
    """The run's row, its time to ``target`` read off its evaluations (a float: a test
    accuracy)."""
    target = Target.of(target)
    result = RunResult(run.name, run.mode.name, run.straggler or "none", run.seed,
                       status["status"], status.get("reason", ""), None, None, None, None, None,
                       [], {})
    if "restarts" in status:
        result.restarts, result.goodput = status["restarts"], 0.0
    if status["status"] != "ok":
        return result
    try:
        records = latest_attempt(read_jsonl(run_dir / "metrics.jsonl"))
        header = next(r for r in records if r["type"] == "header")
        epochs = [r for r in records if r["type"] == "epoch"]
        scheme = next((r for r in records if r["type"] == "scheme"), None)
        # --stop-at: the run ended at its target, where its stop line says
        stop = next((r for r in records if r["type"] == "stop" and "train_seconds" in r), None)
        end = stop or (epochs[-1] if epochs else None)
        if end is None:
            raise ValueError("no epoch was logged")
    except (OSError, ValueError, StopIteration, KeyError) as e:
        result.status, result.reason = "failed", f"unreadable metrics log: {e}"
        return result
    result.curve, result.workers = curve(records), header.get("num_workers")
    result.final_test_acc = final_value(result.curve, "test_acc")
    result.final_value = final_value(result.curve, target.metric)
    result.time_to_target = time_to_target(result.curve, target)
    result.wall_seconds = training_seconds(end)
    result.samples_per_sec = (samples_trained(header, scheme, end, epochs) / result.wall_seconds
                              if result.wall_seconds else None)
    if result.restarts is not None and status.get("seconds"):
        result.goodput = model_samples(header, epochs, end) / status["seconds"]
    if scheme and scheme.get("staleness_histogram"):
        hist = {int(k): int(v) for k, v in scheme["staleness_histogram"].items()}
        result.staleness_histogram = hist
        total = sum(hist.values())
        result.mean_staleness = sum(k * v for k, v in hist.items()) / total if total else None
    elif not run.mode.is_async:
        result.mean_staleness = 0.0
    return result
