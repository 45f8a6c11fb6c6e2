"""What a run shows and records: a Keras-style progress bar on the main process, and a JSONL log.

The JSONL log has one header line (config, world size, package versions), then one line per epoch
and, with ``--log-steps``, one per step. Each line goes to the file as it is written, so a crashed
run keeps everything up to the crash, and a line the disk had no room for is taken back whole, so
every line in the file parses.
"""

from __future__ import annotations

import fcntl
import json
import os
import platform
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, TextIO

from tqdm import tqdm


def package_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in ("hvdtrain", "torch", "horovod", "mpi4py", "numpy"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


class LogWriteError(RuntimeError):
    """The log could not be written (full disk, quota, lost mount); the message names the file,
    the OS error, and what the file holds now."""


def keep_aside(path: Path) -> Path:
    """Rename ``path`` to <stem>.<time it was last written><suffix> beside it (a log, a best
    model of an earlier attempt), never over another kept one; the new name."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(path.stat().st_mtime))
    target = path.with_name(f"{path.stem}.{stamp}{path.suffix}")
    n = 1
    while target.exists():  # never overwrite an earlier kept one either
        n += 1
        target = path.with_name(f"{path.stem}.{stamp}-{n}{path.suffix}")
    path.rename(target)
    return target


class JsonlLog:
    """Append-only JSON-lines log. Only the main process creates one.

    A new log never destroys an old one: a run that does not continue the folder's run (say its
    first attempt was killed before any checkpoint) moves the old log aside, to
    metrics.<time it was last written>.jsonl, and says so."""

    def __init__(self, path: str | Path, append: bool = False):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not append and self.path.exists():
            kept = keep_aside(self.path)
            print(f"hvdtrain: {self.path} held another run's log; it is kept as {kept}",
                  flush=True)
        # Unbuffered appends: a failed write is known at once, and where the last whole line ends.
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        self._end = os.fstat(self._fd).st_size

    def write(self, kind: str, **fields: Any) -> None:
        self._lock(fcntl.LOCK_EX)  # after another process's last line (write_last)
        try:
            self._append(kind, fields)
        finally:
            self._lock(fcntl.LOCK_UN)

    def write_last(self, kind: str, **fields: Any) -> None:
        """Write a line, and keep the file locked until this process ends: for a process
        that ends the job next (an async worker's failure, launch.py), whose stop line the
        lead, still at work, wrote an epoch line after."""
        self._lock(fcntl.LOCK_EX)
        self._append(kind, fields)

    def _lock(self, operation: int) -> None:
        try:
            fcntl.flock(self._fd, operation)
        except OSError:  # a file system without locks: the lines still go in whole
            pass

    def _append(self, kind: str, fields: dict[str, Any]) -> None:
        record = {"type": kind, "time": round(time.time(), 3), **fields}
        line = (json.dumps(record, default=str) + "\n").encode()
        self._end = os.fstat(self._fd).st_size  # another process may have appended a line
        try:
            rest = memoryview(line)
            while rest:  # a full disk takes part of a line, then refuses the rest
                rest = rest[os.write(self._fd, rest):]
        except OSError as e:
            raise LogWriteError(f"could not write to {self.path} ({e.strerror or e}); "
                                f"{self._cut_back()}") from None
        self._end += len(line)

    def _cut_back(self) -> str:
        """Take back the part of a line that did get written; says what the file holds now."""
        try:
            os.ftruncate(self._fd, self._end)
        except OSError as e:
            return f"its last line may be cut short (cutting it back failed: {e.strerror or e})"
        return "the log is cut back to its last whole line, so every line in it parses"

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def cut_partial_line(path: str | Path) -> bool:
    """Cut a log back to its last whole line, where a process killed as it wrote left part of
    one; the next line appended would otherwise join it and neither would parse. True if
    something was cut."""
    try:
        with open(path, "rb+") as f:
            size = f.seek(0, os.SEEK_END)
            if size == 0 or (f.seek(size - 1) is not None and f.read(1) == b"\n"):
                return False
            f.seek(0)
            f.truncate(f.read().rfind(b"\n") + 1)  # rare: read whole only after such a kill
            return True
    except FileNotFoundError:
        return False


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


MAX_DEPTH = 32  # hvdtrain's lines nest 4 deep; a deeper line is not one (json recurses on it)


def read_run_log(path: str | Path) -> tuple[list[dict[str, Any]], str]:
    """The lines of a run's log, for the commands that read one afterwards (replay, compare
    --from-run), and a note when its last line is cut short: a run killed while it wrote that
    line leaves it so, and the whole lines before it are the record. ValueError, naming the
    line, for a file that is not such a log (binary, a line that is not a JSON object)."""
    data = Path(path).read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not a text file (byte {e.start} is not UTF-8): give the "
                         f"metrics.jsonl that hvdtrain wrote") from None
    lines = text.split("\n")
    records: list[dict[str, Any]] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = _log_line(line)
        except ValueError as e:
            if number == len(lines) and isinstance(e, NotJson):  # no newline: the write was cut
                return records, (f"the last line of {path} (line {number}) is cut short, as a "
                                 f"run killed while writing it leaves it; using the "
                                 f"{len(records)} whole line(s) before it")
            raise ValueError(f"{path}, line {number}: {e}") from None
        records.append(record)
    return records, ""


def latest_attempt(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A run's log lines as its latest attempt continued it: a resume's header takes back the
    earlier attempts' epoch, eval and step lines past the step it resumed from (an epoch whose
    line was written before a kill that came ahead of its checkpoint is trained, and logged,
    again), which readers had counted twice; and the later attempts' clocks (wall_seconds,
    train_seconds), which start at 0 each, go on from the time the kept lines reached. Headers
    from before resumed_from_global_step was recorded take nothing back."""
    kept: list[dict[str, Any]] = []
    clocks = {"wall_seconds": 0.0, "train_seconds": 0.0}  # an attempt's start on the run's
    for record in records:
        at = record.get("resumed_from_global_step") if record.get("type") == "header" else None
        if isinstance(at, int):
            kept = [k for k in kept if not (k.get("type") in ("epoch", "eval", "step")
                                            and isinstance(k.get("step"), int) and k["step"] > at)]
            # each attempt's clocks start at 0: go on from the time the kept lines reached
            clocks = {name: max([float(k[name]) for k in kept if _number(k.get(name))] or [0.0])
                      for name in clocks}
        elif any(clocks.values()) and record.get("type") != "header":
            record = {**record, **{name: record[name] + start for name, start in clocks.items()
                                   if _number(record.get(name))}}
        kept.append(record)
    return kept


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class NotJson(ValueError):
    pass


