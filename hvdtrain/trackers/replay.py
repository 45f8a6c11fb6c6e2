"""Send a finished (or failed) run's log to a tracker afterwards, from metrics.jsonl:

    python -m hvdtrain.trackers.replay RUN_DIR --tracker mlflow

For a run whose tracker failed during training (the warning names this command). It continues
the tracker run that tracker.json names, after the last step that reached it, or starts one.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import ConfigError
from ..loop.sinks import LOG_NAME
from ..run_output import read_run_log
from .build import check_installed, make_backend, tracker_names
from .names import project_problem
from .sink import TrackerSink
from .state import previous_state


def replay(run_dir: Path, tracker: str, project: str) -> int:
    """Sends every line of run_dir's log to each tracker; 0 when all of them took it.
    ConfigError for a tracker that is not one or not installed, ValueError for a log that is
    not one (run_output.read_run_log)."""
    names = tracker_names(tracker)
    check_installed(names)
    if problem := project_problem(names, project):
        raise ConfigError(problem)
    lines, cut = read_run_log(run_dir / LOG_NAME)
    if cut:
        print(f"hvdtrain: warning: {cut}", file=sys.stderr, flush=True)
    failed = 0
    for name in names:
        sink = TrackerSink(make_backend(name, run_dir, project), run_dir,
                           previous_state(run_dir, None, name), timeout=3600)
        for line in lines:
            fields = {k: v for k, v in line.items() if k not in ("type", "time")}
            sink.record(line["type"], fields)
        sink.close()
        failed += sink.failed
        print(f"hvdtrain: {len(lines)} line(s) of {run_dir / LOG_NAME} sent to {name}"
              + (" (failed)" if sink.failed else ""), flush=True)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hvdtrain.trackers.replay",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, help="the run folder (holds metrics.jsonl)")
    parser.add_argument("--tracker", required=True, help="mlflow, wandb or mlflow,wandb")
    parser.add_argument("--tracker-project", default="hvdtrain",
                        help="the MLflow experiment or W&B project")
    args = parser.parse_args(argv)
    if not (args.run_dir / LOG_NAME).is_file():
        parser.error(f"{args.run_dir / LOG_NAME} does not exist: pass a run folder")
    try:
        return replay(args.run_dir, args.tracker, args.tracker_project)
    except (ConfigError, ValueError, OSError) as e:  # one line: no usage for a bad log
        print(f"{parser.prog}: error: {e}", file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
