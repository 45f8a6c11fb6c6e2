"""MLflow behind TrackerSink (sink.py): one MLflow run per job, in a SQLite store in the run
folder (``mlflow.db``, artifacts in ``mlartifacts/``) unless MLFLOW_TRACKING_URI names another
store or a server. ``hvdtrain compare --tracker mlflow`` sets MLFLOW_PARENT_RUN_ID for its runs,
which become children of the comparison's run (parent.py).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

from .metrics import params_of

PARENT_ENV = "MLFLOW_PARENT_RUN_ID"
# The environment MLflow gets unless the user set these (the user's own settings win).
# MLflow retries an HTTP call for minutes by default; a server that does not answer should cost
# the run seconds, not minutes. MLflow 3's usage telemetry writes ~/.config/mlflow/telemetry.json
# and calls MLflow's servers, from a run whose store is offline in its own folder.
ENV_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                "MLFLOW_HTTP_REQUEST_TIMEOUT": "10", "MLFLOW_DISABLE_TELEMETRY": "true"}
JOB_TAG = "hvdtrain.job_key"  # sink.py's key of the job, by which a resume finds its run
PARAM_CHARS = 500  # the smallest limit of the MLflow versions in use


def local_store(folder: Path) -> str:
    return f"sqlite:///{folder.resolve() / 'mlflow.db'}"


SQLITE = "sqlite:///"
CHECK_TIMEOUT = 5.0  # seconds a store may stay locked before its check gives up


def sqlite_file(uri: str) -> Path | None:
    """The file of a SQLite store URI (``sqlite:///m.db`` is relative to the working folder,
    ``sqlite:////abs/m.db`` absolute), None for other stores."""
    if not uri.startswith(SQLITE):
        return None
    path = uri[len(SQLITE):].split("?", 1)[0]
    return Path(path) if path and path != ":memory:" else None


def absolute_uri(uri: str) -> str:
    """A relative SQLite URI made absolute, so that tracker.json names the same store from a
    resume started in another folder."""
    path = sqlite_file(uri)
    if path is None or path.is_absolute():
        return uri
    _, mark, query = uri.partition("?")
    return f"{SQLITE}{path.resolve()}{mark}{query}"


def store_exists(uri: str) -> bool:
    """False for a local SQLite store whose file is gone (MLflow would make an empty one)."""
    path = sqlite_file(uri)
    return path is None or path.is_file()


def check_store(uri: str) -> None:
    """A SQLite store that MLflow cannot use fails here at once, in one line: MLflow itself
    retries a corrupt file for about 100 s, printing each retry. A file that does not exist yet
    is fine (MLflow creates it) if its folder exists."""
    import sqlite3

    path = sqlite_file(uri)
    if path is None:
        return
    if not path.is_file():
        if not path.parent.is_dir():
            raise RuntimeError(f"the folder of the SQLite store {uri} does not exist: create "
                               f"{path.parent} or set MLFLOW_TRACKING_URI to another store")
        return
    try:
        connection = sqlite3.connect(path, timeout=CHECK_TIMEOUT)
        try:
            connection.execute("SELECT count(*) FROM sqlite_master").fetchone()
        finally:
            connection.close()
    except sqlite3.Error as e:
        raise RuntimeError(f"the SQLite store {path} cannot be used ({e}): move it away, or "
                           f"set MLFLOW_TRACKING_URI to another store") from None


def client_for(uri: str):
    if not uri:  # MlflowClient would take MLflow 3's default: ./mlflow.db of the working folder
        raise RuntimeError("no MLflow store to log to")
    check_store(uri)
    for name, value in ENV_DEFAULTS.items():
        os.environ.setdefault(name, value)
    for noisy in ("mlflow.store.db.utils", "alembic"):  # "Creating initial MLflow database..."
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if uri.startswith("sqlite:"):
        _fewer_syncs()
    from mlflow.tracking import MlflowClient
    return MlflowClient(tracking_uri=uri)


def _fewer_syncs() -> None:
    """A new SQLite store runs MLflow's schema migrations, dozens of transactions that each wait
    for the disk (measured here: 11 s to open the store, 6 s with this). In WAL mode with
    synchronous=NORMAL a commit does not wait for the disk, and a killed process still leaves a
    sound database (a power cut may lose the last commits). Only SQLite connections: only
    MLflow uses SQLAlchemy in hvdtrain's main process."""
    import sqlite3

    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    if getattr(_fewer_syncs, "done", False):
        return

    @event.listens_for(Engine, "connect")
    def pragmas(connection, _record) -> None:
        if isinstance(connection, sqlite3.Connection):
            cursor = connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.close()

    _fewer_syncs.done = True  # type: ignore[attr-defined]


def experiment_id(client, project: str, folder: Path, uri: str) -> str:
    exp = client.get_experiment_by_name(project)
    if exp is not None:
        return exp.experiment_id
    # A local store keeps its artifacts beside it, not in ./mlruns of the working folder.
    where = (folder.resolve() / "mlartifacts").as_uri() if uri.startswith("sqlite:") else None
    try:
        return client.create_experiment(project, artifact_location=where)
    except Exception:  # made meanwhile by another job of the same server
        exp = client.get_experiment_by_name(project)
        if exp is None:
            raise
        return exp.experiment_id


def logged_so_far(client, run) -> dict[str, Any]:
    """What tracker.json would have said of a run found by its job key: whether it has its
    parameters (MLflow refuses to change one), its last step, after which a resume logs, and
    the metrics it has at that step."""
    points = [(m.step, key) for key in run.data.metrics
              for m in client.get_metric_history(run.info.run_id, key)]
    last = max((step for step, _ in points), default=-1)
    return {"params": bool(run.data.params), "last_step": last,
            "last_names": sorted({key for step, key in points if step == last})}


class MlflowBackend:
    name = "mlflow"

    def __init__(self, run_dir: Path, project: str):
        self.run_dir = run_dir
        self.project = project
        self.client = None
        self.run_id = ""

    def locate(self, previous: dict[str, Any]) -> dict[str, Any]:
        # The user's store, even one that does not exist yet (MLflow creates it); check_store
        # says why when it cannot be used.
        if os.environ.get("MLFLOW_TRACKING_URI"):
            return {"tracking_uri": absolute_uri(os.environ["MLFLOW_TRACKING_URI"])}
        uri = previous.get("tracking_uri") or ""
        # a checkpoint copied from a run folder that is gone: a new run, in this folder
        return {"tracking_uri": uri if uri and store_exists(uri) else local_store(self.run_dir)}

    def start(self, previous: dict[str, Any]) -> dict[str, Any]:
        uri = self.locate(previous)["tracking_uri"]
        self.client = client_for(uri)
        exp = experiment_id(self.client, self.project, self.run_dir, uri)
        entry: dict[str, Any] = {"tracking_uri": uri}
        if previous.get("run_id") and previous.get("tracking_uri") == uri:  # as before
            self.run_id = previous["run_id"]
        elif (found := self._run_tagged(exp, previous.get("job_key"))) is not None:
            self.run_id = found.info.run_id
            entry.update(logged_so_far(self.client, found))
        if self.run_id:
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            tags = {"hvdtrain.run_dir": str(self.run_dir.resolve()),
                    JOB_TAG: previous.get("job_key", "")}
            if os.environ.get(PARENT_ENV):
                tags["mlflow.parentRunId"] = os.environ[PARENT_ENV]
            run = self.client.create_run(exp, run_name=self.run_dir.name, tags=tags)
            self.run_id = run.info.run_id
            entry.update(params=False, last_step=-1, last_names=[])  # nothing in it yet
        return {**entry, "run_id": self.run_id}

    def _run_tagged(self, exp: str, job_key: str | None):
        """The run of this job that a checkpoint knew only by its key (its tracker.json lost)."""
        if not job_key:
            return None
        runs = self.client.search_runs([exp], f"tags.`{JOB_TAG}` = '{job_key}'", max_results=1)
        return runs[0] if runs else None

    def log_params(self, header: dict[str, Any]) -> None:
        from mlflow.entities import Param
        params = [Param(k[:250], v[:PARAM_CHARS]) for k, v in params_of(header).items()]
        for i in range(0, len(params), 100):  # MLflow's limit per batch
            self.client.log_batch(self.run_id, params=params[i:i + 100])

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric
        now = int(time.time() * 1000)
        batch = [Metric(k, v, now, step) for k, v in metrics.items()]
        for i in range(0, len(batch), 1000):
            self.client.log_batch(self.run_id, metrics=batch[i:i + 1000])

    def set_tags(self, tags: dict[str, str]) -> None:
        from mlflow.entities import RunTag
        self.client.log_batch(self.run_id, tags=[RunTag(k, v[:5000]) for k, v in tags.items()])

    def log_artifacts(self, paths: list[Path], folder: str = "checkpoints") -> None:
        for path in paths:
            self.client.log_artifact(self.run_id, str(path), artifact_path=folder or None)

    def finish(self, status: str) -> None:
        self.client.set_terminated(self.run_id, status=status)

    def sync_hint(self) -> str:
        return (f"python -m hvdtrain.trackers.replay {self.run_dir} --tracker mlflow (view a "
                f"local store with: mlflow ui --backend-store-uri {local_store(self.run_dir)})")
