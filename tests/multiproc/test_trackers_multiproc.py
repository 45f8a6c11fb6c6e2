"""--tracker under mpirun (issue 29): one tracker run per job, whatever the number of processes
and the mode, read back with the trackers' own libraries; a preempted job (SIGUSR1, exit 75)
and its --auto-resume are one tracker run with no step twice. And --tensorboard in async mode:
worker 0 alone writes the event files, and they end with the parameter server's staleness
histogram (on the same async job as MLflow's: one launch for both)."""

import importlib.util
import signal
import subprocess
import time

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from hvdtrain.run_output import read_jsonl
from launch import hvdtrain, launcher_env, mpirun, run
from tracker_readers import (mlflow_history, mlflow_runs, mlflow_store, wandb_history,
                             wandb_offline_runs, wandb_run_id)

HAVE_MLFLOW = importlib.util.find_spec("mlflow") is not None
pytestmark = pytest.mark.multiproc
# The TensorBoard test needs neither tracker: it runs without them.
needs_trackers = pytest.mark.skipif(
    not HAVE_MLFLOW or importlib.util.find_spec("wandb") is None,
    reason="needs the trackers: pip install 'hvdtrain[mlflow,wandb]'")
QUIET = ["--no-progress", "--seed", "1"]
# Nothing reaches the network: W&B offline, MLflow in the run folder.
OFFLINE = {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "MLFLOW_TRACKING_URI": "",
           "WANDB_API_KEY": ""}
PREEMPTED = 75


def epochs_match(run_dir):
    """The one MLflow run of the folder; its epoch metrics are the log's epoch lines."""
    store = mlflow_store(run_dir)
    [tracked] = mlflow_runs(store)
    epochs = [r for r in read_jsonl(run_dir / "metrics.jsonl") if r["type"] == "epoch"]
    assert epochs
    for key, name in [("train_loss", "train/loss"), ("test_acc", "test/acc"),
                      ("samples_per_sec", "epoch/samples_per_sec")]:
        assert mlflow_history(store, tracked.info.run_id, name) == [
            (r["step"], pytest.approx(r[key], rel=1e-6)) for r in epochs]
    return tracked, epochs


@pytest.fixture(scope="module")
def async_job(tmp_path_factory):
    """One async job (2 workers and a server, 2 epochs) with --tensorboard and, where MLflow is
    installed, --tracker mlflow: the run folder both async tests read."""
    run_dir = tmp_path_factory.mktemp("async")
    tracker = ["--tracker", "mlflow"] if HAVE_MLFLOW else []
    run(mpirun(3, *hvdtrain("train", *QUIET, "--mode", "async", "--epochs", "2",
                            "--tensorboard", *tracker, "--run-dir", str(run_dir))), env=OFFLINE)
    return run_dir


@needs_trackers
def test_async_job_is_one_mlflow_run_with_the_staleness(async_job):
    tracked, _ = epochs_match(async_job)
    [scheme] = [r for r in read_jsonl(async_job / "metrics.jsonl") if r["type"] == "scheme"]
    assert tracked.data.metrics["scheme/pushes_applied"] == scheme["pushes_applied"]
    assert {k: v for k, v in tracked.data.metrics.items()
            if k.startswith("scheme/staleness_histogram/")} == {
        f"scheme/staleness_histogram/{k}": v for k, v in scheme["staleness_histogram"].items()}


def test_async_run_writes_the_staleness_histogram_and_the_epochs(async_job):
    assert len(list(async_job.glob("events.out.tfevents.*"))) == 1  # only worker 0 writes
    log = read_jsonl(async_job / "metrics.jsonl")
    epochs = [r for r in log if r["type"] == "epoch"]
    [scheme] = [r for r in log if r["type"] == "scheme"]
    acc = EventAccumulator(str(async_job))
    acc.Reload()
    test_acc = {e.step: e.value for e in acc.Scalars("test/acc")}
    assert test_acc == {r["step"]: pytest.approx(r["test_acc"], rel=1e-6) for r in epochs}
    [event] = acc.Histograms("scheme/staleness_histogram")
    histogram = event.histogram_value
    counts = {int(k): v for k, v in scheme["staleness_histogram"].items()}
    assert event.step == epochs[-1]["step"]
    assert histogram.num == sum(counts.values()) == scheme["pushes_applied"]
    assert (histogram.min, histogram.max) == (min(counts), max(counts))
    assert [c for c in histogram.bucket if c] == [counts[k] for k in sorted(counts)]


@needs_trackers
def test_preempted_and_resumed_sync_job_is_one_run_of_each_tracker_without_repeated_steps(
        tmp_path):
    command = mpirun(2, *hvdtrain("train", *QUIET, "--epochs", "3", "--batch-size", "32",
                                  "--log-steps", "--straggler", "20ms",
                                  "--tracker", "mlflow,wandb",
                                  "--run-dir", str(tmp_path), "--auto-resume"))
    job = subprocess.Popen(command, env={**launcher_env(), **OFFLINE}, stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        log = tmp_path / "metrics.jsonl"
        while not log.exists() or sum(r["type"] == "step" for r in read_jsonl(log)) < 30:
            assert job.poll() is None, f"the job ended before the signal: {job.communicate()}"
            assert time.monotonic() < deadline, "no 30 step lines after 120 s"
            time.sleep(0.1)
        job.send_signal(signal.SIGUSR1)  # Slurm's --signal=USR1: mpirun passes it on at once
        out, err = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    assert job.returncode == PREEMPTED, out + err
    resumed = run(command, env=OFFLINE)
    # shown if what follows fails: a tracker that fails warns there and training goes on
    print(f"first attempt's stderr:\n{err[-3000:]}\nresumed attempt's stderr:\n"
          f"{resumed.stderr[-3000:]}")
    tracked, epochs = epochs_match(tmp_path)
    assert [e["epoch"] for e in epochs] == [1, 2, 3]
    steps = [s for s, _ in mlflow_history(mlflow_store(tmp_path), tracked.info.run_id,
                                          "step/loss")]
    assert steps == list(range(1, epochs[-1]["step"] + 1))  # each step once
    assert tracked.info.status == "FINISHED"
    assert tracked.data.params["world_size"] == "2"
    assert "step_times/compute_p50/worker1" in tracked.data.metrics
    # W&B offline: one folder per attempt, the same run id (wandb sync joins them)
    attempts = wandb_offline_runs(tmp_path)
    assert len(attempts) == 2 and len({wandb_run_id(path) for path in attempts}) == 1
    rows = [row for path in attempts for row in wandb_history(path)]
    assert sorted(r["_step"] for r in rows if "step/loss" in r) == steps
    assert [(r["_step"], r["train/loss"]) for r in rows if "train/loss" in r] == [
        (e["step"], pytest.approx(e["train_loss"], rel=1e-6)) for e in epochs]
