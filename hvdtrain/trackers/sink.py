"""TrackerSink: a sink of the run log (loop/sinks.py) that sends its lines to one experiment
tracker through a backend (mlflow_backend.py, wandb_backend.py).

The tracker is slow to start (MLflow's first SQLite store creates its tables: seconds) and may
not answer at all (a server that is down), so its calls run in a thread of their own, behind a
queue: the training loop only puts lines on the queue. A tracker that fails never ends the
training: the first failure prints one warning, which says how to send the log later, and the
sink takes no more lines. metrics.jsonl stays the record.
"""

from __future__ import annotations

import os
import queue
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Protocol

from .metrics import line_step, metrics_of, tags_of
from .state import resume_point, write_state

STEP_SAVE_S = 1.0  # the most a resume sends of step lines twice

# How long the end of a run waits for the tracker to take its last lines and artifacts
# (seconds): a tracker that hangs must not hold the job past its end for long.
TIMEOUT_ENV = "HVDTRAIN_TRACKER_TIMEOUT"
DEFAULT_TIMEOUT = 120.0


class Backend(Protocol):
    name: str

    def locate(self, previous: dict[str, Any]) -> dict[str, Any]:
        """Where the run will live, known at once without opening it (MLflow's store), for
        tracker.json and the checkpoints written before start() returns."""

    def start(self, previous: dict[str, Any]) -> dict[str, Any]:
        """Open the tracker run (``previous``'s, when it names one by its id or by the job_key
        that the run was tagged with); return what tracker.json keeps of it (its id, where it
        lives)."""

    def log_params(self, header: dict[str, Any]) -> None: ...

    def log_metrics(self, metrics: dict[str, float], step: int) -> None: ...

    def set_tags(self, tags: dict[str, str]) -> None: ...

    def log_artifacts(self, paths: list[Path]) -> None: ...

    def finish(self, status: str) -> None:
        """status: FINISHED; KILLED after a preemption (the job goes on in a resume); FAILED when
        the run ends in an error (a crash, a failed write)."""

    def sync_hint(self) -> str:
        """How to send this run to the tracker later."""


class TrackerSink:
    def __init__(self, backend: Backend, run_dir: Path, previous: dict[str, Any],
                 artifacts: list[Path] = (), timeout: float | None = None):
        self.backend = backend
        self.run_dir = run_dir
        self.entry = dict(previous)
        # Known before the tracker opens its run (seconds, in the thread): the first checkpoints
        # carry it, and a resume from one of them finds the run by it (CheckpointRecord).
        self.entry.setdefault("job_key", uuid.uuid4().hex)
        self.entry = {**backend.locate(self.entry), **self.entry}  # what start() compares
        self._save()
        # What an earlier attempt logged, which a resume trains again: every step before
        # last_step, and the metrics named in last_names at last_step itself.
        self.resume_after, self.resume_names = resume_point(previous)
        self.artifacts = list(artifacts)
        self.timeout = timeout if timeout is not None else float(
            os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT))
        self.failed = False
        self.status = "FINISHED"
        self.stopped_here = False  # a stop line in this attempt (entry["stopped"]: any attempt's)
        self.step = 0  # the step of a line that has none (the scheme's summary)
        self.saved_at = 0.0  # time.monotonic() of the last tracker.json written
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._work, name=f"hvdtrain-{backend.name}",
                                       daemon=True)  # a hung tracker must not hold the exit
        self.thread.start()

    # --- the run log's side ---------------------------------------------------------------------
    def record(self, kind: str, fields: dict[str, Any]) -> None:
        if not self.failed:
            self.queue.put((kind, fields))

    def close(self) -> None:
        """Waits for the tracker to take the lines, at most ``timeout`` seconds. Never raises."""
        if not self.thread.is_alive():
            return
        if sys.exc_info()[0] is not None:  # closed on the way out of an error: the run failed
            self.status = "FAILED"
        self.queue.put(None)
        self.thread.join(self.timeout)
        if self.thread.is_alive() and not self.failed:
            self._warn(f"it did not finish within {self.timeout:g} s "
                       f"(${TIMEOUT_ENV} sets the wait)")

    # --- the thread -----------------------------------------------------------------------------
    def _work(self) -> None:
        try:
            self.entry.update(self.backend.start(self.entry))
            # start() said what the run has: the previous attempt's run, one found by its job
            # key, or a new one (a store that changed), which has nothing yet
            self.resume_after, self.resume_names = resume_point(self.entry)
            self._save()
            while (item := self.queue.get()) is not None:
                self._send(*item)
            self._finish()
        except Exception as e:  # the tracker's own errors are many and undocumented
            self._warn(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300])

    def _send(self, kind: str, fields: dict[str, Any]) -> None:
        if kind == "header":
            if not self.entry.get("params"):  # once per tracker run, not again on a resume
                self.backend.log_params(fields)
                self.entry["params"] = True
            return
        step = line_step(fields)
        self.step = self.step if step is None else step
        metrics = self._not_logged(metrics_of(kind, fields))
        if metrics:
            self.backend.log_metrics(metrics, self.step)
            self._logged(metrics)
        tags = tags_of(kind, fields)
        if tags:
            self.backend.set_tags(tags)
        if kind == "stop":
            reason = str(fields.get("reason", ""))
            self.entry["stopped"], self.stopped_here = reason, True
            if reason.startswith("preempted"):
                self.status = "KILLED"
        # Step lines are many: their last step is kept once a second, so that a kill and
        # resume sends at most a second of steps twice (it sent all since the last epoch)
        if kind != "step" or time.monotonic() - self.saved_at >= STEP_SAVE_S:
            self._save()

    def _not_logged(self, metrics: dict[str, float]) -> dict[str, float]:
        """Without what an earlier attempt logged: a line at the step where that attempt
        stopped may be new there (the epoch line that ends at a stop's step, after the stop
        line and the scheme's summary went out at that step)."""
        if self.step < self.resume_after:
            return {}
        if self.step == self.resume_after:
            if self.resume_names is None:  # a tracker.json that kept no names: all of them
                return {}
            return {k: v for k, v in metrics.items() if k not in self.resume_names}
        return metrics

    def _logged(self, metrics: dict[str, float]) -> None:
        last = int(self.entry.get("last_step", -1))
        if self.step > last:
            self.entry["last_step"] = self.step
            self.entry["last_names"] = sorted(metrics)
        elif self.step == last:
            self.entry["last_names"] = sorted({*self.entry.get("last_names", ()), *metrics})

    def _finish(self) -> None:
        present = [p for p in self.artifacts if p.is_file()]
        if present:
            self.backend.log_artifacts(present)
        if self.status == "FINISHED" and not self.stopped_here and self.entry.get("stopped"):
            # an earlier attempt's stop tag would call this finished run preempted
            self.backend.set_tags({"stop/reason": "finished, resumed after: "
                                                  f"{self.entry.pop('stopped')}"})
        self.backend.finish(self.status)
        self._save()

    def _save(self) -> None:
        write_state(self.run_dir, self.backend.name, self.entry)
        self.saved_at = time.monotonic()

    def _warn(self, reason: str) -> None:
        if self.failed:
            return
        self.failed = True
        try:
            hint = self.backend.sync_hint()
        except Exception:
            hint = (f"python -m hvdtrain.trackers.replay {self.run_dir} "
                    f"--tracker {self.backend.name}")
        print(f"hvdtrain: warning: {self.backend.name} tracking failed ({reason}); training "
              f"goes on, {self.run_dir / 'metrics.jsonl'} is the record; sync later with {hint}",
              file=sys.stderr, flush=True)
