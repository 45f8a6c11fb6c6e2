"""The tracker sinks that ``--tracker`` asks for (loop/sinks.py calls this, on the main process
only: one tracker run per job)."""

from __future__ import annotations

import importlib
from pathlib import Path

from ..checkpoint import CHECKPOINT_NAME
from ..config import ConfigError, RunConfig
from . import TRACKERS, names
from .sink import Backend, TrackerSink
from .state import previous_state


def tracker_names(text: str) -> list[str]:
    try:
        return names.tracker_names(text)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def check_installed(tracker_names: list[str]) -> None:
    problem = names.missing_package(tracker_names)
    if problem:
        raise ConfigError(problem)


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
