"""--tracker mlflow / wandb (hvdtrain/trackers/): the run log's lines as metric names, one
tracker run per folder that a resume continues without repeating steps, and a tracker that
fails or hangs never ends the training. Single process, through test_trainer's scheme."""

from __future__ import annotations

import importlib.util
import threading
import time

import pytest

from hvdtrain.config import ConfigError
from hvdtrain.run_output import read_jsonl
from hvdtrain.trackers import build, names
from hvdtrain.trackers.metrics import line_step, metrics_of, params_of, tags_of
from hvdtrain.trackers.sink import TrackerSink
from hvdtrain.trackers.state import CheckpointRecord, read_state, write_state
from test_trainer import CrashAt, make_trainer
from tracker_readers import (mlflow_history, mlflow_runs, mlflow_store, wandb_history,
                             wandb_offline_runs, wandb_run_id)

needs_mlflow = pytest.mark.skipif(importlib.util.find_spec("mlflow") is None,
                                  reason="mlflow is not installed: pip install 'hvdtrain[mlflow]'")
needs_wandb = pytest.mark.skipif(importlib.util.find_spec("wandb") is None,
                                 reason="wandb is not installed: pip install 'hvdtrain[wandb]'")


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    """Nothing reaches the network: W&B offline and silent, MLflow in the run folder."""
    for name in ("MLFLOW_TRACKING_URI", "WANDB_API_KEY", "MLFLOW_PARENT_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")


def test_lines_become_metric_names_nested_figures_flattened_and_words_skipped():
    epoch = {"epoch": 2, "step": 24, "lr": 0.1, "workers": 2, "samples": 400, "train_loss": 0.5,
             "test_acc": 0.9, "test_mae": None, "wall_seconds": 3.0, "flag": True,
             "step_times": {"compute_p50": [0.01, 0.03], "steps": [12, 12]},
             "noted": {"slow": {"rank": 1}}, "name": "x"}
    assert metrics_of("epoch", epoch) == {
        "epoch/lr": 0.1, "train/loss": 0.5, "test/acc": 0.9,
        "step_times/compute_p50/worker0": 0.01, "step_times/compute_p50/worker1": 0.03,
        "epoch/noted/slow/rank": 1.0}
    scheme = {"pushes_applied": 30, "staleness_histogram": {"0": 20, "2": 10}}
    assert metrics_of("scheme", scheme) == {"scheme/pushes_applied": 30.0,
                                            "scheme/staleness_histogram/0": 20.0,
                                            "scheme/staleness_histogram/2": 10.0}
    assert metrics_of("header", {"num_workers": 2}) == {}
    stop = {"epoch": 2, "step": 3, "global_step": 27, "reason": "preempted: SIGUSR1"}
    assert line_step(stop) == 27 and line_step({"pushes_applied": 1}) is None
    assert tags_of("stop", stop) == {"stop/reason": "preempted: SIGUSR1"}
    assert tags_of("epoch", epoch) == {}
    missing = {"epochs": [12, 13], "reason": "killed before their lines"}  # loop/run_log.py
    assert metrics_of("missing", missing) == {}
    assert tags_of("missing", missing) == {"missing/epochs": "12,13",
                                           "missing/reason": "killed before their lines"}
    assert params_of({"config": {"run": {"mode": "sync", "epochs": 2}}, "world_size": 2}) == {
        "config/run/mode": "sync", "config/run/epochs": "2", "world_size": "2"}


class FakeBackend:
    name = "fake"

    def __init__(self, fail_at: str = "", hang: threading.Event | None = None):
        self.calls: list[tuple] = []
        self.fail_at = fail_at
        self.hang = hang

    def _call(self, what, *args):
        if self.hang is not None:
            self.hang.wait(30)
        if what == self.fail_at:
            raise OSError(28, "No space left on device")
        self.calls.append((what, *args))

    def start(self, previous):
        self._call("start")
        return {"run_id": previous.get("run_id", "r1")}

    def locate(self, previous): return {}
    def log_params(self, header): self._call("params", header)
    def log_metrics(self, metrics, step): self._call("metrics", step, metrics)
    def set_tags(self, tags): self._call("tags", tags)
    def log_artifacts(self, paths): self._call("artifacts", paths)
    def finish(self, status): self._call("finish", status)
    def sync_hint(self): return "fake sync"


