"""--keep-best and --early-stop-patience: after each evaluation, keep best.pt (the checkpoint of
the best evaluation so far) and tell the loop when the metric has stopped improving.

Who judges an evaluation: the processes that scored the test split. In sync mode that is every
rank, and the scores are sums that every rank received alike, so every rank reaches the same
verdict; in async mode it is worker 0 alone. Those are also the processes that take part in
writing a checkpoint, so best.pt needs nobody else. The stop decision must reach every worker at
the same epoch's end, since async workers must make the same number of pushes (a staleness bound
or --bsp would otherwise wait forever for a worker that stopped): with --early-stop-patience
every worker takes worker 0's record after each evaluation, so in async mode the other workers
wait there for worker 0's evaluation. Without it they never wait.

The record (best value, its epoch, evaluations since) is saved in every checkpoint, so a resumed
run neither replaces best.pt with a worse model nor restarts its patience.
"""

from __future__ import annotations

import math
from typing import Any

from .. import checkpoint
from ..config import ConfigError, RunConfig, parse_metric_goal
from ..run_output import keep_aside
from ..scheme import Progress, UpdateScheme
from .checkpointer import Checkpointer

BEST_NAME = "best.pt"


def judged_value(test: tuple[float, dict[str, float | None]], metric: str, flag: str
                 ) -> float | None:
    """The value of ``metric`` (test_loss, test_acc...) in an evaluation, or None where the
    evaluation means nothing: a NaN or infinite test loss (NaN in the test data, or a diverged
    model) leaves the metrics to argmax over NaN, which still gave an "accuracy" that kept
    best.pt and reached --stop-at. ConfigError where the metric counted no samples."""
    loss, metrics = test
    value = loss if metric == "test_loss" else metrics.get(metric[len("test_"):])
    if value is None:
        reported = [name for name, v in zip(evaluation_metrics(list(metrics)),
                                            [loss, *metrics.values()]) if v is not None]
        raise ConfigError(f"{flag}: the evaluation produced no value for {metric!r} (it counted "
                          f"no samples); choose one of {', '.join(reported)}")
    if loss is None or not math.isfinite(loss) or not math.isfinite(value):
        return None
    return value


def evaluation_metrics(metric_names: list[str]) -> list[str]:
    """The names an evaluation reports, as its lines in metrics.jsonl spell them."""
    return ["test_loss", *(f"test_{name}" for name in metric_names)]


