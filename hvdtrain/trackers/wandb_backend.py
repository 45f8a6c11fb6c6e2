"""Weights & Biases behind TrackerSink (sink.py): one W&B run per job, written to
``<run folder>/wandb/`` in offline mode unless the user has logged in (WANDB_API_KEY, or the
key that ``wandb login`` keeps in ~/.netrc) or set WANDB_MODE. An offline run is sent later
with ``wandb sync``. A resume continues the same run id (W&B's resume="allow").
"""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path
from typing import Any


def logged_in() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    try:
        return "api.wandb.ai" in netrc.read_text()
    except OSError:
        return False


# W&B's folders outside the run's: its core's debug log (~/.cache/wandb/logs, a copy of the
# run's logs/debug-core.log) and the artifacts' staging (~/.local/share/wandb). Its config
# folder is left alone: it holds the user's own settings.
OWN_DIRS = {"WANDB_CACHE_DIR": "cache", "WANDB_DATA_DIR": "data"}


@contextlib.contextmanager
def dirs_in(folder: Path):
    """W&B's cache and data folders under ``folder`` while W&B starts (its core reads them
    when it starts, once per process) and stages artifacts, unless the user named them; the
    environment is as before afterwards, for the next run of the same process."""
    ours = {name: str(folder / sub) for name, sub in OWN_DIRS.items() if not os.environ.get(name)}
    os.environ.update(ours)
    try:
        yield
    finally:
        for name in ours:
            os.environ.pop(name, None)


def wandb_mode() -> str:
    return os.environ.get("WANDB_MODE") or ("online" if logged_in() else "offline")


class WandbBackend:
    name = "wandb"

    def __init__(self, run_dir: Path, project: str):
        self.run_dir = run_dir
        self.project = project
        self.run = None
        self.mode = wandb_mode()

    def locate(self, previous: dict[str, Any]) -> dict[str, Any]:
        return {}  # the run's id is the job's key; the folder is the run folder

    def start(self, previous: dict[str, Any]) -> dict[str, Any]:
        import wandb
        run_id = previous.get("run_id") or previous.get("job_key", uuid.uuid4().hex)[:8]
        # console off: W&B would wrap stdout and stderr, which the launcher reads
        settings = wandb.Settings(console="off", x_disable_stats=True, disable_git=True,
                                  save_code=False, silent=True, x_save_requirements=False)
        with dirs_in(self.run_dir / "wandb"):
            self.run = wandb.init(project=self.project, dir=str(self.run_dir), mode=self.mode,
                                  id=run_id, resume="allow", name=self.run_dir.name,
                                  group=os.environ.get("WANDB_RUN_GROUP"), settings=settings)
        return {"run_id": run_id, "mode": self.mode}

    def log_params(self, header: dict[str, Any]) -> None:
        self.run.config.update(header, allow_val_change=True)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def set_tags(self, tags: dict[str, str]) -> None:
        self.run.summary.update(tags)

    def log_artifacts(self, paths: list[Path]) -> None:
        import wandb
        with dirs_in(self.run_dir / "wandb"):
            artifact = wandb.Artifact(f"checkpoints-{self.run.id}", type="model")
            for path in paths:
                artifact.add_file(str(path))
            self.run.log_artifact(artifact)

    def finish(self, status: str) -> None:
        with dirs_in(self.run_dir / "wandb"):  # the staged artifacts are uploaded now
            self.run.finish(exit_code=0 if status == "FINISHED" else 1)

    def sync_hint(self) -> str:
        offline = f"wandb sync {self.run_dir / 'wandb'}/offline-run-*" if self.mode == "offline" \
            else ""
        replay = f"python -m hvdtrain.trackers.replay {self.run_dir} --tracker wandb"
        return f"{offline} (or, for lines it missed, {replay})" if offline else replay
