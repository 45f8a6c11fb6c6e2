"""--stop-at METRIC>=VALUE (or <=): end training once an evaluation reaches a target, the way
time-to-accuracy benchmarks (MLPerf) measure a run.

Who judges an evaluation: the processes that scored the test split (sync: every rank, which all
received the same sums; async: worker 0 alone). This component only records ``reached``; the
stopping component (stopping.py) stops the workers through the stop agreement that a signal uses
(scheme.group.agree_to_stop), so the workers that never saw the evaluation stop too, at a step
they all agree on.
"""

from __future__ import annotations

from ..config import ConfigError, RunConfig, parse_stop_at
from ..config.values import reaches
from .best import evaluation_metrics, judged_value


class TargetStop:
    def __init__(self, run: RunConfig, metric_names: list[str], has_test_split: bool):
        self.text = run.stop_at.strip()
        self.metric, self.op, self.value = parse_stop_at(run.stop_at) or (None, None, None)
        self.reached: str | None = None  # why the target counts as reached, once it is
        if self.metric is None:
            return
        if not has_test_split:
            raise ConfigError("--stop-at: this run has no test split to evaluate; give it test "
                              "data, or drop --stop-at")
        available = evaluation_metrics(metric_names)
        if self.metric not in available:
            raise ConfigError(f"--stop-at: this run's evaluation reports no {self.metric!r}; "
                              f"choose one of {', '.join(available)}")

    def evaluated(self, test: tuple[float, dict[str, float | None]] | None,
                  global_step: int) -> None:
        """After an evaluation at ``global_step``; ``test`` is (loss, metrics) where this
        process scored the test split, else None (it learns of the target through the stop)."""
        if self.metric is None or test is None or self.reached is not None:
            return
        value = judged_value(test, self.metric, "--stop-at")
        if value is None:
            return  # a NaN evaluation reaches nothing
        if reaches(value, self.op, self.value):
            self.reached = f"{self.metric} {value:.6g} {self.op} {self.value:g} at step " \
                           f"{global_step}"