def feed(sink, steps):
    sink.record("header", {"config": {"a": 1}})
    for step in steps:
        sink.record("step", {"epoch": 1, "step": step, "loss": 1.0 / step})
    sink.record("stop", {"epoch": 1, "step": 2, "global_step": steps[-1],
                         "reason": "preempted: SIGUSR1"})
    sink.close()


def test_a_resume_continues_the_tracker_run_and_skips_the_steps_it_logged(tmp_path):
    first = FakeBackend()
    feed(TrackerSink(first, tmp_path, {}), [1, 2, 3, 4])
    entry = read_state(tmp_path)["fake"]
    assert len(entry.pop("job_key")) == 32  # known before the backend opened its run
    assert entry == {"run_id": "r1", "last_step": 4, "last_names": ["step/loss"], "params": True,
                     "stopped": "preempted: SIGUSR1"}
    assert first.calls[-1] == ("finish", "KILLED")
    again = FakeBackend()  # resumed from a checkpoint at step 2: steps 3 and 4 come again
    feed(TrackerSink(again, tmp_path, entry), [3, 4, 5, 6])
    assert [c[1] for c in again.calls if c[0] == "metrics"] == [5, 6]
    assert not [c for c in again.calls if c[0] == "params"]  # parameters went in once
    assert read_state(tmp_path)["fake"]["last_step"] == 6


def test_a_killed_jobs_step_lines_are_kept_as_sent_once_a_second(tmp_path, monkeypatch):
    """tracker.json kept only the epochs' last step: a job killed mid-epoch and resumed from
    an earlier checkpoint sent every step since that epoch twice (MLflow: two points at steps
    101..104). Now its step lines' last step is saved at most a second late."""
    from hvdtrain.trackers import sink as sink_module

    monkeypatch.setattr(sink_module, "STEP_SAVE_S", 0.0)  # every step line, for the test
    sink = TrackerSink(FakeBackend(), tmp_path, {})
    for step in (1, 2, 3, 4):  # killed here: no stop line, no close
        sink.record("step", {"epoch": 1, "step": step, "loss": 1.0 / step})
    deadline = time.monotonic() + 10
    while read_state(tmp_path).get("fake", {}).get("last_step") != 4:
        assert time.monotonic() < deadline, read_state(tmp_path)
        time.sleep(0.01)
    again = FakeBackend()  # resumed from a checkpoint at step 2: steps 3 and 4 come again
    feed(TrackerSink(again, tmp_path, read_state(tmp_path)["fake"]), [3, 4, 5])
    assert [c[1] for c in again.calls if c[0] == "metrics"] == [5]
    sink.close()


def test_a_resumed_run_that_finishes_replaces_the_stop_tag_of_the_attempt_before(tmp_path):
    """A tracker run left tagged stop/reason = preempted after it finished looked preempted."""
    feed(TrackerSink(FakeBackend(), tmp_path, {}), [1, 2])
    again = FakeBackend()
    sink = TrackerSink(again, tmp_path, read_state(tmp_path)["fake"])
    sink.record("step", {"epoch": 1, "step": 3, "loss": 0.3})
    sink.close()
    assert again.calls[-2:] == [
        ("tags", {"stop/reason": "finished, resumed after: preempted: SIGUSR1"}),
        ("finish", "FINISHED")]
    assert "stopped" not in read_state(tmp_path)["fake"]
    third = FakeBackend()  # nothing to replace any more
    sink = TrackerSink(third, tmp_path, read_state(tmp_path)["fake"])
    sink.close()
    assert not [c for c in third.calls if c[0] == "tags"]


