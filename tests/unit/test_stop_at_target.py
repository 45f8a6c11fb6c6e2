"""--stop-at METRIC>=VALUE in one process (the trainer driven by test_trainer's LocalScheme): the
flag is parsed and checked, and a run ends at the evaluation that reaches its target, with a
checkpoint, a stop line and no preemption; a run that never reaches it trains all its epochs."""

from __future__ import annotations

import pytest

from hvdtrain import checkpoint
from hvdtrain.cli import build_parser, config_from_args
from hvdtrain.config import Config, ConfigError, RunConfig, parse_stop_at
from hvdtrain.loop.target import TargetStop
from hvdtrain.run_output import read_jsonl
from test_trainer import make_trainer


def lines(run_dir, kind):
    return [r for r in read_jsonl(run_dir / "metrics.jsonl") if r["type"] == kind]


def first_reaching(records, metric, op, value):
    return next(r for r in records if (r[metric] >= value if op == ">=" else r[metric] <= value))


# --- the flag -------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, expected", [
    ("test_acc>=0.95", ("test_acc", ">=", 0.95)), ("test_loss<=0.1", ("test_loss", "<=", 0.1)),
    (" test_mae <= 2.5 ", ("test_mae", "<=", 2.5)), ("test_acc>=1", ("test_acc", ">=", 1.0)),
    ("", None)])
def test_a_target_names_a_metric_a_direction_and_a_value(text, expected):
    assert parse_stop_at(text) == expected


@pytest.mark.parametrize("text", [
    "test_acc", "test_acc>0.9", "test_acc=0.9", "test_acc=>0.9", ">=0.9", "test_acc>=",
    "test_acc>=high", "test_acc>=nan", "test_acc>=inf", "test acc>=0.9", "test_acc>=0.9>=1",
    "max:test_acc>=0.9"])
def test_a_target_in_another_format_is_refused_with_the_format(text):
    with pytest.raises(ConfigError, match=r"--stop-at: invalid value .*NAME>=VALUE or "
                                          r"NAME<=VALUE, e\.g\. test_acc>=0\.95"):
        Config.from_overrides({"stop_at": text}).validate()


@pytest.mark.parametrize("text, fix", [("test_loss>=0.8", "test_loss<=0.8"),
                                       ("test_acc <= 0.9", "test_acc>=0.9")])
def test_a_built_in_metric_the_wrong_way_round_is_refused_with_the_right_one(text, fix):
    """An untrained model's first evaluation would reach it: compare called such a target
    reached at once."""
    with pytest.raises(ConfigError, match=f"would be reached by an untrained one; write {fix}"):
        Config.from_overrides({"stop_at": text}).validate()
    assert parse_stop_at("test_mae>=2.5") == ("test_mae", ">=", 2.5)  # a user's: either way
    # compare called test_acc>=0 reached by every run at its first evaluation
    with pytest.raises(ConfigError, match="every model reaches test_acc>=0, an accuracy of 0"):
        Config.from_overrides({"stop_at": "test_acc>=0"}).validate()


def test_the_flag_reaches_the_run_config():
    args = build_parser().parse_args(["train", "--stop-at", "test_acc>=0.9"])
    assert config_from_args(args).run.stop_at == "test_acc>=0.9"


def test_a_metric_the_evaluation_does_not_report_is_refused_with_the_list(tmp_path):
    with pytest.raises(ConfigError, match=r"--stop-at: this run's evaluation reports no "
                                          r"'test_f1'; choose one of test_loss, test_acc"):
        make_trainer(tmp_path, stop_at="test_f1>=0.5")


def test_a_run_without_a_test_split_is_refused():
    with pytest.raises(ConfigError, match="--stop-at: this run has no test split"):
        TargetStop(RunConfig(stop_at="test_acc>=0.9"), ["acc"], has_test_split=False)
    TargetStop(RunConfig(), ["acc"], has_test_split=False)  # without --stop-at: nothing to judge


