"""Atomic checkpoint files.

A checkpoint is written to a temporary file in the same folder, flushed to disk, then renamed over
the old one. A crash or a full disk mid-write leaves the previous checkpoint intact. Loading uses
``torch.load(weights_only=True)``, which refuses to run code stored in the file.
"""

from __future__ import annotations

import os
import re
import zipfile
from pathlib import Path
from typing import Any, Callable

import torch

from .processes import process_alive

CHECKPOINT_NAME = "checkpoint.pt"
FORMAT_VERSION = 1
# Mark a worker's own file and a parameter server's shard beside a checkpoint
# (loop/own_state.py, ps/shard_file.py), which are no checkpoints
WORKER_FILE_KEY = "own_state_of_worker"
SERVER_FILE_KEY = "shard_of_server"
OWNERS = {WORKER_FILE_KEY: "worker", SERVER_FILE_KEY: "server"}


class CheckpointError(RuntimeError):
    """A checkpoint is missing, unreadable, or belongs to a different run setup."""


class CheckpointWriteError(RuntimeError):
    """Writing a checkpoint failed (full disk, quota, lost mount); the previous one is intact."""


def intact_note(run_dir: str | os.PathLike, fix: str) -> str:
    """What a failed run leaves to continue from: "the last checkpoint RUN/checkpoint.pt is
    intact; <fix> and continue with --resume RUN", or that there is none yet."""
    path = Path(run_dir) / CHECKPOINT_NAME
    if not path.exists():
        return "no checkpoint was written yet"
    return f"the last checkpoint {path} is intact; {fix} and continue with --resume {path.parent}"


def checkpoint_path(path: str | os.PathLike) -> Path:
    """Accept a run folder or a checkpoint file."""
    p = Path(path)
    return p / CHECKPOINT_NAME if p.is_dir() else p


def worker_file(path: str | os.PathLike, worker: int) -> Path:
    """Where worker ``worker`` keeps its own state beside the checkpoint ``path``
    (loop/own_state.py), named after it: checkpoint.pt -> checkpoint.worker-1.pt."""
    return _named_beside(path, f"worker-{worker}")


def server_file(path: str | os.PathLike, server: int) -> Path:
    """Where parameter server ``server`` keeps its shard beside the checkpoint ``path``
    (ps/shard_file.py): checkpoint.pt -> checkpoint.server-0.pt."""
    return _named_beside(path, f"server-{server}")


def _named_beside(path: str | os.PathLike, owner: str) -> Path:
    path = Path(path)
    return path.with_name(f"{path.stem}.{owner}{path.suffix}")


def checkpoint_beside(path: str | os.PathLike) -> Path | None:
    """The checkpoint whose worker's or server's file ``path`` is named as (worker_file,
    server_file), else None."""
    match = _OWN_FILE_NAME.fullmatch(Path(path).name)
    return Path(path).with_name(match[1] + (match[3] or "")) if match else None


def not_a_checkpoint(what: str, beside: Path) -> str:
    """The refusal of a file beside a checkpoint (``what`` it holds) given to --resume."""
    return f"{what}, kept beside the checkpoint {beside}, not a checkpoint; resume from {beside}"


def file_owner(path: str | os.PathLike) -> str | None:
    """"worker" or "server": whose file beside a checkpoint ``path`` is named as, else None."""
    match = _OWN_FILE_NAME.fullmatch(Path(path).name)
    return match[2] if match else None


_OWN_FILE_NAME = re.compile(r"(.+)\.(worker|server)-\d+(\.[^.]*)?")


def map_tensors(obj: Any, fn: Callable[[torch.Tensor, tuple], torch.Tensor], key: tuple = (),
                seen: dict[int, torch.Tensor] | None = None) -> Any:
    """``obj`` with each tensor replaced by ``fn(tensor, key)``, ``key`` being the path of dict
    keys and list indices to it. A tensor that appears twice (tied weights) is mapped once and
    stays one tensor; dicts, lists and tuples are rebuilt (a state_dict keeps its
    ``_metadata``, the module versions that loading reads); other values are shared."""
    seen = {} if seen is None else seen
    if isinstance(obj, torch.Tensor):
        if id(obj) not in seen:
            seen[id(obj)] = fn(obj, key)
        return seen[id(obj)]
    if isinstance(obj, dict):
        out = type(obj)((k, map_tensors(v, fn, (*key, k), seen)) for k, v in obj.items())
        if hasattr(obj, "_metadata"):
            out._metadata = obj._metadata
        return out
    if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
        return type(obj)(map_tensors(v, fn, (*key, i), seen) for i, v in enumerate(obj))
    return obj


