"""``hvdtrain compare --target`` on any metric (issue 43): the target's parsing, its direction
in the results, report, plots, simulator and --from-run, and the refusal of a target the
workload does not report, before any run starts. A real comparison of a language model on a
loss target is tests/multiproc/test_compare_multiproc.py."""

import json
import math

import pytest

from hvdtrain.cli import build_parser
from hvdtrain.compare import command
from hvdtrain.compare.from_run import read_run
from hvdtrain.compare.from_run_replay import prediction_table, replay, run_target
from hvdtrain.compare.plan import modes, plan
from hvdtrain.compare.report import finding, parse_table, summarize, write_report
from hvdtrain.compare.results import RunResult, read_result, time_to_target
from hvdtrain.compare.target_metric import Target, check_plan_target
from hvdtrain.config import ConfigError, parse_stop_at

LM = "tests/helpers/user/tiny_lm.py"
LOSS = Target("test_loss", "<=", 2.0)


def _options(tmp_path, *flags):
    return command.validate(build_parser().parse_args(
        ["compare", "--out", str(tmp_path / "out"), *flags]))


# --- parsing --------------------------------------------------------------------------------------
def test_a_target_is_a_metric_a_direction_and_a_value_and_a_bare_number_is_accuracy(tmp_path):
    assert Target.parse("test_loss<=1.9") == Target("test_loss", "<=", 1.9)
    assert Target.parse(" test_char_acc >= 0.6 ") == Target("test_char_acc", ">=", 0.6)
    assert Target.parse("0.95") == Target.parse(0.95) == Target("test_acc", ">=", 0.95)
    assert _options(tmp_path).goal == Target("test_acc", ">=", 0.95)  # the default, as before
    assert _options(tmp_path, "--target", "0.9").goal == Target("test_acc", ">=", 0.9)
    assert _options(tmp_path, "--target", "test_loss<=1.9").goal == Target("test_loss", "<=", 1.9)
    # each run's --stop-at is read back by the same parser that train uses
    for target in (LOSS, Target("test_acc", ">=", 0.95), Target("test_f1", ">=", 1 / 3)):
        assert parse_stop_at(target.stop_at()) == (target.metric, target.op, target.value)


@pytest.mark.parametrize("value,words", [
    ("test_loss<2", "write NAME>=VALUE or NAME<=VALUE"),
    ("test_loss<=low", "'low' is not a number"),
    ("1.5", "a bare number is a test accuracy, in (0, 1]"),
    ("0", "a bare number is a test accuracy"),
    ("test_loss<=nan", "write NAME>=VALUE"),
    ("test_acc>=95", "test_acc is a fraction of the test samples, in [0, 1]"),
])
def test_a_bad_target_says_how_to_write_one(tmp_path, value, words):
    with pytest.raises(ConfigError, match="--target: invalid value") as e:
        _options(tmp_path, "--target", value)
    assert words in str(e.value)


def test_the_direction_judges_reaching_and_the_best_value():
    rising, falling = Target("test_acc", ">=", 0.9), LOSS
    assert rising.reached(0.9) and not rising.reached(0.89) and not rising.reached(None)
    assert falling.reached(2.0) and falling.reached(1.5) and not falling.reached(2.1)
    assert not falling.reached(math.nan)  # a diverged evaluation reaches nothing
    assert rising.best([0.5, None, 0.8]) == 0.8 and falling.best([3.0, 2.5, math.inf]) == 2.5
    assert falling.capped(2.5) == Target("test_loss", "<=", 2.5)  # beyond the best: capped
    assert falling.capped(1.0) == falling
    assert rising.short() == "90%" and falling.short() == "test_loss <= 2"
    # a whole percent rounded 0.999 up to "100%", a target nobody set and few runs reach
    assert Target("test_acc", ">=", 0.999).describe() == "99.9% test accuracy"
    assert Target("test_acc", ">=", 0.57).short() == "57%"


# --- the plan and its refusal ---------------------------------------------------------------------
def _planned(monkeypatch, tmp_path, *flags):
    """The runs ``hvdtrain compare FLAGS`` would launch (none is launched)."""
    planned = []
    monkeypatch.setattr(command, "_run_plan",
                        lambda cfg, out, runs, modes: planned.extend(runs) or 0)
    command.main(build_parser().parse_args(["compare", "--out", str(tmp_path / "out"),
                                            "--seeds", "1", "--stragglers", "none", *flags]))
    return planned


def test_every_run_of_the_plan_stops_at_the_targets_metric(monkeypatch, tmp_path):
    runs = _planned(monkeypatch, tmp_path, "--modes", "sync,async", "--model", "mlp",
                    "--target", "test_loss<=0.3")
    for run in runs:
        cmd = run.command("python", "d", cores=2)
        assert cmd[cmd.index("--stop-at") + 1] == "test_loss<=0.3", cmd


