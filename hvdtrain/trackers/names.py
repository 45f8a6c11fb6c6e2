"""--tracker's value: which trackers, and whether their libraries are installed. Plain
ValueErrors and messages, so that config.py can check a config without importing the trackers
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