class BestTracker:
    def __init__(self, run: RunConfig, scheme: UpdateScheme, checkpointer: Checkpointer,
                 metric_names: list[str], has_test_split: bool):
        self.metric, self.goal = parse_metric_goal(run.keep_best) or (None, None)
        self.patience = run.early_stop_patience
        self.epochs = run.epochs
        self.scheme, self.checkpointer = scheme, checkpointer
        self.best: float | None = None
        self.best_epoch = 0
        self.since_best = 0  # evaluations after the best one
        self.stop_reason: str | None = None
        if self.metric is None:
            return
        available = evaluation_metrics(metric_names)
        if not has_test_split:
            raise ConfigError("--keep-best: this run has no test split to evaluate; give it test "
                              "data, or drop --keep-best")
        if self.metric not in available:
            raise ConfigError(f"--keep-best: this run's evaluation reports no {self.metric!r}; "
                              f"choose one of {', '.join(available)} (optionally after max: or "
                              "min:)")
        checkpointer.components["best"] = self

    @property
    def path(self):
        return self.checkpointer.run_dir / BEST_NAME  # the folder the run claimed (claim())

    # --- checkpoint state -----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "goal": self.goal, "value": self.best,
                "epoch": self.best_epoch, "evaluations_since": self.since_best}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        if not state or (state["metric"], state["goal"]) != (self.metric, self.goal):
            return  # a checkpoint written without --keep-best, or for another metric: start afresh
        self.best, self.best_epoch = state["value"], state["epoch"]
        self.since_best = state["evaluations_since"]

    def take_over(self) -> None:
        """This worker became the lead mid-run (async, loop/lead.py). With patience every
        worker already holds the lost lead's record (broadcast after each evaluation); without
        it the record is in best.pt, which the lost lead wrote at each new best, so that this
        worker's first evaluation does not replace a better model there."""
        if self.metric is None or self.patience or not self.path.exists():
            return
        self._read_record()

    def _read_record(self) -> None:
        """best.pt's record, where it is for this metric."""
        try:
            self.load_state_dict(checkpoint.load(self.path).get("best"))
        except checkpoint.CheckpointError as e:
            print(f"hvdtrain: warning: {e}; --keep-best starts its record afresh", flush=True)

    # --- the loop's calls -----------------------------------------------------------------------
    def start(self, progress: Progress) -> None:
        """Collective, where the epochs start: every worker takes worker 0's record (a resumed
        run read it there), so all agree on the best so far and on whether patience ran out."""
        if self.metric is None:
            return
        if self.scheme.group.leads() and self.path.exists():
            self._meet_earlier_best()
        self.load_state_dict(self.scheme.group.broadcast_object(self.state_dict()))
        self._check_patience(progress)

    def _meet_earlier_best(self) -> None:
        """best.pt is in the folder already. A fresh run found it from an earlier attempt (one
        killed before its first checkpoint), whose best model its first evaluation replaced
        without a word: it is kept aside, as the log is. A resumed run takes its record where
        it is better than the checkpoint's (written after that checkpoint: an async resume
        need not reach it again), so that no worse model replaces it."""
        if self.checkpointer.resumed_from is None:
            kept = keep_aside(self.path)
            print(f"hvdtrain: {self.path} held an earlier attempt's best model; it is kept as "
                  f"{kept}", flush=True)
            return
        saved, best = self.best, (self.best_epoch, self.since_best)
        self._read_record()
        if saved is not None and self.best is not None and not self._better(self.best, saved):
            self.best, (self.best_epoch, self.since_best) = saved, best

    def evaluated(self, test: tuple[float, dict[str, float | None]] | None,
                  progress: Progress) -> None:
        """After an evaluation, at ``progress`` (an epoch's end). ``test`` is (loss, metrics)
        where this process scored the test split, else None. Collective with early stopping."""
        if self.metric is None:
            return
        if test is not None:
            value = judged_value(test, self.metric, "--keep-best")
            if value is None:  # not a number: no improvement, and no best.pt
                self.since_best += 1
            elif self._judge(value, progress.epoch):
                self.checkpointer.save(progress, self.path)
        if self.patience:
            self.load_state_dict(self.scheme.group.broadcast_object(self.state_dict()))
            self._check_patience(progress)

    # --- arithmetic -----------------------------------------------------------------------------
    def _judge(self, value: float, epoch: int) -> bool:
        """Record ``value`` of the evaluation after ``epoch`` epochs; True if it is the best."""
        better = self.best is None or self._better(value, self.best)
        if better:
            self.best, self.best_epoch, self.since_best = value, epoch, 0
        else:
            self.since_best += 1
        return better

    def _better(self, value: float, than: float) -> bool:
        return value < than if self.goal == "min" else value > than

    def _check_patience(self, progress: Progress) -> None:
        # Patience that runs out at the last epoch stops nothing: the run ends there anyway.
        if self.patience and self.since_best >= self.patience and progress.epoch < self.epochs:
            self.stop_reason = f"{self.metric} has not improved in {self.since_best} evaluations "
            # None: no evaluation has given a number yet (a NaN or infinite test loss each time)
            self.stop_reason += (f"(best {self.best:.6g}, after epoch {self.best_epoch})"
                                 if self.best is not None else
                                 "(none gave a finite value: a NaN or infinite test loss; "
                                 "there is no best model)")