def test_the_target_is_checked_under_a_planned_mode_so_its_flags_are_not_refused(
        monkeypatch, tmp_path):
    # --wire-dtype bf16 suits async DiLoCo and not plain sync: the workload's metrics were
    # learnt under plain sync's options, which refused the flag before any run of the plan
    runs = _planned(monkeypatch, tmp_path, "--modes", "adiloco", "--local-steps", "8",
                    "--model", "mlp", "--train-args", "--wire-dtype bf16")
    assert runs and all("bf16" in run.command("python", "d", cores=2) for run in runs)


@pytest.mark.parametrize("flags,reported", [
    # a language model's token loss: no accuracy (the case of issue 43)
    (["--dataset", f"{LM}:corpus", "--model", f"{LM}:build", f"--train-args=--loss "
      f"{LM}:token_loss", "--target", "0.5"], "it reports test_loss:"),
    (["--model", "mlp", "--target", "test_f1>=0.5"], "it reports test_loss, test_acc:"),
    (["--model", "mlp", "--target", "test_f1>=0.5", "--simulate"], "it reports test_loss, "),
])
def test_a_target_the_workload_does_not_report_is_refused_before_any_run(
        monkeypatch, tmp_path, flags, reported):
    with pytest.raises(ConfigError, match="reports no") as e:
        _planned(monkeypatch, tmp_path, "--modes", "sync", *flags)
    assert reported in str(e.value) and "name one of them" in str(e.value)
    assert not (tmp_path / "out").exists()  # nothing ran, nothing was written


def test_a_workload_without_a_test_split_is_refused_too():
    with pytest.raises(ConfigError, match="no test split"):
        check_plan_target(LOSS, ["--dataset", f"{LM}:corpus_without_test", "--test-fraction",
                                 "0", "--model", f"{LM}:build", "--loss", f"{LM}:token_loss"],
                          {})


# --- results, report, plots -----------------------------------------------------------------------
def _loss_curve(losses, step=10):
    return [{"step": step * (i + 1), "wall_seconds": float(i + 1), "train_loss": None,
             "test_acc": None, "test_loss": loss} for i, loss in enumerate(losses)]


def _loss_result(mode, seed, losses):
    curve = _loss_curve(losses)
    return RunResult(f"{mode}-seed{seed}", mode, "none", seed, "ok", "", None,
                     time_to_target(curve, LOSS), 100.0, 0.0, curve[-1]["wall_seconds"], curve,
                     {})


def test_time_to_a_loss_target_is_the_first_evaluation_at_or_below_it():
    assert time_to_target(_loss_curve([3.0, 2.5, 2.0, 1.0]), LOSS) == 3.0
    assert time_to_target(_loss_curve([3.0, 2.5]), LOSS) is None
    # an accuracy target on a loss-only curve reaches nothing; a float is still an accuracy
    assert time_to_target(_loss_curve([0.5]), 0.4) is None


