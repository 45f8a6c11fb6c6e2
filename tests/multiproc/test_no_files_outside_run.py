"""A run writes into its run folder only (issue 41): not into the working folder (MLflow 3's
default store is ./mlflow.db, which is how the repository once got one committed) and not into
HOME (W&B's core debug log in ~/.cache/wandb/logs, MLflow's ~/.config/mlflow/telemetry.json).
The one file a run may add to HOME is the documented digits cache ($HVDTRAIN_CACHE, by default
~/.cache/hvdtrain: hvdtrain/data/digits_cache.py)."""

import importlib.util
from pathlib import Path

import pytest

from launch import hvdtrain, mpirun, run

pytestmark = [pytest.mark.multiproc, pytest.mark.skipif(
    importlib.util.find_spec("mlflow") is None or importlib.util.find_spec("wandb") is None,
    reason="needs the trackers: pip install 'hvdtrain[mlflow,wandb]'")]
SHORT = ["--epochs", "1", "--max-steps-per-epoch", "5", "--no-progress", "--seed", "1"]


def listing(*folders: Path) -> set[str]:
    return {str(p) for folder in folders for p in folder.rglob("*")}


def test_sync_async_and_tracker_runs_write_nothing_outside_their_run_folders(tmp_path):
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir(), work.mkdir()
    (work / "notes.txt").write_text("the user's own file\n")
    # HOME and the places derived from it are the test's; nothing reaches the network.
    env = {"HOME": str(home), "XDG_CACHE_HOME": "", "XDG_CONFIG_HOME": "", "XDG_DATA_HOME": "",
           "HVDTRAIN_CACHE": "", "WANDB_MODE": "offline", "WANDB_SILENT": "true",
           "WANDB_API_KEY": "", "MLFLOW_TRACKING_URI": ""}
    before = listing(home, work)
    # The tracker job runs every writer there is (both trackers, their artifacts, TensorBoard)
    # on top of what a plain sync job writes, which is therefore not launched on its own.
    jobs = {"async": mpirun(3, *hvdtrain("train", "--mode", "async", *SHORT)),
            "tracker": mpirun(2, *hvdtrain("train", *SHORT, "--tracker", "mlflow,wandb",
                                           "--tracker-artifacts", "--tensorboard"))}
    for name, command in jobs.items():
        run([*command, "--run-dir", str(tmp_path / name)], cwd=work, env=env)
    assert (tmp_path / "tracker" / "mlflow.db").is_file()  # the trackers did write: in there
    assert list((tmp_path / "tracker" / "wandb").glob("offline-run-*"))
    assert list((tmp_path / "tracker").glob("events.out.tfevents.*"))
    cache = home / ".cache" / "hvdtrain"
    allowed = {str(home / ".cache"), str(cache)} | {str(p) for p in cache.glob("digits-*.npz")}
    assert listing(home, work) - before - allowed == set()
