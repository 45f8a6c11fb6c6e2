"""tracker.json in the run folder: which tracker run this folder's job logs to, and the last
global step it logged. A resumed run (--resume, --auto-resume) continues that tracker run and
skips the steps it trains again, which the first attempt logged already (TensorBoard's purge
does the same for event files).

    {"mlflow": {"run_id": "...", "tracking_uri": "...", "last_step": 120, "params": true}}
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

STATE_NAME = "tracker.json"


def read_state(folder: Path) -> dict[str, Any]:
    try:
        data = json.loads((folder / STATE_NAME).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def previous_state(run_dir: Path, resume: str | None, name: str) -> dict[str, Any]:
    """This tracker's entry in the run folder, or else in the folder of the run resumed from
    (--resume FILE or FOLDER into a new --run-dir continues that run's tracker run)."""
    found = read_state(run_dir).get(name)
    if not found and resume:
        source = Path(resume)
        found = read_state(source if source.is_dir() else source.parent).get(name)
    return dict(found) if isinstance(found, dict) else {}


def write_state(run_dir: Path, name: str, entry: dict[str, Any]) -> None:
    """Atomically, so that a job killed while writing leaves the previous file."""
    data = read_state(run_dir)
    data[name] = entry
    path = run_dir / STATE_NAME
    tmp = path.with_name(f".{STATE_NAME}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)
