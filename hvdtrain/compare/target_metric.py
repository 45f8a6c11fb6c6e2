"""What a comparison races to: ``--target`` as a metric, a direction and a value, the way
``hvdtrain train --stop-at`` reads them (``test_loss<=1.9``, ``test_acc>=0.95``, or a metric of
the user's own workload). A bare number is test accuracy at or above it, what --target always
meant. Every part of compare (the plan's --stop-at, the results, the report, the plots, the
simulator and --from-run) judges an evaluation through one Target, so a loss target is read as
falling wherever accuracy was read as rising.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ..config import ConfigError, parse_stop_at
from ..config.values import reaches

ACCURACY = "test_acc"


@dataclass(frozen=True)
class Target:
    metric: str   # as metrics.jsonl spells it: test_loss, test_acc, test_<the user's metric>
    op: str       # ">=" (a rising metric) or "<=" (a falling one)
    value: float

    @classmethod
    def parse(cls, text: str | float) -> Target:
        """``"test_loss<=1.9"`` -> Target("test_loss", "<=", 1.9); ``"0.95"`` or 0.95 -> test
        accuracy >= 0.95. ValueError with the format to use."""
        text = str(text).strip()
        try:
            number = float(text)
        except ValueError:
            parsed = parse_stop_at(text)
            if parsed is None:
                raise ValueError("give a target, e.g. test_acc>=0.95 or test_loss<=1.9") from None
            if parsed[0] == ACCURACY and not 0 <= parsed[2] <= 1:  # 95 for 95%: never reached
                raise ValueError("test_acc is a fraction of the test samples, in [0, 1]; "
                                 "e.g. test_acc>=0.95") from None
            return cls(*parsed)
        if not 0 < number <= 1:
            raise ValueError(f"a bare number is a test accuracy, in (0, 1]; for another metric "
                             f"write NAME>=VALUE or NAME<=VALUE, e.g. test_loss<={text}")
        return cls(ACCURACY, ">=", number)

    @classmethod
    def of(cls, target: Target | str | float) -> Target:
        """A Target as it is, anything else parsed (a float: a test accuracy, as before)."""
        return target if isinstance(target, Target) else cls.parse(target)

    # --- judging ----------------------------------------------------------------------------------
    @property
    def rising(self) -> bool:
        return self.op == ">="

    def reached(self, value: float | None) -> bool:
        """Whether an evaluation's value of the metric reaches the target (None, NaN: no)."""
        return value is not None and math.isfinite(value) and reaches(value, self.op, self.value)

    def first_reached(self, curve: Sequence[dict]) -> dict | None:
        """The first curve point (results.curve) that reaches the target."""
        return next((p for p in curve if self.reached(p.get(self.metric))), None)

    def best(self, values: Sequence[float | None]) -> float | None:
        """The best of ``values`` in the target's direction (None where none is a number)."""
        scored = [v for v in values if v is not None and math.isfinite(v)]
        if not scored:
            return None
        return max(scored) if self.rising else min(scored)

    def capped(self, best: float) -> Target:
        """This target, or ``best`` where the target lies beyond it (what a run reached)."""
        value = min(self.value, best) if self.rising else max(self.value, best)
        return Target(self.metric, self.op, value)

    # --- words ------------------------------------------------------------------------------------
    @property
    def is_accuracy(self) -> bool:
        return self.metric == ACCURACY and self.rising

    def stop_at(self) -> str:
        """The --stop-at flag's value of every run of the plan."""
        return f"{self.metric}{self.op}{self.value!r}"

    def short(self) -> str:
        """"95%" for test accuracy (as reports always said it; "99.9%" for 0.999, which a
        whole percent would round up to a target never set), else "test_loss <= 1.9"."""
        return f"{self.value * 100:g}%" if self.is_accuracy else \
            f"{self.metric} {self.op} {self.value:g}"

    def describe(self) -> str:
        return f"{self.short()} test accuracy" if self.is_accuracy else self.short()

    @property
    def label(self) -> str:
        """The metric in words, for tables and axes: test accuracy, test loss, test char acc."""
        return "test accuracy" if self.metric == ACCURACY else self.metric.replace("_", " ")

    @property
    def title_word(self) -> str:
        """The target in a heading: "accuracy" (as reports always said it), "test loss"..."""
        return "accuracy" if self.is_accuracy else self.label

    @property
    def side(self) -> str:
        return "at or above" if self.rising else "at or below"


def check_reported(target: Target, reported: Sequence[str], whose: str, flag: str = "--target"
                   ) -> None:
    """ConfigError, listing what ``whose`` reports, when it does not report the target's
    metric: every run of the plan would fail at its start (--stop-at), or never reach it."""
    if target.metric not in reported:
        example = (list(reported) or ["test_loss"])[0]
        example += "<=VALUE" if example.endswith("loss") else ">=VALUE"
        raise ConfigError(f"{flag} {target.stop_at()}: {whose} reports no {target.metric!r}; "
                          f"it reports {', '.join(reported) or 'no test metric'}: name one of "
                          f"them, e.g. {flag} '{example}'")


def workload_metrics(train_args: Sequence[str], mode_options: dict | None = None) -> list[str]:
    """The test metrics that ``hvdtrain train TRAIN_ARGS`` reports (test_loss, test_acc...),
    learnt as a run learns them: the workload built in this process and checked on one small
    batch of its data (launch.ready_replica, which drops the metrics that do not apply to the
    model's output). Nothing trains. [] for a workload without a test split."""
    import torch

    from ..launch import build_model, ready_replica
    from ..loop.best import evaluation_metrics  # the loop imports torch: not for --help
    from ..precision import Precision
    from ..replica import Replica
    from ..workload import workload_from_config
    from .sim.flat_model import config_from_train_args

    cfg = config_from_train_args(train_args, mode_options or {})
    workload = workload_from_config(cfg)
    device = torch.device("cpu")
    try:
        replica = Replica(build_model(cfg, workload), device, workload.objective(),
                          Precision("32", [device]))
        ready_replica(cfg, workload, replica)
        if workload.test is None:
            return []
        return evaluation_metrics(sorted(replica.objective.metrics))
    finally:
        workload.close()


def check_plan_target(target: Target, train_args: Sequence[str], mode_options: dict) -> None:
    """Refuse, before any run starts, a plan whose runs cannot judge ``target``: a workload
    without a test split, or one whose evaluations report no ``target.metric``. The workload is
    built under a planned mode's options (``mode_options``, Mode.config_options): train flags
    that suit only some modes (--wire-dtype bf16) are not refused here under plain sync's."""
    reported = workload_metrics(train_args, mode_options)
    if not reported:
        raise ConfigError(f"--target {target.stop_at()}: the workload has no test split to "
                          "evaluate, so no run can reach a target; give its --dataset a test "
                          "split")
    check_reported(target, reported, "the workload's evaluation (its model, data and loss)")