def _log_line(line: str) -> dict[str, Any]:
    try:
        record = json.loads(line)
    except RecursionError:
        record = None  # deeper than Python's json can follow
    except ValueError as e:
        raise NotJson(f"not JSON ({e})") from None
    if record is None or _depth(record) > MAX_DEPTH:
        raise ValueError(f"nested more than {MAX_DEPTH} deep, not a line hvdtrain writes")
    if not isinstance(record, dict) or not isinstance(record.get("type"), str):
        raise ValueError("not a JSON object with a 'type', as every line hvdtrain writes is")
    return record


def _depth(value: Any) -> int:
    """How deep lists and objects nest in a parsed line, without recursion."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        value, depth = todo.pop()
        if isinstance(value, (dict, list)):
            deepest = max(deepest, depth)
            todo.extend((v, depth + 1) for v in (value.values() if isinstance(value, dict)
                                                 else value))
    return deepest


REFRESH_S = 0.25  # the terminal bar's figures: read and redrawn at most this often (tqdm's too)


class ProgressBar:
    """One Keras-style line per epoch::

        Epoch 3/20
        22/22 [==============================] - 0.4s 18ms/step - loss: 0.2154 - acc: 0.9403

    Shown only on the main process and only when enabled; otherwise every call is a no-op. On a
    terminal the line fills in as steps finish (tqdm). Under a launcher, output is a pipe that
    prefixes every write with the rank, so the finished line is printed once instead.
    """

    def __init__(self, enabled: bool, stream: TextIO | None = None):
        self.enabled = enabled
        self._stream = stream
        self.live = enabled and self.stream.isatty()
        self._bar: tqdm | None = None
        self._steps = 0
        self._started = 0.0
        self._shown = 0.0  # when the bar's figures were last read
        self._latest: tuple[float, Callable[[], dict[str, float]]] | None = None

    @property
    def stream(self) -> TextIO:
        """The one given, else sys.stderr as it is now: after a stop signal, one whose writes
        no longer fail once mpirun closed it (preemption.OutputThatMayBeGone)."""
        return self._stream if self._stream is not None else sys.stderr

    def start_epoch(self, epoch: int, epochs: int, steps: int) -> None:
        if not self.enabled:
            return
        print(f"Epoch {epoch}/{epochs}", file=self.stream, flush=True)
        self._steps, self._started, self._latest = steps, time.perf_counter(), None
        self._shown = 0.0
        if self.live:
            # tqdm fills the bar with the ascii string's characters from first (empty) to last
            # (full), so ".>=" gives Keras' look: '=' done, '>' at the head, '.' to go.
            self._bar = tqdm(total=steps, file=self.stream, ascii=".>=", mininterval=REFRESH_S,
                             dynamic_ncols=False, leave=True,
                             bar_format="{n_fmt}/{total_fmt} [{bar:30}] - {elapsed_s:.1f}s {desc}")

    def update(self, step_seconds: float, figures: Callable[[], dict[str, float]]) -> None:
        """figures: the epoch's running loss and metrics, e.g. {"loss": 0.21, "acc": 0.94},
        asked only when the line shows them (a terminal's bar at most every REFRESH_S, a pipe's
        line at the epoch's end): on a GPU, reading a metric's running sum waits for the GPU."""
        if not self.enabled:
            return
        self._latest = (step_seconds, figures)
        if self._bar is not None:
            now = time.perf_counter()
            if now - self._shown >= REFRESH_S:
                self._shown = now
                self._bar.set_description_str(self._describe(), refresh=False)
            self._bar.update(1)

    def _describe(self) -> str:
        if self._latest is None:
            return ""
        step_seconds, figures = self._latest
        return " - ".join([f"{step_seconds * 1000:.0f}ms/step",
                           *(f"{k}: {v:.4f}" for k, v in figures().items())])

    def end_epoch(self) -> None:
        if self._bar is not None:
            self._bar.set_description_str(self._describe(), refresh=False)
            self._bar.close()
            self._bar = None
        elif self.enabled:
            seconds = time.perf_counter() - self._started
            print(f"{self._steps}/{self._steps} [{'=' * 30}] - {seconds:.1f}s {self._describe()}",
                  file=self.stream, flush=True)