def on_cpu(obj: Any) -> Any:
    """``obj`` with every GPU tensor copied to CPU memory (CPU tensors as they are). A checkpoint
    saved with GPU tensors needs ``map_location`` to load on a machine without that GPU; saved
    from here, a plain ``torch.load`` reads it anywhere."""
    return map_tensors(obj, lambda t, _: t if t.device.type == "cpu" else t.detach().cpu())


def save_atomic(state: dict[str, Any], path: str | os.PathLike) -> Path:
    path = Path(path)
    state = on_cpu(state)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save({"format_version": FORMAT_VERSION, **state}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)  # never leave a half-written file behind
        if isinstance(e, OSError):
            raise CheckpointWriteError(e.strerror or str(e)) from e
        if isinstance(e, RuntimeError):  # torch's zip writer reports a failed write this way
            raise CheckpointWriteError(f"{str(e).splitlines()[0]}; is the disk full?") from e
        raise
    _fsync_dir(path.parent)  # make the rename itself durable
    return path


def remove_stale_temporaries(folder: Path) -> list[Path]:
    """Delete what a process killed during save_atomic left behind (``.checkpoint.pt.tmpPID``,
    ``.best.pt.tmpPID``: tens of MB each), unless that process still runs on this host. Returns
    what was removed."""
    removed = []
    for tmp in folder.glob(".*.pt.tmp*"):  # every file save_atomic writes in a run folder
        pid = tmp.name.rsplit(".tmp", 1)[1]
        if pid.isdigit() and process_alive(int(pid)):
            continue
        try:
            tmp.unlink()
            removed.append(tmp)
        except OSError:
            pass  # gone already, or not ours to remove: leave it
    return removed




def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on a directory; the rename is still atomic
    finally:
        os.close(fd)


def _instead(path: Path) -> str:
    """What to do about a checkpoint that cannot be resumed: another one, or a run started over
    without it. --auto-resume finds the file again in its run folder, so it must move."""
    return (f"Resume from an intact checkpoint instead (--resume FILE), or, to start the run "
            f"over, move this file aside (mv {path} {path}.unreadable) or train in another "
            "--run-dir")


def load(path: str | os.PathLike) -> dict[str, Any]:
    path = checkpoint_path(path)
    if not path.is_file():
        raise CheckpointError(f"--resume: no checkpoint at {path}; pass a checkpoint file or a "
                              f"run folder that holds {CHECKPOINT_NAME}")
    if path.suffix in (".jsonl", ".json", ".txt", ".log", ".csv", ".md"):  # not one: no move
        raise CheckpointError(f"--resume: {path} is not a checkpoint but a {path.suffix} file; "
                              f"pass its run folder ({path.parent}) or the {CHECKPOINT_NAME} "
                              "in it")
    try:
        state = load_checked(path)
    except DamagedFile as e:
        raise CheckpointError(f"--resume: {path} is damaged ({e}). {_instead(path)}") from None
    except Exception as e:  # truncated zip, pickle errors, unsupported globals...
        raise CheckpointError(f"--resume: {path} is not a readable checkpoint "
                              f"({unreadable_reason(path, e)}); it may be truncated or from "
                              f"another program. {_instead(path)}") from None
    version = state.get("format_version") if isinstance(state, dict) else None
    if version != FORMAT_VERSION:
        newer = isinstance(version, int) and version > FORMAT_VERSION
        raise CheckpointError(
            f"--resume: {path} is not an hvdtrain checkpoint of this version (format "
            f"{version if version is not None else 'none'}, expected {FORMAT_VERSION}); " + (
                "a newer hvdtrain wrote it: resume with that version" if newer else
                "it was not written by hvdtrain (to start from its weights, load them in your "
                f"--model factory). {_instead(path)}"))
    for key, owner in OWNERS.items():
        if key in state:
            beside = path.with_name(str(state.get("checkpoint", CHECKPOINT_NAME)))
            what = f"{owner} {state[key]}'s own state"
            raise CheckpointError(f"--resume: {path} is {not_a_checkpoint(what, beside)}")
    return state


