"""--keep-best and --early-stop-patience in one process (the trainer driven by test_trainer's
LocalScheme): best.pt follows the best evaluation, early stopping stops, and both survive a
resume."""

from __future__ import annotations

import pytest
import torch

from hvdtrain import checkpoint
from hvdtrain.config import Config, ConfigError, parse_metric_goal
from hvdtrain.losses import accuracy
from hvdtrain.run_output import read_jsonl
from test_trainer import make_trainer


def epoch_lines(run_dir):
    return [r for r in read_jsonl(run_dir / "metrics.jsonl") if r["type"] == "epoch"]


@pytest.mark.parametrize("text, expected", [
    ("test_acc", ("test_acc", "max")), ("test_loss", ("test_loss", "min")),
    ("test_nll_loss", ("test_nll_loss", "min")), ("min:test_mae", ("test_mae", "min")),
    ("max:test_loss", ("test_loss", "max")), ("", None)])
def test_the_metric_names_its_direction(text, expected):
    assert parse_metric_goal(text) == expected


@pytest.mark.parametrize("options, message", [
    ({"keep_best": "best:test_acc"}, "--keep-best: invalid value 'best:test_acc'"),
    ({"keep_best": "min:"}, "--keep-best: invalid value 'min:'"),
    ({"early_stop_patience": 3}, "--early-stop-patience watches the metric of --keep-best"),
    ({"keep_best": "test_acc", "early_stop_patience": -1}, "--early-stop-patience: invalid"),
])
def test_nonsensical_options_are_refused(options, message):
    with pytest.raises(ConfigError, match=message):
        Config.from_overrides(options).validate()


def test_a_metric_the_evaluation_does_not_report_is_refused_up_front(tmp_path):
    with pytest.raises(ConfigError, match=r"no 'test_f1'; choose one of test_loss, test_acc"):
        make_trainer(tmp_path, keep_best="test_f1")


def test_a_metric_without_a_value_is_refused_at_the_first_evaluation(tmp_path, monkeypatch):
    import hvdtrain.workload

    # A metric that counts no samples reports None; only the first evaluation can tell.
    monkeypatch.setattr(hvdtrain.workload, "default_metrics",
                        lambda loss: {"acc": accuracy, "empty": lambda out, y: (0.0, 0)})
    trainer = make_trainer(tmp_path, keep_best="test_empty")
    with pytest.raises(ConfigError, match="no value for 'test_empty'.*test_loss, test_acc"):
        trainer.fit()


def test_best_pt_holds_the_best_evaluation_and_loads_like_a_checkpoint(tmp_path):
    # min:test_acc: accuracy rises from the first epoch on, so the best is not the last epoch.
    trainer = make_trainer(tmp_path / "run", epochs=4, keep_best="min:test_acc")
    trainer.fit()
    lines = epoch_lines(tmp_path / "run")
    worst = min(lines, key=lambda r: r["test_acc"])  # the first of equals, as the tracker keeps
    best = checkpoint.load(tmp_path / "run" / "best.pt")
    assert best["epoch"] == worst["epoch"] != 4
    assert best["best"]["value"] == worst["test_acc"]
    assert set(best) == set(checkpoint.load(tmp_path / "run"))  # checkpoint.pt's content
    # --resume run/best.pt continues from that epoch, with that epoch's weights
    resumed = make_trainer(tmp_path / "from_best", epochs=best["epoch"] + 1,
                           keep_best="min:test_acc", resume=str(tmp_path / "run" / "best.pt"))
    assert [e.epoch for e in resumed.fit()] == [best["epoch"] + 1]
    for name, tensor in best["model"].items():
        assert torch.equal(resumed.scheme.started_with[0]["model"][name], tensor), name


