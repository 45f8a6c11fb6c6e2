"""The options of evaluation and of what it decides: how often, best.pt, early stopping and
the --stop-at target."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError, require
from .values import UnreadOption, opt, parse_metric_goal, parse_stop_at


@dataclass
class EvalOptions:
    """When the test split is scored, and what the scores decide."""

    eval_every: int = opt(1, "evaluate test accuracy every N epochs (and always at the end)")
    eval_every_steps: int = opt(0, "also evaluate every N steps (of worker 0) inside the epochs "
                                "and log an eval line stamped with the wall time (0: only at "
                                "epoch ends); what compare uses to time the target to a few "
                                "percent. Early stopping and --keep-best still follow the "
                                "epoch evaluations")
    keep_best: str = opt("", "also keep best.pt in the run folder, the checkpoint of the best "
                         "evaluation so far by this metric: test_loss, test_acc or any test_ "
                         "metric the run reports. Names ending in loss are minimised, others "
                         "maximised; a min: or max: prefix says which, e.g. min:test_mae")
    early_stop_patience: int = opt(0, "stop when the --keep-best metric has not improved in N "
                                   "evaluations (0: never); the run then writes its final "
                                   "checkpoint and exits 0")
    stop_at: str = opt("", "stop training once an evaluation (at an epoch's end, or every "
                       "--eval-every-steps steps) reaches a target: NAME>=VALUE or "
                       "NAME<=VALUE with NAME a test_ metric the run reports, e.g. "
                       "test_acc>=0.95 or test_loss<=0.1 (time to accuracy). Every worker "
                       "stops within a step or two, the checkpoint is written and the run "
                       "exits 0")

    def check_eval(self) -> None:
        require(self.eval_every >= 1, "--eval-every", self.eval_every,
                "evaluate every N >= 1 epochs")
        require(self.eval_every_steps >= 0, "--eval-every-steps", self.eval_every_steps,
                "use 0 (epoch ends only) or a number of steps, e.g. 10")
        try:
            parse_metric_goal(self.keep_best)
        except ValueError as e:
            raise ConfigError(f"--keep-best: invalid value {self.keep_best!r}; {e}") from None
        try:
            parse_stop_at(self.stop_at)
        except ValueError as e:
            raise ConfigError(f"--stop-at: invalid value {self.stop_at!r}; {e}") from None
        require(self.early_stop_patience >= 0, "--early-stop-patience", self.early_stop_patience,
                "use 0 (never stop early) or a number of evaluations, e.g. 3")
        if self.early_stop_patience and not self.keep_best:
            raise UnreadOption("--early-stop-patience watches the metric of --keep-best: pass "
                               "--keep-best METRIC too (e.g. --keep-best test_acc), or drop "
                               "--early-stop-patience", "early_stop_patience")
