"""Each worker's own state beside a checkpoint: what a scheme's workers hold apart and the lead's
checkpoint lacks (Group.own_state, scheme.py; async DiLoCo: each worker's inner optimizer).

No collective: async workers reach a checkpoint at different moments, and a lost worker never
reaches one, so a meeting there could hang the job. Instead each worker other than the lead
writes its own file (checkpoint.worker-1.pt beside checkpoint.pt) at the same save, tagged with
the checkpoint's position, and on resume takes it back only where the tag is the resumed
checkpoint's: the same run identity, epoch and step. Otherwise (no file, a file of another
position, say a step checkpoint this worker reached at another step, or one it cannot read) the
worker starts from the lead's state in the checkpoint, as every worker did before, and says why.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from .. import checkpoint

TAG_KEYS = ("identity", "epoch", "step", checkpoint.WORKER_FILE_KEY)


def position(identity: dict[str, Any], epoch: int, step: int, worker: int) -> dict[str, Any]:
    """The tag that ties a worker's file to one checkpoint of one run."""
    return {"identity": identity, "epoch": epoch, "step": step,
            checkpoint.WORKER_FILE_KEY: worker}


def save(state: dict[str, Any], beside: Path, tag: dict[str, Any]) -> Path | None:
    """Write this worker's ``state`` atomically beside the checkpoint ``beside``. A failed write
    is a warning, not the job's end: the checkpoint itself is worker 0's, and a resume from it
    starts this worker from worker 0's state (read says why)."""
    path = checkpoint.worker_file(beside, tag[checkpoint.WORKER_FILE_KEY])
    try:
        return checkpoint.save_atomic({**tag, "checkpoint": beside.name, "state": state}, path)
    except checkpoint.CheckpointWriteError as e:
        print(f"hvdtrain: warning: could not write {path} ({e}); a resume from {beside} starts "
              f"worker {tag[checkpoint.WORKER_FILE_KEY]} from worker 0's state", flush=True)
        return None


def read(beside: Path, tag: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """(this worker's state, "") from its file beside the checkpoint ``beside`` where the file's
    tag is ``tag``; else (None, why not)."""
    path = checkpoint.worker_file(beside, tag[checkpoint.WORKER_FILE_KEY])
    if not path.is_file():
        return None, f"no {path.name} beside {beside}"
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - truncated, foreign: any unreadable file falls back
        return None, f"{path} is unreadable ({checkpoint.unreadable_reason(path, e)})"
    if not isinstance(saved, dict) or not isinstance(saved.get("state"), dict):
        return None, f"{path} is not a worker's file of hvdtrain"
    differ = [key for key in TAG_KEYS if saved.get(key) != tag[key]]
    if differ:
        return None, f"{path} belongs to another checkpoint ({_mismatch(saved, tag, differ)})"
    return saved["state"], ""


def _mismatch(saved: dict[str, Any], tag: dict[str, Any], differ: list[str]) -> str:
    if "identity" in differ:
        return "written for another run setup"
    if checkpoint.WORKER_FILE_KEY in differ:
        return f"worker {saved.get(checkpoint.WORKER_FILE_KEY)}'s"
    return (f"written at epoch {saved.get('epoch')}, step {saved.get('step')}; the checkpoint "
            f"is at epoch {tag['epoch']}, step {tag['step']}")


def restore(component: Any, beside: Path, tag: dict[str, Any]) -> bool:
    """Load this worker's file beside ``beside`` into ``component`` (its state_dict's
    counterpart); False, and one line saying why, where the worker keeps the lead's state."""
    state, why = read(beside, tag)
    if state is not None:
        try:
            component.load_state_dict(state)
            return True
        except (KeyError, TypeError, ValueError, RuntimeError) as e:
            why = f"it does not fit this run ({type(e).__name__}: {e})"
    print(f"hvdtrain: worker {tag[checkpoint.WORKER_FILE_KEY]} starts from worker 0's "
          f"{getattr(component, 'name', 'state')} in the checkpoint, not its own: {why}",
          flush=True)
    return False
