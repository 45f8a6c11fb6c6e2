"""The options of what the run reports: step lines, the progress bar, TensorBoard and
experiment trackers."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError
from .values import check_tracker, opt, parse_profile_steps, refuse_unread


@dataclass
class LogOptions:
    """What the run logs besides its metrics.jsonl, and where."""

    log_steps: bool = opt(False, "also log one line per step: sync, the loss averaged across "
                          "workers (one small allreduce per step); async, worker 0's own, at "
                          "each global step it reaches")
    progress: bool = opt(True, "show the progress bar on the main process")
    tensorboard: bool = opt(False, "also write TensorBoard event files to the run folder: losses, "
                            "metrics, learning rate, samples per second, the async staleness "
                            "histogram, and each step with --log-steps. View them with "
                            "tensorboard --logdir runs/")
    tracker: str = opt("", "also log the run to an experiment tracker: mlflow, wandb, or "
                       "mlflow,wandb. One tracker run per job, from the main process: the "
                       "header (config, world, versions) as parameters, every line's figures "
                       "at the global step; a resume continues it. MLflow writes to "
                       "mlflow.db in the run folder unless MLFLOW_TRACKING_URI is set; W&B "
                       "runs offline in the run folder unless you have logged in. A tracker "
                       "that fails warns once and training goes on (docs/trackers.md)")
    tracker_project: str = opt("hvdtrain", "with --tracker: the MLflow experiment or W&B "
                               "project the run goes into")
    profile_steps: str = opt("", "profile steps FIRST:LAST of each worker process (counted from "
                             "1; FIRST >= 2) with torch.profiler: a summary per step (operators, "
                             "and on a GPU kernel launches, synchronizations, copies, busy time) "
                             "and the operator table in profile-rank<R>-steps<FIRST>-<LAST>.txt, "
                             "the timeline beside it (.json), in the run folder. E.g. 50:70")
    tracker_artifacts: bool = opt(False, "with --tracker: also upload checkpoint.pt and best.pt "
                                  "(--keep-best) as artifacts at the end of the run")

    def check_logs(self) -> None:
        if self.profile_steps:
            parse_profile_steps(self.profile_steps)
        if self.tensorboard:
            import importlib.util
            if importlib.util.find_spec("tensorboard") is None:
                raise ConfigError("--tensorboard needs the tensorboard package, which is not "
                                  "installed: pip install tensorboard (or leave out --tensorboard)")
        if self.tracker:
            check_tracker(self.tracker, self.tracker_project)
        refuse_unread(self, ("tracker_project", "tracker_artifacts"), bool(self.tracker),
                      "it is read with --tracker, and this run logs to no tracker: add "
                      "--tracker mlflow (or wandb), or drop {flag}")