def test_early_stopping_stops_writes_the_checkpoint_and_says_why(tmp_path, capsys):
    # max:test_loss never improves on the first epoch's loss, so patience 2 stops after epoch 3.
    trainer = make_trainer(tmp_path, epochs=10, checkpoint_every=0, keep_best="max:test_loss",
                           early_stop_patience=2)
    history = trainer.fit()
    assert [e.epoch for e in history] == [1, 2, 3]
    assert checkpoint.load(tmp_path)["epoch"] == 3  # the final checkpoint, despite the cadence
    assert checkpoint.load(tmp_path / "best.pt")["epoch"] == 1
    stop = read_jsonl(tmp_path / "metrics.jsonl")[-1]
    assert stop["type"] == "stop" and stop["epoch"] == 3
    assert "test_loss has not improved in 2 evaluations" in stop["reason"]
    assert "stopped early after epoch 3: test_loss has not improved" in capsys.readouterr().out


def test_a_resumed_run_keeps_its_best_and_its_patience(tmp_path):
    first = make_trainer(tmp_path, epochs=2, keep_best="max:test_loss", early_stop_patience=3)
    first.fit()
    best_before = (tmp_path / "best.pt").read_bytes()
    # One evaluation without improvement so far: two more stop it, after epoch 4. A run that
    # forgot its record would take epoch 3 as its best, overwrite best.pt and stop after epoch 6.
    resumed = make_trainer(tmp_path, epochs=10, keep_best="max:test_loss", early_stop_patience=3,
                           auto_resume=True)
    history = resumed.fit()
    assert [e.epoch for e in history] == [3, 4]
    assert (tmp_path / "best.pt").read_bytes() == best_before
    assert checkpoint.load(tmp_path)["best"]["evaluations_since"] == 3
    # Run again, the stopped run stops at once instead of training on.
    again = make_trainer(tmp_path, epochs=10, keep_best="max:test_loss", early_stop_patience=3,
                         auto_resume=True)
    assert again.fit() == []
    assert read_jsonl(tmp_path / "metrics.jsonl")[-1]["type"] == "stop"


def test_patience_running_out_on_nan_losses_stops_without_a_traceback(tmp_path, capsys):
    # NaN in the test data: every evaluation's loss is NaN, so none is ever the best (the record
    # stays None) and patience runs out with nothing to format as "best". This raised TypeError.
    from test_trainer import data
    x, y = data()
    x = x.clone()
    x[200:] = float("nan")
    trainer = make_trainer(tmp_path, x=(x, y), epochs=6, keep_best="test_acc",
                           early_stop_patience=2)
    history = trainer.fit()
    assert [e.epoch for e in history] == [1, 2]
    assert len(epoch_lines(tmp_path)) == 2  # the epoch that ran out of patience keeps its line
    stop = read_jsonl(tmp_path / "metrics.jsonl")[-1]
    assert stop["type"] == "stop" and "none gave a finite value" in stop["reason"]
    out = capsys.readouterr().out
    assert "stopped early after epoch 2" in out and "the best model is in" not in out
    assert not (tmp_path / "best.pt").exists()


def test_an_earlier_attempts_best_model_is_kept_aside_and_a_resume_keeps_a_better_one(tmp_path,
                                                                                      capsys):
    """A run that started afresh in a folder (its first attempt killed before a checkpoint)
    replaced that attempt's best.pt without a word; a resume could replace a better best.pt
    written after its checkpoint."""
    first = make_trainer(tmp_path, epochs=3, keep_best="test_acc")
    first.fit()
    earlier = (tmp_path / "best.pt").read_bytes()
    (tmp_path / "checkpoint.pt").unlink()  # as if killed before its first checkpoint
    again = make_trainer(tmp_path, epochs=1, keep_best="test_acc", auto_resume=True)
    again.fit()
    kept = [p for p in tmp_path.glob("best.*.pt")]
    assert len(kept) == 1 and kept[0].read_bytes() == earlier
    assert "held an earlier attempt's best model; it is kept as" in capsys.readouterr().out
    # best.pt now says 1.1 at epoch 1, better than anything the resumed record holds
    better = checkpoint.load(tmp_path / "best.pt")
    better["best"]["value"] = 1.1
    torch.save(better, tmp_path / "best.pt")
    resumed = make_trainer(tmp_path, epochs=3, keep_best="test_acc", auto_resume=True)
    resumed.fit()
    assert checkpoint.load(tmp_path / "best.pt")["best"]["value"] == 1.1  # never replaced
    assert len(list(tmp_path.glob("best.*.pt"))) == 1  # a resume keeps nothing aside
