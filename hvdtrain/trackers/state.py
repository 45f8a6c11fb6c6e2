"""tracker.json in the run folder: which tracker run this folder's job logs to, the last global
step it logged and the metrics it logged at that step. A resumed run (--resume, --auto-resume)
continues that tracker run and skips the steps it trains again, which the first attempt logged
already (TensorBoard's purge does the same for event files). At the last step itself only the
metrics named are skipped: a stop line and the scheme's summary go out at a stop's step, and the
epoch line that ends at that step comes after the resume.

    {"mlflow": {"job_key": "...", "run_id": "...", "tracking_uri": "...", "last_step": 120,
                "last_names": ["scheme/pushes_applied", ...], "params": true}}

job_key is hvdtrain's name for the job's tracker run, written before the tracker opens it (a
new MLflow store takes seconds to create): MLflow's run is tagged with it, W&B's id is made of
it.

Every checkpoint also carries the file's entries (CheckpointRecord below), so a checkpoint moved
to another folder, or a run folder that lost tracker.json, still continues its tracker run.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

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


def resume_point(entry: dict[str, Any]) -> tuple[int, frozenset[str] | None]:
    """The last step that the entry's tracker run logged (-1: none, or no run yet) and the
    metric names it logged there; None for an entry that kept no names (all of them)."""
    if not entry.get("run_id"):
        return -1, frozenset()
    names = entry.get("last_names")
    return (int(entry.get("last_step", -1)),
            frozenset(names) if isinstance(names, list) else None)


def write_state(run_dir: Path, name: str, entry: dict[str, Any]) -> None:
    """Atomically, so that a job killed while writing leaves the previous file."""
    data = read_state(run_dir)
    data[name] = entry
    path = run_dir / STATE_NAME
    tmp = path.with_name(f".{STATE_NAME}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)


class CheckpointRecord:
    """The checkpoint's copy of tracker.json (a component of loop/checkpointer.py, saved under
    "trackers"). Restoring it writes back the entries that neither the run folder nor the folder
    resumed from has: those files, when present, know a later logged step than the checkpoint.
    Steps the lost file's tracker run logged after the checkpoint are then logged again."""

    def __init__(self, folder: Callable[[], Path], resume: str | None):
        self.folder = folder  # the run folder, known once the run claimed it
        self.resume = resume

    def state_dict(self) -> dict[str, Any]:
        return read_state(self.folder())

    def load_state_dict(self, saved: dict[str, Any] | None) -> None:
        for name, entry in (saved or {}).items():
            if (isinstance(entry, dict) and names_a_run(entry)
                    and not names_a_run(previous_state(self.folder(), self.resume, name))):
                write_state(self.folder(), name, entry)


def names_a_run(entry: dict[str, Any]) -> bool:
    """By the tracker's own id, or (before the tracker opened the run) by the job's key."""
    return bool(entry.get("run_id") or entry.get("job_key"))