def test_a_runs_log_of_losses_alone_gives_its_time_and_final_loss(tmp_path):
    lines = [{"type": "header", "num_workers": 2, "config": {"run": {"batch_size": 8}}},
             *({"type": "eval", "step": s, "wall_seconds": s / 10 + 1, "train_seconds": s / 10,
                "test_loss": loss} for s, loss in [(5, 3.1), (10, 2.4), (15, 1.9), (20, 1.7)]),
             {"type": "stop", "step": 20, "train_seconds": 2.0, "wall_seconds": 3.0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    [run] = plan(modes(["sync"], []), [0], ["none"], 2, [])
    result = read_result(run, tmp_path, {"status": "ok"}, LOSS)
    assert result.time_to_target == 1.5 and result.final_value == 1.7
    assert result.final_test_acc is None and result.curve[0]["test_loss"] == 3.1
    assert result.workers == 2  # summary.csv's workers column, from the log's header


def test_the_report_says_the_metric_and_its_direction(tmp_path):
    results = [_loss_result("sync", s, [3.0, 2.5, 1.9, 1.5]) for s in range(3)] + \
        [_loss_result("async", s, [3.0, 1.9 + s / 100, 1.5]) for s in range(3)]
    text = write_report(results, tmp_path / "report.md", LOSS, 2, "Plan.", [])
    assert "which reaches the target test loss sooner" in text
    assert "Target: test_loss <= 2. " in text and "evaluation at or below the target" in text
    rows = {r["mode"]: r for r in parse_table(text)}
    assert rows["sync"]["final test loss"] == "1.5000 ± 0.0000"
    assert rows["sync"]["time to target (s)"] == "3.00 [3.00, 3.00]"
    assert rows["async"]["time to target (s)"] == "2.00 [2.00, 2.00]"
    assert rows["async"]["time to target vs sync"] == "0.67 [0.67, 0.67]"
    assert rows["sync"]["time to target vs sync"] == "1"
    never = [_loss_result("sync", s, [3.0, 2.5]) for s in range(3)]  # sync never reached it
    rows = {r["mode"]: r for r in parse_table(write_report(never, tmp_path / "r.md", LOSS, 2,
                                                            "Plan.", []))}
    assert rows["sync"]["time to target vs sync"] == "-"
    text = finding(summarize(results, 2, LOSS), "none", LOSS)
    assert "time to test_loss <= 2 (mean [95% interval])" in text and "**async beats sync**" in text


def test_the_plots_draw_the_targets_metric_falling_to_its_line(monkeypatch, tmp_path):
    from hvdtrain.compare import plots

    drawn = []
    monkeypatch.setattr(plots, "_curves", lambda *args: drawn.append(args))
    monkeypatch.setattr(plots, "_throughput", lambda *args: None)
    results = [_loss_result("sync", 0, [3.0, 1.5])]
    names = plots.write_plots(results, tmp_path, LOSS)
    assert names[0] == "test_loss_vs_time.png"
    _, _, _, x_key, y_key, _, ylabel, title, path, line = drawn[0]
    assert (y_key, ylabel, title, line) == ("test_loss", "test loss",
                                            "Test loss against training time", 2.0)
    assert path == tmp_path / "test_loss_vs_time.png"
    # the loss target's figure, a file written by no one here (the curves are stubbed), and
    # another plan's staleness: the accuracy plan leaves only its own figures beside its report
    for name in ("test_loss_vs_time.png", "staleness.png"):
        (tmp_path / name).write_bytes(b"")
    assert plots.write_plots(results, tmp_path, 0.9)[0] == "accuracy_vs_time.png"  # as before
    assert not (tmp_path / "test_loss_vs_time.png").exists()
    assert not (tmp_path / "staleness.png").exists()  # a sync-only plan draws none


# --- the simulator --------------------------------------------------------------------------------
def test_the_simulator_stops_at_a_loss_target_as_a_real_runs_stop_at_does():
    from hvdtrain.compare.sim.sweep import simulate_run
    from hvdtrain.compare.sim.timing import Timing

    args = ["--dataset", "digits", "--model", "mlp", "--epochs", "2", "--threads", "1"]
    result = simulate_run(modes(["sync"], [])[0], 2, "", 0, args, "test_loss<=1.0",
                          Timing(step_seconds=0.001), eval_every_steps=4, stop_at_target=True)
    losses = [p["test_loss"] for p in result.curve]
    assert losses[-1] <= 1.0 and all(loss > 1.0 for loss in losses[:-1]), losses
    assert result.time_to_target == result.curve[-1]["wall_seconds"]
    assert result.final_value == losses[-1]
    assert result.curve[-1]["test_acc"] is not None  # every metric is still recorded


# --- --from-run -----------------------------------------------------------------------------------
def _loss_run(folder, losses=(3.0, 2.2, 1.8)):
    from test_from_run import STEPS, _header, _sync_epoch

    folder.mkdir()
    lines = [_header()] + [
        {"type": "epoch", "epoch": e, "step": e * STEPS, "wall_seconds": 0.2 * e,
         "train_seconds": 0.2 * e, "test_loss": loss,
         "step_times": _sync_epoch(e).times.as_record()}
        for e, loss in enumerate(losses, 1)]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return read_run(folder)  # evaluated its own metric: not "never evaluated"


def test_from_run_reads_a_run_that_evaluated_a_loss_alone_and_caps_at_its_best(tmp_path):
    run = _loss_run(tmp_path / "r")
    assert run.metrics() == ["test_loss"]
    assert run_target(LOSS, run) == (LOSS, "")
    target, note = run_target(Target("test_loss", "<=", 1.0), run)
    assert target == Target("test_loss", "<=", 1.8) and "lies beyond it" in note
    with pytest.raises(ConfigError, match="reports no 'test_acc'; it reports test_loss"):
        run_target(Target("test_acc", ">=", 0.9), run)
    assert "| mode | reached test_loss <= 2 |" in prediction_table([], LOSS)


def test_from_run_replays_to_the_first_evaluation_at_or_below_a_loss_target(monkeypatch,
                                                                             tmp_path):
    from hvdtrain.compare.sim import sweep

    run = _loss_run(tmp_path / "r")
    curve = _loss_curve([2.6, 2.1, 1.9, 1.2], step=20)
    monkeypatch.setattr(sweep, "simulate_run", lambda *a, **k: RunResult(
        "x", "sync", "none", 0, "ok", "", None, None, None, None, None, curve, {}))
    [prediction], _ = replay(run, modes(["sync"], []), [0, 1], LOSS, 1e-4)
    assert prediction.complete and len(prediction.times) == 2
    # the third evaluation (1.9 <= 2) at 3 virtual s, at the run's speed of single runs
    assert all(2.0 < t < 5.0 for t in prediction.times), prediction.times