class DamagedFile(ValueError):
    """A file whose bytes changed after it was written (load_checked)."""


def load_checked(path: Path) -> Any:
    """torch.load(weights_only=True) of a file whose zip records match the CRC-32 checksum that
    torch stored with each. torch reads a record without checking it, so damaged tensor bytes
    (a failing disk, a copy cut short over an older file) loaded as weights: a resume trained on
    from garbage (a loss of 348,636) and overwrote the file with its own checkpoint. Reading
    the file once more costs about a second per GB, on a resume."""
    try:
        with zipfile.ZipFile(path) as archive:
            damaged = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError):
        damaged = None  # not a whole zip: torch.load says why
    if damaged is not None:
        raise DamagedFile(f"its record {damaged} does not match the checksum written with it: "
                          "its bytes changed after it was written")
    return torch.load(path, map_location="cpu", weights_only=True)


def unreadable_reason(path: Path, error: Exception) -> str:
    """Why torch.load refused a file, without torch's advice to pass weights_only=False: hvdtrain
    writes only tensors and plain values, so a file that needs it is not an hvdtrain checkpoint,
    and loading it so would run code stored in the file."""
    text = str(error)
    if isinstance(error, DamagedFile):
        return str(error)
    if not zipfile.is_zipfile(path):
        return "not a torch zip archive"
    unsupported = re.search(r"Unsupported global: GLOBAL ([\w.]+)", text)
    if unsupported:
        return (f"it holds a Python object of type {unsupported.group(1)}, which hvdtrain "
                "checkpoints never contain")
    if text.startswith("Weights only load failed"):
        detail = text.partition("WeightsUnpickler error:")[2].strip().splitlines()
        return f"it holds data that is not tensors or plain values ({detail[0] if detail else '?'})"
    first = text.strip().splitlines()[0] if text.strip() else ""
    return f"{type(error).__name__}: {first}" if first else type(error).__name__


def check_compatible(state: dict[str, Any], expected: dict[str, Any], path: Any) -> None:
    """Compare the identity a checkpoint was written with (model, input shape...) to this run's."""
    saved = state.get("identity", {})
    diffs = [f"{k}: checkpoint has {saved.get(k)!r}, this run has {v!r}"
             for k, v in expected.items() if _spec(saved.get(k)) != _spec(v)]
    if diffs:
        raise CheckpointError(f"--resume: {path} was written for a different setup ("
                              + "; ".join(diffs) + "). Resume with the flags it was trained "
                              "with, or start without --resume")


def _spec(value: Any) -> Any:
    """A MODULE:CALLABLE given as a file by another path (relative, absolute, from another
    folder: a scheduler's restart) is the same model: its file's name and its callable. What
    the file holds is checked tensor by tensor (check_model_state)."""
    if isinstance(value, str) and ".py:" in value:
        file, _, name = value.rpartition(":")
        return Path(file).name, name
    return value


def check_model_state(saved: dict[str, Any], expected: dict[str, Any], path: Any) -> None:
    """The checkpoint's model holds the same tensors as this run's: names, then shapes. The
    message names the first mismatch."""
    missing = [k for k in expected if k not in saved]
    extra = [k for k in saved if k not in expected]
    if missing or extra:
        what = (f"this run's model has {missing[0]!r}, which the checkpoint lacks" if missing
                else f"the checkpoint has {extra[0]!r}, which this run's model lacks")
        raise CheckpointError(f"--resume: {path} holds another model ({what}; {len(missing)} "
                              f"missing, {len(extra)} unexpected). Resume with the model it was "
                              "trained with, or start without --resume")
    for name, tensor in expected.items():
        if tuple(saved[name].shape) != tuple(tensor.shape):
            raise CheckpointError(
                f"--resume: {path} holds another model ({name}: checkpoint has shape "
                f"{tuple(saved[name].shape)}, this run's model {tuple(tensor.shape)}). Resume "
                "with the model options it was trained with, or start without --resume")
