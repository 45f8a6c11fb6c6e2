"""Where the run log's lines go: a list of sinks behind one small interface, built from the
config here and nowhere else. The run log and the loop name no sink, so a tracker (MLflow,
W&B) is a new file with a class that has ``record`` and ``close``, and a line in build_sinks.

    metrics.jsonl   always (JsonlSink below)
    TensorBoard     --tensorboard (tensorboard.py)
    MLflow, W&B     --tracker mlflow,wandb (hvdtrain/trackers/)

Every sink receives every line, the header first: ``record(kind, fields)``, with kind the line's
type (header, step, eval, epoch, stop, scheme, and a resume's missing) and fields what
metrics.jsonl holds after it.
Only the main process has sinks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Protocol

from ..checkpoint import CHECKPOINT_NAME
from ..config import RunConfig
from ..run_output import JsonlLog, LogWriteError
from .hooks import TrainingError

LOG_NAME = "metrics.jsonl"


class Sink(Protocol):
    def record(self, kind: str, fields: dict[str, Any]) -> None:
        """Take one line. A write that fails raises TrainingError saying what is intact."""

    def close(self) -> None:
        """Finish the files. Never raises: it runs while another error may be on its way out."""


# (run folder, whether the run continues the folder's log, the first global step it writes or
# None for unknown) -> the sinks that the run log writes to
SinkFactory = Callable[[Path, bool, "int | None"], list[Sink]]


class JsonlSink:
    """metrics.jsonl (metrics.JsonlLog): a full disk, a quota or a lost mount stops the run the
    way a failed checkpoint does, with a message that says what is intact."""

    def __init__(self, path: Path, append: bool):
        self.log = JsonlLog(path, append=append)

    def record(self, kind: str, fields: dict[str, Any]) -> None:
        try:
            self.log.write(kind, **fields)
        except LogWriteError as e:
            ckpt = self.log.path.parent / CHECKPOINT_NAME
            kept = (f"the last checkpoint {ckpt} is intact; free space and continue with "
                    f"--resume {ckpt.parent}" if ckpt.exists() else "no checkpoint was written yet")
            raise TrainingError(f"{e}; {kept}") from None

    def close(self) -> None:
        self.log.close()


def build_sinks(run: RunConfig, run_dir: Path, append: bool,
                first_step: int | None = None) -> list[Sink]:
    """The sinks that ``run`` asks for, in ``run_dir``. first_step: the first global step this
    run writes (a resumed run repeats those after its checkpoint), None where unknown."""
    sinks: list[Sink] = [JsonlSink(run_dir / LOG_NAME, append)]
    try:
        if run.tensorboard:
            from .tensorboard import TensorBoardSink  # imports torch's writer: only when asked for
            sinks.append(TensorBoardSink(run_dir, first_step))
        if run.tracker:
            from ..trackers.build import tracker_sinks  # imports a tracker: only when asked for
            sinks.extend(tracker_sinks(run, run_dir))
    except BaseException:
        close_all(sinks)
        raise
    return sinks


def default_sinks(run_dir: Path, append: bool, first_step: int | None = None) -> list[Sink]:
    """Those of a run with the default options."""
    return build_sinks(RunConfig(), run_dir, append, first_step)


def close_all(sinks: list[Sink]) -> None:
    for sink in sinks:
        sink.close()