# --- the run --------------------------------------------------------------------------------------
@pytest.mark.parametrize("target", ["test_acc>=0.8", "test_loss<=0.3"])
def test_an_epoch_evaluation_that_reaches_the_target_ends_the_run_after_its_epoch(
        tmp_path, capsys, target):
    reference = make_trainer(tmp_path / "reference", epochs=8)
    reference.fit()
    metric, op, value = parse_stop_at(target)
    reached = first_reaching(lines(tmp_path / "reference", "epoch"), metric, op, value)
    assert 1 < reached["epoch"] < 8  # the case needs a target reached neither at once nor last

    trainer = make_trainer(tmp_path / "run", epochs=8, checkpoint_every=0, stop_at=target)
    history = trainer.fit()
    assert [e.epoch for e in history] == list(range(1, reached["epoch"] + 1))
    assert trainer.stopping.verdict.preempted is None  # exit 0, not 75
    saved = checkpoint.load(tmp_path / "run")  # written despite --checkpoint-every 0
    assert (saved["epoch"], saved["step"]) == (reached["epoch"], 0)
    epoch_line = lines(tmp_path / "run", "epoch")[-1]
    assert epoch_line[metric] == reached[metric]
    [stop] = lines(tmp_path / "run", "stop")
    assert stop["reason"] == f"reached the target: {metric} {reached[metric]:.6g} {op} " \
                             f"{value:g} at step {reached['step']}"
    assert (stop["epoch"], stop["step"], stop["target"]) == (reached["epoch"], reached["step"],
                                                           target)
    # stamped when it stopped: right after that evaluation, whose time is not training time
    # (the epoch line rounds its train_seconds to 1 ms, the stop line to 0.1 ms)
    assert -1e-3 <= stop["train_seconds"] - epoch_line["train_seconds"] < 0.5
    assert stop["train_seconds"] <= stop["wall_seconds"]
    assert read_jsonl(tmp_path / "run" / "metrics.jsonl")[-1]["type"] == "stop"
    assert f"hvdtrain: reached the target {target}" in capsys.readouterr().out


