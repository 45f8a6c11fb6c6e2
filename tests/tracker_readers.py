"""What the trackers hold of a run, read back with their own libraries (for the tests of
--tracker): MLflow through mlflow.search_runs on the run folder's store, W&B from the offline
run's .wandb file (a LevelDB-style log of protobuf records; wandb ships no reader of its own
any more, so the framing is read here and each record is parsed with wandb's own protobuf)."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path


def mlflow_store(run_dir: Path) -> str:
    return f"sqlite:///{Path(run_dir).resolve() / 'mlflow.db'}"


def mlflow_runs(store: str) -> list:
    import mlflow
    mlflow.set_tracking_uri(store)
    return mlflow.search_runs(search_all_experiments=True, output_format="list")


def mlflow_history(store: str, run_id: str, name: str) -> list[tuple[int, float]]:
    """Every point of one metric, in step order, duplicates included."""
    from mlflow.tracking import MlflowClient
    points = MlflowClient(store).get_metric_history(run_id, name)
    return sorted((m.step, m.value) for m in points)


def _chunks(data: bytes):
    """The records of a LevelDB log: 32 KiB blocks of [crc32 u32, length u16, type u8] + data,
    type 1 whole, 2/3/4 first/middle/last piece; W&B puts a 7-byte header before the first."""
    ident, _magic, _version = struct.unpack("<4sHB", data[:7])
    assert ident == b":W&B", ident
    pos, block, piece = 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if length == 0 and kind == 0:  # the zeros that pad a block
            pos += left
            continue
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 1:
            yield chunk
        elif kind == 2:
            piece = chunk
        elif kind == 3:
            piece += chunk
        elif kind == 4:
            yield piece + chunk


def wandb_records(path: Path) -> list:
    from wandb.proto import wandb_internal_pb2
    out = []
    for chunk in _chunks(Path(path).read_bytes()):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(chunk)
        out.append(record)
    return out


def wandb_offline_runs(run_dir: Path, timeout: float = 60.0) -> list[Path]:
    """The run's offline W&B files, each once it holds its exit record. W&B's service process
    writes the file on its own: under load, a file read just after finish() returned held no
    run record yet (seen once in CI), so each is waited for, ``timeout`` seconds at most."""
    paths = sorted(Path(run_dir).glob("wandb/offline-run-*/run-*.wandb"))
    deadline = time.monotonic() + timeout
    for path in paths:
        while not _wandb_exited(path) and time.monotonic() < deadline:
            time.sleep(0.2)
    return paths


def _wandb_exited(path: Path) -> bool:
    try:
        return any(r.WhichOneof("record_type") == "exit" for r in wandb_records(path))
    except Exception:  # noqa: BLE001 - a header or a record still half-written: not yet
        return False


def wandb_history(path: Path) -> list[dict]:
    """The rows that run.log wrote, each a dict with its ``_step``."""
    rows = []
    for record in wandb_records(path):
        if record.WhichOneof("record_type") == "history":
            rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                         for item in record.history.item})
    return rows


def wandb_run_id(path: Path) -> str:
    return next(r.run.run_id for r in wandb_records(path) if r.WhichOneof("record_type") == "run")
