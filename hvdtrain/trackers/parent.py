"""The parent run of ``hvdtrain compare --tracker mlflow``: one MLflow run for the comparison,
with its options as parameters and the report, summary and plots as artifacts, and each run of
the plan as its child. The children find it through the environment that compare's runner
passes on: MLFLOW_TRACKING_URI (the store, OUT/mlflow.db unless the user set one) and
MLFLOW_PARENT_RUN_ID (mlflow_backend.py tags each child with mlflow.parentRunId).

Like the sinks, a tracker that fails never ends the comparison: one warning, then nothing.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import Any

from .mlflow_backend import PARENT_ENV, MlflowBackend
from .state import previous_state, write_state


class ParentRun:
    def __init__(self, out: Path, options: dict[str, Any]):
        self.out = out
        self.backend = MlflowBackend(out, "hvdtrain")
        self.failed = False
        entry = self._call(self.backend.start, previous_state(out, None, "mlflow"))
        if entry is None:
            return
        write_state(out, "mlflow", entry)
        os.environ.setdefault("MLFLOW_TRACKING_URI", entry["tracking_uri"])
        os.environ[PARENT_ENV] = entry["run_id"]
        self._call(self.backend.log_params, {"compare": options})

    def finish(self, files: list[Path], failed_runs: int) -> None:
        self._call(self.backend.log_metrics, {"compare/failed_runs": float(failed_runs)}, 0)
        self._call(self.backend.log_artifacts, [f for f in files if f.is_file()], "")
        self._call(self.backend.finish, "FINISHED" if not failed_runs else "FAILED")

    def _call(self, method, *args):
        if self.failed:
            return None
        try:
            return method(*args)
        except Exception as e:  # the tracker's errors are many and undocumented
            self.failed = True
            os.environ.pop(PARENT_ENV, None)
            print(f"hvdtrain compare: warning: mlflow tracking failed ({type(e).__name__}: "
                  f"{str(e)[:300]}); the comparison goes on, its report and runs are the "
                  f"record", file=sys.stderr, flush=True)
            return None


def start_parent(out: Path, cfg) -> ParentRun:
    out.mkdir(parents=True, exist_ok=True)
    return ParentRun(out, dataclasses.asdict(cfg))