def test_a_resume_logs_the_epoch_line_that_ends_at_the_stops_step(tmp_path):
    # An async job stopped where epoch 3 ends (global step 30) before that epoch's line: the
    # stop line and the scheme's summary go out at step 30; the resume writes epoch 3's line.
    first = FakeBackend()
    sink = TrackerSink(first, tmp_path, {})
    sink.record("header", {"config": {"a": 1}})
    for epoch in (1, 2):
        sink.record("epoch", {"epoch": epoch, "step": 10 * epoch, "train_loss": 1.0 / epoch})
    sink.record("stop", {"epoch": 3, "step": 0, "global_step": 30, "reason": "preempted: TERM"})
    sink.record("scheme", {"pushes_applied": 30})
    sink.close()
    entry = read_state(tmp_path)["fake"]
    assert (entry["last_step"], entry["last_names"]) == (30, ["scheme/pushes_applied"])
    again = FakeBackend()
    sink = TrackerSink(again, tmp_path, entry)
    sink.record("header", {"config": {"a": 1}})
    for epoch in (3, 4):
        sink.record("epoch", {"epoch": epoch, "step": 10 * epoch, "train_loss": 1.0 / epoch})
    sink.record("scheme", {"pushes_applied": 40})
    sink.close()
    sent = [(c[1], sorted(c[2])) for c in first.calls + again.calls if c[0] == "metrics"]
    assert sent == [(10, ["train/loss"]), (20, ["train/loss"]), (30, ["scheme/pushes_applied"]),
                    (30, ["train/loss"]), (40, ["train/loss"]), (40, ["scheme/pushes_applied"])]
    assert read_state(tmp_path)["fake"]["last_names"] == ["scheme/pushes_applied", "train/loss"]
    # a third attempt from a checkpoint at step 30 sends nothing twice
    third = FakeBackend()
    sink = TrackerSink(third, tmp_path, read_state(tmp_path)["fake"])
    sink.record("epoch", {"epoch": 3, "step": 30, "train_loss": 1 / 3})
    sink.record("epoch", {"epoch": 4, "step": 40, "train_loss": 0.25})
    sink.close()
    assert [c for c in third.calls if c[0] == "metrics"] == []


def test_a_tracker_json_of_before_that_kept_no_names_skips_its_whole_last_step(tmp_path):
    backend = FakeBackend()
    feed(TrackerSink(backend, tmp_path, {"run_id": "r1", "last_step": 4, "params": True}),
         [4, 5])
    assert [c[1] for c in backend.calls if c[0] == "metrics"] == [5]


def test_a_failing_tracker_warns_once_and_goes_quiet(tmp_path, capsys):
    backend = FakeBackend(fail_at="metrics")
    sink = TrackerSink(backend, tmp_path, {})
    feed(sink, [1, 2, 3])
    err = capsys.readouterr().err
    assert err.count("warning") == 1, err
    assert ("hvdtrain: warning: fake tracking failed (OSError: [Errno 28] No space left on "
            "device); training goes on") in err and "sync later with fake sync" in err
    assert sink.failed and [c[0] for c in backend.calls] == ["start", "params"]


def test_a_hanging_tracker_holds_the_end_of_the_run_for_its_timeout_only(tmp_path, capsys):
    release = threading.Event()
    sink = TrackerSink(FakeBackend(hang=release), tmp_path, {}, timeout=0.5)
    started = time.monotonic()
    feed(sink, [1, 2])
    assert time.monotonic() - started < 5
    release.set()
    assert "did not finish within 0.5 s ($HVDTRAIN_TRACKER_TIMEOUT" in capsys.readouterr().err


def test_bad_or_missing_trackers_are_refused_with_what_to_do(monkeypatch):
    with pytest.raises(ConfigError, match="--tracker: unknown tracker 'neptune'; use mlflow, "
                                          "wandb"):
        build.tracker_names("mlflow,neptune")
    assert build.tracker_names("wandb, mlflow,wandb") == ["wandb", "mlflow"]
    monkeypatch.setattr(names.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match=r"--tracker wandb needs the wandb package, which is not "
                                          r"installed: pip install 'hvdtrain\[wandb\]'"):
        make_trainer_config(tracker="wandb")


