"""The tracker sinks that ``--tracker`` asks for (loop/sinks.py calls this, on the main process
only: one tracker run per job)."""

from __future__ import annotations

import importlib
import importlib.util
import os
from pathlib import Path

from ..checkpoint import CHECKPOINT_NAME
from ..config import ConfigError, RunConfig
from . import TRACKERS
from .sink import Backend, TrackerSink
from .state import previous_state


def tracker_names(text: str) -> list[str]:
    """``mlflow``, ``wandb`` or ``mlflow,wandb``; a clear error for anything else."""
    names = [n.strip().lower() for n in text.split(",") if n.strip()]
    for name in names:
        if name not in TRACKERS:
            raise ConfigError(f"--tracker: unknown tracker {name!r}; use "
                              f"{', '.join(TRACKERS)} or several joined by commas")
    return list(dict.fromkeys(names))


def check_installed(names: list[str]) -> None:
    for name in names:
        _, package, install = TRACKERS[name]
        if importlib.util.find_spec(package) is None:
            raise ConfigError(f"--tracker {name} needs the {package} package, which is not "
                              f"installed: {install} (or leave out --tracker {name})")
    if "mlflow" in names and not os.environ.get("MLFLOW_TRACKING_URI"):
        for package in ("sqlalchemy", "alembic"):  # the SQLite store in the run folder
            if importlib.util.find_spec(package) is None:
                raise ConfigError(f"--tracker mlflow keeps its runs in a SQLite store, which "
                                  f"needs {package}: {TRACKERS['mlflow'][2]} (or set "
                                  f"MLFLOW_TRACKING_URI to a tracking server)")


def artifact_paths(run: RunConfig, run_dir: Path) -> list[Path]:
    """What --tracker-artifacts uploads at the end: the last checkpoint and best.pt."""
    if not run.tracker_artifacts:
        return []
    from ..loop.best import BEST_NAME
    return [run_dir / CHECKPOINT_NAME, run_dir / BEST_NAME]


def make_backend(name: str, run_dir: Path, project: str) -> Backend:
    module, cls = TRACKERS[name][0].split(".")
    return getattr(importlib.import_module(f".{module}", __package__), cls)(run_dir, project)


def tracker_sinks(run: RunConfig, run_dir: Path) -> list[TrackerSink]:
    sinks: list[TrackerSink] = []
    for name in tracker_names(run.tracker):
        sinks.append(TrackerSink(make_backend(name, run_dir, run.tracker_project), run_dir,
                                 previous_state(run_dir, run.resume, name),
                                 artifact_paths(run, run_dir)))
    return sinks
