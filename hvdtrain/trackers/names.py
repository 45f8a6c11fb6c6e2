"""--tracker's value: which trackers, and whether their libraries are installed. Plain
ValueErrors and messages, so that the config (config/values.py) can check a config without importing the trackers
(which import the config)."""

from __future__ import annotations

import importlib.util
import os

from . import TRACKERS


def tracker_names(text: str) -> list[str]:
    """``mlflow``, ``wandb`` or ``mlflow,wandb``, each once; ValueError for anything else."""
    names = [n.strip().lower() for n in text.split(",") if n.strip()]
    for name in names:
        if name not in TRACKERS:
            raise ValueError(f"--tracker: unknown tracker {name!r}; use "
                             f"{', '.join(TRACKERS)} or several joined by commas")
    return list(dict.fromkeys(names))


def missing_package(names: list[str]) -> str | None:
    """What to install for these trackers, or None when nothing is missing."""
    for name in names:
        _, package, install = TRACKERS[name]
        if importlib.util.find_spec(package) is None:
            return (f"--tracker {name} needs the {package} package, which is not installed: "
                    f"{install} (or leave out --tracker {name})")
    if "mlflow" in names and not os.environ.get("MLFLOW_TRACKING_URI"):
        for package in ("sqlalchemy", "alembic"):  # the SQLite store in the run folder
            if importlib.util.find_spec(package) is None:
                return (f"--tracker mlflow keeps its runs in a SQLite store, which needs "
                        f"{package}: {TRACKERS['mlflow'][2]} (or set MLFLOW_TRACKING_URI to a "
                        f"tracking server)")
    return None


WANDB_PROJECT_CHARS = "/\\#?%:"  # characters that W&B refuses in a project name


def project_problem(names: list[str], project: str) -> str | None:
    """What is wrong with --tracker-project for these trackers (found at run time by the tracker
    otherwise, after the training started), or None."""
    if not project.strip():
        return ("--tracker-project: an empty name; pass the MLflow experiment or W&B project to "
                "log to, e.g. --tracker-project hvdtrain (the default)")
    bad = sorted({c for c in project if c in WANDB_PROJECT_CHARS})
    if "wandb" in names and (bad or len(project) > 128):
        return (f"--tracker-project: W&B takes project names of at most 128 characters without "
                f"{' '.join(WANDB_PROJECT_CHARS)}; {project!r} "
                + (f"has {' '.join(bad)}" if bad else f"has {len(project)} characters"))
    return None