def test_a_tracker_project_the_tracker_would_refuse_is_refused_before_training():
    with pytest.raises(ConfigError, match="--tracker-project: an empty name; pass the MLflow "
                                          "experiment or W&B project"):
        make_trainer_config(tracker="mlflow", tracker_project=" ")
    with pytest.raises(ConfigError, match="W&B takes project names of at most 128 characters "
                                          r".*; 'a:b' has :"):
        make_trainer_config(tracker="mlflow,wandb", tracker_project="a:b")
    make_trainer_config(tracker="mlflow", tracker_project="a:b")  # an MLflow experiment may
    with pytest.raises(ConfigError, match="--tracker-project: .*add --tracker mlflow"):
        make_trainer_config(tracker_project="")  # without --tracker it would name nothing


@pytest.mark.parametrize("log,args,words", [
    (b"\x89PNG\r\n\x1a\n\x00\x00", [], "metrics.jsonl is not a text file (byte 0 is not UTF-8)"),
    (b'{"type": "header"}\n{"type": "epoch", "x": ' + b"[" * 100000 + b"]" * 100000 + b"}\n",
     [], "metrics.jsonl, line 2: nested more than 32 deep, not a line hvdtrain writes"),
    (b'{"type": "header"}\n', ["--tracker", "bogus"], "--tracker: unknown tracker 'bogus'"),
    (b'{"type": "header"}\n', ["--tracker-project", ""], "--tracker-project: an empty name"),
])
def test_replay_of_a_log_it_cannot_send_is_one_line_of_error(tmp_path, capsys, log, args, words):
    from hvdtrain.trackers import replay
    (tmp_path / "metrics.jsonl").write_bytes(log)
    assert replay.main([str(tmp_path), "--tracker", "mlflow", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m hvdtrain.trackers.replay: error: ") and words in err, err
    assert len(err.splitlines()) == 1 and not (tmp_path / "tracker.json").exists()


def test_replay_of_a_killed_runs_log_sends_its_whole_lines_and_names_the_cut_one(
        tmp_path, capsys, monkeypatch):
    from hvdtrain.trackers import replay
    backend = FakeBackend()
    monkeypatch.setattr(replay, "make_backend", lambda *args: backend)
    (tmp_path / "metrics.jsonl").write_text(
        '{"type": "header", "config": {}}\n{"type": "epoch", "step": 5, "train_loss": 0.5}\n'
        '{"type": "epoch", "step": 10, "train_lo')
    assert replay.main([str(tmp_path), "--tracker", "mlflow"]) == 0
    err = capsys.readouterr().err
    assert err == (f"hvdtrain: warning: the last line of {tmp_path / 'metrics.jsonl'} (line 3) "
                   "is cut short, as a run killed while writing it leaves it; using the 2 whole "
                   "line(s) before it\n")
    assert [c for c in backend.calls if c[0] == "metrics"] == [("metrics", 5, {"train/loss": 0.5})]


def make_trainer_config(**options):
    from hvdtrain.config import Config
    return Config.from_overrides(options).validate()


@needs_mlflow
def test_mlflow_holds_one_run_whose_metrics_match_the_log_and_a_resume_continues_it(tmp_path):
    # 12 steps an epoch, a checkpoint every 5 steps: killed in step 17, resumed from step 15.
    with pytest.raises(KeyboardInterrupt):
        make_trainer(tmp_path, hooks=[CrashAt(17)], checkpoint_steps=5, log_steps=True,
                     tracker="mlflow").fit()
    store = mlflow_store(tmp_path)
    [run] = mlflow_runs(store)
    assert run.info.status == "FAILED"  # the crash
    make_trainer(tmp_path, checkpoint_steps=5, log_steps=True, tracker="mlflow",
                 auto_resume=True, tracker_artifacts=True).fit()
    [run] = mlflow_runs(store)
    assert run.info.status == "FINISHED"
    assert run.data.params["config/run/tracker"] == "mlflow"
    assert run.data.params["num_workers"] == "1" and "versions/torch" in run.data.params
    log = read_jsonl(tmp_path / "metrics.jsonl")
    epochs = [r for r in log if r["type"] == "epoch"]
    for key, name in [("train_loss", "train/loss"), ("test_acc", "test/acc"), ("lr", "epoch/lr")]:
        assert mlflow_history(store, run.info.run_id, name) == [
            (r["step"], pytest.approx(r[key], rel=1e-6)) for r in epochs]
    steps = [s for s, _ in mlflow_history(store, run.info.run_id, "step/loss")]
    assert steps == list(range(1, 25))  # each step once: 16 from the first attempt only
    assert {a.path for a in mlflow_client(store).list_artifacts(run.info.run_id, "checkpoints")} \
        == {"checkpoints/checkpoint.pt"}


@needs_mlflow
def test_a_folder_that_lost_tracker_json_continues_the_run_its_checkpoint_names(tmp_path):
    import torch
    # The steps end before MLflow has made its store (seconds): the checkpoints know the run
    # only by the job's key, which it was tagged with.
    with pytest.raises(KeyboardInterrupt):
        make_trainer(tmp_path, hooks=[CrashAt(17)], checkpoint_steps=5, tracker="mlflow",
                     log_steps=True).fit()
    [run] = mlflow_runs(mlflow_store(tmp_path))
    saved = torch.load(tmp_path / "checkpoint.pt", weights_only=False)["trackers"]["mlflow"]
    assert run.data.tags["hvdtrain.job_key"] == saved["job_key"]
    (tmp_path / "tracker.json").unlink()
    make_trainer(tmp_path, checkpoint_steps=5, tracker="mlflow", auto_resume=True,
                 log_steps=True).fit()
    [run] = mlflow_runs(mlflow_store(tmp_path))  # still one run, now finished
    assert run.info.status == "FINISHED"
    steps = [s for s, _ in mlflow_history(mlflow_store(tmp_path), run.info.run_id, "step/loss")]
    assert steps == list(range(1, 25))  # the run said what it had: no step twice
    assert read_state(tmp_path)["mlflow"]["run_id"] == run.info.run_id


def test_the_checkpoints_tracker_entry_gives_way_to_the_folders_own(tmp_path):
    source, target = tmp_path / "a", tmp_path / "b"
    source.mkdir(), target.mkdir()
    write_state(source, "mlflow", {"run_id": "from-a", "last_step": 30})
    saved = CheckpointRecord(lambda: source, None).state_dict()
    assert saved == {"mlflow": {"run_id": "from-a", "last_step": 30}}
    # --resume a/checkpoint.pt --run-dir b: a's tracker.json (a later step) is what counts
    CheckpointRecord(lambda: target, str(source / "checkpoint.pt")).load_state_dict(
        {"mlflow": {"run_id": "from-a", "last_step": 20}})
    assert read_state(target) == {}
    # neither folder has one (a copied checkpoint): the checkpoint's entry is written back
    CheckpointRecord(lambda: target, None).load_state_dict(
        {"mlflow": {"run_id": "from-a", "last_step": 20}, "wandb": {}})
    assert read_state(target) == {"mlflow": {"run_id": "from-a", "last_step": 20}}
    CheckpointRecord(lambda: target, None).load_state_dict(None)  # a checkpoint of before


def mlflow_client(store):
    from mlflow.tracking import MlflowClient
    return MlflowClient(store)


@needs_mlflow
def test_an_unreachable_tracking_server_warns_and_training_goes_on(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")  # nothing listens there
    started = time.monotonic()
    history = make_trainer(tmp_path, tracker="mlflow").fit()
    assert len(history) == 2 and time.monotonic() - started < 60
    err = capsys.readouterr().err
    assert err.count("hvdtrain: warning: mlflow tracking failed") == 1, err
    assert "python -m hvdtrain.trackers.replay" in err
    # the log is the record
    assert [r["type"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == ["header", "epoch",
                                                                           "epoch"]


@needs_mlflow
def test_a_tracking_uri_naming_a_store_not_made_yet_gets_the_run(tmp_path, monkeypatch):
    work, run_dir = tmp_path / "work", tmp_path / "run"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///team.db")  # relative: MLflow makes it
    make_trainer(run_dir, tracker="mlflow", epochs=1).fit()
    store = f"sqlite:///{work / 'team.db'}"
    assert read_state(run_dir)["mlflow"]["tracking_uri"] == store  # the same from anywhere
    [run] = mlflow_runs(store)
    assert run.data.metrics["test/acc"] > 0 and not (run_dir / "mlflow.db").exists()


@needs_mlflow
def test_a_store_that_cannot_be_used_warns_in_one_line_at_once(tmp_path, monkeypatch, capsys):
    from hvdtrain.trackers.mlflow_backend import MlflowBackend
    (tmp_path / "mlflow.db").write_bytes(b"not a database" * 100)  # MLflow retries it for 100 s
    started = time.monotonic()
    feed(TrackerSink(MlflowBackend(tmp_path, "hvdtrain"), tmp_path, {}), [1, 2])
    err = capsys.readouterr().err
    assert time.monotonic() - started < 20 and len(err.splitlines()) == 1, err
    assert f"the SQLite store {tmp_path / 'mlflow.db'} cannot be used (file is not a " \
           "database): move it away, or set MLFLOW_TRACKING_URI to another store" in err
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'nowhere' / 'm.db'}")
    feed(TrackerSink(MlflowBackend(tmp_path, "hvdtrain"), tmp_path, {}), [1, 2])
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and f"create {tmp_path / 'nowhere'}" in err, err


@needs_wandb
def test_wandb_offline_run_holds_the_epochs_of_the_log(tmp_path):
    make_trainer(tmp_path, tracker="wandb").fit()
    [path] = wandb_offline_runs(tmp_path)
    assert wandb_run_id(path) == read_state(tmp_path)["wandb"]["run_id"]
    rows = [r for r in wandb_history(path) if "test/acc" in r]
    epochs = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if r["type"] == "epoch"]
    assert [(r["_step"], r["test/acc"]) for r in rows] == [
        (e["step"], pytest.approx(e["test_acc"], rel=1e-6)) for e in epochs]


@needs_mlflow
def test_compare_is_a_parent_run_whose_children_are_its_runs(tmp_path, monkeypatch):
    from hvdtrain.trackers.mlflow_backend import MlflowBackend
    from hvdtrain.trackers.parent import ParentRun

    out = tmp_path / "compare"
    out.mkdir()
    parent = ParentRun(out, {"modes": "sync,async", "seeds": 1})
    child_dir = out / "runs" / "sync-s0"  # what compare's runner launches, with its environment
    child_dir.mkdir(parents=True)
    feed(TrackerSink(MlflowBackend(child_dir, "hvdtrain"), child_dir, {}), [1, 2])
    (out / "report.md").write_text("# report\n")
    parent.finish([out / "report.md", out / "missing.png"], failed_runs=0)
    store = mlflow_store(out)
    runs = {r.info.run_name: r for r in mlflow_runs(store)}
    assert set(runs) == {"compare", "sync-s0"}
    parent_id = runs["compare"].info.run_id
    assert runs["sync-s0"].data.tags["mlflow.parentRunId"] == parent_id
    assert runs["compare"].data.params["compare/modes"] == "sync,async"
    assert [a.path for a in mlflow_client(store).list_artifacts(parent_id)] == ["report.md"]
    assert not (child_dir / "mlflow.db").exists()  # one store: the comparison's
