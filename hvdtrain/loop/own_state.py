"""Each worker's own state beside a checkpoint: what a scheme's workers hold apart and the lead's
checkpoint lacks (Group.own_state, scheme.py; async DiLoCo: each worker's inner optimizer). A
parameter server keeps its shard the same way (ps/shard_file.py), under its own owner key.

No collective: async workers reach a checkpoint at different moments, and a lost worker never
reaches one, so a meeting there could hang the job. Instead each worker other than the lead
writes its own file (checkpoint.worker-1.pt beside checkpoint.pt) at the same save, tagged with
the checkpoint's position, and on resume takes it back only where the tag is the resumed
checkpoint's: the same run identity, epoch and step. Otherwise (no file, a file of another
position, say a step checkpoint this worker reached at another step, or one it cannot read) the
worker starts from the lead's state in the checkpoint, as every worker did before, and says why.

A save keeps the file it replaces (a hard link, checkpoint.worker-1.previous.pt), which a read
tries second: where the job died after this file was written and before the lead's checkpoint
landed, the lead's previous checkpoint and this previous file still make a whole pair.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .. import checkpoint

BASE_KEYS = ("identity", "epoch", "step")


def position(identity: dict[str, Any], epoch: int, step: int, worker: int) -> dict[str, Any]:
    """The tag that ties a worker's file to one checkpoint of one run."""
    return {**checkpoint_position(identity, epoch, step), checkpoint.WORKER_FILE_KEY: worker}


def checkpoint_position(identity: dict[str, Any], epoch: int, step: int) -> dict[str, Any]:
    """A tag's part that names the checkpoint, not the file's owner."""
    return {"identity": identity, "epoch": epoch, "step": step}


def owner(tag: dict[str, Any]) -> tuple[str, int]:
    """(the tag's owner key, the owner's number): a worker's, or a parameter server's."""
    key = next(k for k in checkpoint.OWNERS if k in tag)
    return key, int(tag[key])


def owner_name(tag: dict[str, Any]) -> str:
    key, number = owner(tag)
    return f"{'parameter server' if key == checkpoint.SERVER_FILE_KEY else 'worker'} {number}"


def own_file(beside: Path, tag: dict[str, Any]) -> Path:
    key, number = owner(tag)
    return (checkpoint.server_file if key == checkpoint.SERVER_FILE_KEY
            else checkpoint.worker_file)(beside, number)


def previous_file(path: Path) -> Path:
    return path.with_name(f"{path.stem}.previous{path.suffix}")


def save(state: dict[str, Any], beside: Path, tag: dict[str, Any],
         fallback: str = "from worker 0's state") -> Path | None:
    """Write this worker's ``state`` atomically beside the checkpoint ``beside``. A failed write
    is a warning, not the job's end: the checkpoint itself is worker 0's, and a resume from it
    starts this worker ``fallback`` (read says why)."""
    path = own_file(beside, tag)
    _keep_previous(path)
    try:
        return checkpoint.save_atomic({**tag, "checkpoint": beside.name, "state": state}, path)
    except checkpoint.CheckpointWriteError as e:
        print(f"hvdtrain: warning: could not write {path} ({e}); a resume from {beside} starts "
              f"{owner_name(tag)} {fallback}", flush=True)
        return None


def _keep_previous(path: Path) -> None:
    """Link the file about to be replaced under its previous name; where the filesystem has
    no hard links, only the newest file is kept."""
    previous = previous_file(path)
    try:
        previous.unlink(missing_ok=True)
        if path.exists():
            os.link(path, previous)
    except OSError:
        pass


def read(beside: Path, tag: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """(this worker's state, "") from its file beside the checkpoint ``beside`` where the file's
    tag is ``tag`` (else the file it replaced, where that one's is); else (None, why not)."""
    path = own_file(beside, tag)
    state, why = _read_tagged(path, beside, tag)
    if state is None and previous_file(path).is_file():
        state = _read_tagged(previous_file(path), beside, tag)[0]
    return state, why


def _read_tagged(path: Path, beside: Path, tag: dict[str, Any]
                 ) -> tuple[dict[str, Any] | None, str]:
    if not path.is_file():
        return None, f"no {path.name} beside {beside}"
    try:
        saved = checkpoint.load_checked(path)
    except Exception as e:  # noqa: BLE001 - truncated, foreign: any unreadable file falls back
        return None, f"{path} is unreadable ({checkpoint.unreadable_reason(path, e)})"
    if not isinstance(saved, dict) or not isinstance(saved.get("state"), dict):
        return None, f"{path} is not a worker's file of hvdtrain"
    differ = [key for key in (*BASE_KEYS, owner(tag)[0]) if saved.get(key) != tag[key]]
    if differ:
        return None, f"{path} belongs to another checkpoint ({_mismatch(saved, tag, differ)})"
    return saved["state"], ""


def _mismatch(saved: dict[str, Any], tag: dict[str, Any], differ: list[str]) -> str:
    if "identity" in differ:
        return "written for another run setup"
    key = owner(tag)[0]
    if key in differ:
        return f"{checkpoint.OWNERS[key]} {saved.get(key)}'s"
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
    print(f"hvdtrain: worker {tag[checkpoint.WORKER_FILE_KEY]} starts from the checkpoint's "
          f"{getattr(component, 'name', 'state')} (worker 0's, or a fresh one where it holds "
          f"none), not its own: {why}", flush=True)
    return False