@pytest.mark.parametrize("target", ["test_acc>=0.85", "test_loss<=0.2"])
def test_a_step_evaluation_that_reaches_the_target_stops_at_that_step(tmp_path, target):
    options = {"epochs": 8, "eval_every_steps": 4}
    make_trainer(tmp_path / "reference", **options).fit()
    metric, op, value = parse_stop_at(target)
    evaluations = [r for r in read_jsonl(tmp_path / "reference" / "metrics.jsonl")
                   if r["type"] in ("eval", "epoch")]
    reached = first_reaching(evaluations, metric, op, value)
    assert reached["type"] == "eval"  # reached inside an epoch, not by an epoch's evaluation

    trainer = make_trainer(tmp_path / "run", **options, stop_at=target)
    trainer.fit()
    assert trainer.stopping.verdict.preempted is None
    evals = lines(tmp_path / "run", "eval")
    assert evals[-1]["step"] == reached["step"] and evals[-1][metric] == reached[metric]
    [stop] = lines(tmp_path / "run", "stop")
    # One process agrees with itself at once: it stops after the step it evaluated at.
    assert (stop["step"], stop["epoch"]) == (reached["step"], reached["epoch"])
    assert 0 <= stop["train_seconds"] - evals[-1]["train_seconds"] < 0.5
    assert stop["reason"].startswith(f"reached the target: {metric} ")
    saved = checkpoint.load(tmp_path / "run")
    steps = trainer.plan.steps_per_epoch
    assert (saved["global_step"], saved["epoch"], saved["step"]) == (
        reached["step"], (reached["step"] - 1) // steps, (reached["step"] - 1) % steps + 1)
    for name, tensor in trainer.replica.model.state_dict().items():
        assert (saved["model"][name] == tensor).all(), name  # the weights it stopped with


def test_a_stop_signal_at_the_same_step_wins(tmp_path):
    trainer = make_trainer(tmp_path, epochs=8, eval_every_steps=4, stop_at="test_acc>=0.85")

    class SignalWithTheTarget:  # SIGTERM lands just as the target is reached
        @property
        def received(self):
            return "SIGTERM" if trainer.stopping.target.reached else None

    trainer.stopping.signals = SignalWithTheTarget()
    trainer.fit()
    verdict = trainer.stopping.verdict
    assert verdict.preempted == "SIGTERM" and verdict.target is None  # exit 75, requeued
    [stop] = lines(tmp_path, "stop")
    assert stop["reason"] == "preempted: SIGTERM"


def test_a_target_never_reached_trains_every_epoch(tmp_path):
    trainer = make_trainer(tmp_path, epochs=2, eval_every_steps=4, stop_at="test_acc>=1.5")
    assert [e.epoch for e in trainer.fit()] == [1, 2]
    assert trainer.stopping.verdict.preempted is None and trainer.stopping.verdict.target is None
    assert lines(tmp_path, "stop") == []


def test_a_target_reached_by_the_last_evaluation_trains_every_epoch_and_is_said(tmp_path, capsys):
    """No early stop, but the stop line says it was reached, and the checkpoint is finished for
    a resume with more epochs and the same target (it used to train on, and said nothing)."""
    make_trainer(tmp_path / "reference", epochs=2).fit()
    first, last = lines(tmp_path / "reference", "epoch")
    assert first["test_acc"] < last["test_acc"]
    target = f"test_acc>={last['test_acc']}"
    trainer = make_trainer(tmp_path / "run", epochs=2, stop_at=target)
    assert [e.epoch for e in trainer.fit()] == [1, 2]
    assert trainer.stopping.verdict.target is not None and not trainer.stopping.verdict.requeue
    [stop] = lines(tmp_path / "run", "stop")
    assert stop["target"] == target and stop["epoch"] == 2 and stop["reason"].startswith(
        "reached the target")
    assert checkpoint.load(tmp_path / "run")["finished"]["target"] == target
    capsys.readouterr()
    again = make_trainer(tmp_path / "run", epochs=4, stop_at=target, auto_resume=True)
    assert again.fit() == []
    assert "before this resume; nothing is left to train" in capsys.readouterr().out


def test_a_run_that_reached_its_target_is_finished_when_run_again(tmp_path, capsys):
    # The same command again (--auto-resume, a requeue) used to train on after the target.
    options = {"epochs": 8, "eval_every_steps": 4, "stop_at": "test_acc>=0.85"}
    make_trainer(tmp_path / "run", **options).fit()
    before = checkpoint.load(tmp_path / "run")
    assert before["finished"]["target"] == "test_acc>=0.85"
    capsys.readouterr()
    again = make_trainer(tmp_path / "run", **options, auto_resume=True)
    assert again.fit() == []  # no epoch trained
    assert again.stopping.verdict.why == "target" and not again.stopping.verdict.requeue
    assert "before this resume; nothing is left to train" in capsys.readouterr().out
    after = checkpoint.load(tmp_path / "run")
    assert after["global_step"] == before["global_step"]
    # another target trains on from the checkpoint
    further = make_trainer(tmp_path / "run", **{**options, "stop_at": "test_acc>=0.99"},
                           auto_resume=True)
    further.fit()
    assert checkpoint.load(tmp_path / "run")["global_step"] > before["global_step"]


@pytest.mark.parametrize("finish, fix", [
    ({"epochs": 2}, "--epochs 3 or more"),
    ({"epochs": 8, "stop_at": "test_acc>=0.8"}, "another --stop-at target, or none")])
def test_a_finished_checkpoint_resumed_into_a_new_folder_is_refused_and_leaves_none(tmp_path,
                                                                                   finish, fix):
    make_trainer(tmp_path / "old", **finish).fit()
    new = tmp_path / "new"
    with pytest.raises(ConfigError, match=rf"nothing is left to train into .*new\. Pass {fix} "):
        make_trainer(new, **finish, resume=str(tmp_path / "old")).fit()
    assert not new.exists()
