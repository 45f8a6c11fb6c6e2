"""--tensorboard: the event files hold what metrics.jsonl holds, at the same global steps, and a
resumed run continues them. Single process, through the scheme of test_trainer that needs no MPI."""

from __future__ import annotations

import sys

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from hvdtrain.cli import main
from hvdtrain.loop.tensorboard import TensorBoardSink
from hvdtrain.run_output import read_jsonl
from test_trainer import CrashAt, make_trainer


def events(run_dir) -> EventAccumulator:
    acc = EventAccumulator(str(run_dir))
    acc.Reload()
    return acc


def scalars(acc: EventAccumulator, tag: str) -> dict[int, float]:
    return {e.step: e.value for e in acc.Scalars(tag)}


def test_event_files_hold_the_losses_metrics_lr_and_throughput_of_the_log(tmp_path):
    make_trainer(tmp_path, epochs=2, tensorboard=True, log_steps=True).fit()
    log = read_jsonl(tmp_path / "metrics.jsonl")
    acc = events(tmp_path)
    assert set(acc.Tags()["scalars"]) == {
        "step/loss", "step/lr", "train/loss", "train/acc", "test/loss", "test/acc", "epoch/lr",
        "epoch/samples_per_sec", "epoch/epoch_seconds", "epoch/tflops",
        *[f"step_times/{name}/worker0" for name in ("compute_p50", "compute_p90", "compute_mean",
                                                    "wait_p50", "wait_p90", "compute_p10", "wait_mean")]}
    epochs = [r for r in log if r["type"] == "epoch"]
    assert [r["step"] for r in epochs] == [12, 24]
    for key, tag in [("train_loss", "train/loss"), ("train_acc", "train/acc"),
                     ("test_loss", "test/loss"), ("test_acc", "test/acc"), ("lr", "epoch/lr"),
                     ("samples_per_sec", "epoch/samples_per_sec"), ("tflops", "epoch/tflops")]:
        assert scalars(acc, tag) == {r["step"]: pytest.approx(r[key], rel=1e-6) for r in epochs}
    assert scalars(acc, "step_times/compute_p50/worker0") == {
        r["step"]: pytest.approx(r["step_times"]["compute_p50"][0], rel=1e-6) for r in epochs}
    steps = [r for r in log if r["type"] == "step"]
    assert scalars(acc, "step/loss") == {r["step"]: pytest.approx(r["loss"], rel=1e-6)
                                         for r in steps}
    assert sorted(scalars(acc, "step/lr")) == list(range(1, 25))


def test_a_resumed_run_continues_the_steps_and_hides_those_it_repeats(tmp_path):
    # 12 steps an epoch, a checkpoint every 5 steps: killed in step 17, resumed from step 15.
    with pytest.raises(KeyboardInterrupt):
        make_trainer(tmp_path, hooks=[CrashAt(17)], checkpoint_steps=5, log_steps=True,
                     tensorboard=True).fit()
    make_trainer(tmp_path, checkpoint_steps=5, log_steps=True, tensorboard=True,
                 auto_resume=True).fit()
    assert len(list(tmp_path.glob("events.out.tfevents.*"))) == 2
    acc = events(tmp_path)
    losses = [e.step for e in acc.Scalars("step/loss")]
    assert losses == list(range(1, 25))  # steps 16 on once each, from the resumed run
    last_written = {r["step"]: r["loss"] for r in read_jsonl(tmp_path / "metrics.jsonl")
                    if r["type"] == "step"}
    assert scalars(acc, "step/loss") == pytest.approx(last_written, rel=1e-6)
    assert sorted(scalars(acc, "test/acc")) == [12, 24]


def test_a_staleness_histogram_keeps_one_bucket_per_value(tmp_path):
    sink = TensorBoardSink(tmp_path, first_step=1)
    sink.record("epoch", {"step": 40, "lr": 0.1})
    sink.record("scheme", {"staleness_histogram": {0: 5, 3: 2, 1: 1}, "pushes_applied": 8,
                           "servers": [{"pushes_applied": 8}]})
    sink.close()
    acc = events(tmp_path)
    assert scalars(acc, "scheme/pushes_applied") == {40: 8}
    [event] = acc.Histograms("scheme/staleness_histogram")
    h = event.histogram_value
    assert event.step == 40 and (h.min, h.max, h.num, h.sum) == (0, 3, 8, 7)
    assert list(h.bucket_limit) == [0.5, 1.5, 2.5, 3.5] and list(h.bucket) == [5, 1, 0, 2]


def test_a_preempted_stop_line_and_the_scheme_after_it_sit_at_the_global_step(tmp_path):
    """A preempted stop line's step is its step in the epoch: it put the stop, and the async
    scheme line after it, at x = 4 where the run had reached global step 818."""
    sink = TensorBoardSink(tmp_path, first_step=1)
    sink.record("epoch", {"step": 814, "lr": 0.1})
    sink.record("stop", {"epoch": 38, "step": 4, "global_step": 818, "reason": "preempted"})
    sink.record("scheme", {"pushes_applied": 1639})
    sink.close()
    acc = events(tmp_path)
    assert scalars(acc, "scheme/pushes_applied") == {818: 1639}
    assert "stop/global_step" not in acc.Tags()["scalars"]  # a position, not a figure


def test_tensorboard_without_the_package_stops_up_front_with_the_fix(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # as if it were not installed
    assert main(["train", "--tensorboard"]) == 2
    assert "pip install tensorboard" in capsys.readouterr().err
