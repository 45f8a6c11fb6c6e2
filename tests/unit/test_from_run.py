"""compare --from-run's fit (compare/from_run.py) on synthetic logs with known figures, its
reading of a run's log and its errors, and the replay's pieces (compare/from_run_replay.py);
the whole command against a real run is tests/multiproc/test_compare_from_run.py."""

import json

import numpy as np

import pytest

from hvdtrain.compare.from_run import (EpochTimes, FittedDelays, delay_fit, fit_epochs,
                                       read_run, run_speeds, split_warmup)
from hvdtrain.compare.from_run_replay import (Prediction, in_launch_folder, mode_of_run,
                                              output_folder, overlaps, recommend,
                                              train_args_from_config)
from hvdtrain.compare.plan import modes
from hvdtrain.compare.sim.flat_model import config_from_train_args
from hvdtrain.config import ConfigError
from hvdtrain.loop.step_times import RankStepTimes

STEPS = 20


def _times(compute_p50, compute_mean, wait_p50, wait_p90=None):
    n = len(compute_p50)
    return RankStepTimes(steps=(STEPS,) * n, samples=(STEPS * 32,) * n,
                         compute_p50=tuple(compute_p50), compute_p90=tuple(compute_mean),
                         compute_mean=tuple(compute_mean), wait_p50=tuple(wait_p50),
                         wait_p90=tuple(wait_p90 or wait_p50))


def _sync_epoch(epoch, base=0.002, factor=3.0, jitter=0.0005, allreduce=0.001, loop=0.0004):
    """A 2-worker sync epoch where worker 1 is ``factor`` times slower: worker 0 waits for
    worker 1's extra compute and the allreduce; worker 1 waits for the allreduce alone."""
    slow = base * factor
    times = _times([base, slow], [base + jitter, slow + jitter],
                   [slow - base + allreduce, allreduce])
    period = loop + slow + jitter + allreduce
    return EpochTimes(epoch, period * STEPS, STEPS, times)


def test_a_known_factor_and_costs_are_recovered():
    fit = fit_epochs([_sync_epoch(e) for e in range(2, 6)], lock_step=True, apply_seconds=1e-4)
    fast, slow = fit.workers
    assert fast.factor == pytest.approx(1.0) and slow.factor == pytest.approx(3.0)
    assert fast.base_seconds == pytest.approx(0.002)
    assert slow.random_mean == pytest.approx(0.0005)
    assert fit.timing.step_seconds == pytest.approx(0.002)
    assert fit.timing.allreduce_seconds == pytest.approx(0.001)  # the slowest worker's wait
    assert fit.timing.push_seconds == pytest.approx(0.001 - 1e-4)
    assert fit.timing.loop_seconds == pytest.approx(0.0004)
    assert fit.step_period == pytest.approx(0.0004 + 0.006 + 0.0005 + 0.001)
    assert fit.delays().extra == pytest.approx((0.0, 0.004))


def test_the_fit_takes_the_median_over_epochs_so_one_loaded_epoch_does_not_move_it():
    epochs = [_sync_epoch(2), _sync_epoch(3), _sync_epoch(4, base=0.02), _sync_epoch(5)]
    assert fit_epochs(epochs, lock_step=True).workers[1].factor == pytest.approx(3.0)


def test_an_async_run_gives_the_push_from_the_least_waiting_worker():
    times = _times([0.002, 0.006], [0.002, 0.006], [0.0015, 0.003])
    fit = fit_epochs([EpochTimes(e, 0.01 * STEPS, STEPS, times) for e in (2, 3)],
                     lock_step=False, apply_seconds=0.0005)
    assert fit.timing.push_seconds == pytest.approx(0.001)
    assert fit.timing.allreduce_seconds == pytest.approx(0.0015)
    # Async DiLoCo with 8 local steps: a worker waits for its round's push at one step in
    # 8, so a mean wait of 0.07 ms a step is an exchange of 0.56 ms (a run on this machine:
    # plain async waited 0.24 ms a push, async DiLoCo H = 8 0.07 ms a step; until stop 58 the
    # fit took 0.07 ms for the exchange, and the link it fitted was 8 times too fast).
    rounds = _times([0.001, 0.001], [0.001, 0.001], [0.00007, 0.00009])
    fit = fit_epochs([EpochTimes(e, 0.002 * STEPS, STEPS, rounds) for e in (2, 3)],
                     lock_step=False, local_steps=8, apply_seconds=0.00006)
    assert fit.timing.push_seconds == pytest.approx(0.0005)
    assert fit.timing.allreduce_seconds == pytest.approx(0.00056)


def test_an_async_worker_that_took_no_batch_of_an_epoch_is_fitted_from_its_other_epochs():
    """An async worker can take no batch of an epoch (its push crossing a slow link while a
    worker beside the server used the epoch up). Its zeros say nothing of its speed: the fit
    takes its other epochs, or, seen in none, the other workers' figures; it used to refuse
    the run ("a worker's median compute per step is 0")."""
    both = _times([0.002, 0.006], [0.002, 0.006], [0.0015, 0.003])
    idle = RankStepTimes(steps=(STEPS, 0), samples=(STEPS * 32, 0), compute_p50=(0.002, 0.0),
                         compute_p90=(0.002, 0.0), compute_mean=(0.002, 0.0),
                         wait_p50=(0.0015, 0.0), wait_p90=(0.0015, 0.0))
    fit = fit_epochs([EpochTimes(2, 0.01 * STEPS, STEPS, both),
                      EpochTimes(3, 0.01 * STEPS, STEPS, idle),
                      EpochTimes(4, 0.01 * STEPS, STEPS, idle)], lock_step=False)
    assert fit.workers[1].base_seconds == pytest.approx(0.006)  # epoch 2's, not the zeros
    alone = fit_epochs([EpochTimes(3, 0.01 * STEPS, STEPS, idle)], lock_step=False)
    assert alone.workers[1].base_seconds == pytest.approx(0.002)  # as worker 0 computes
    assert alone.workers[1].factor == pytest.approx(1.0)


def test_the_replayed_delays_reproduce_the_fit_and_are_deterministic():
    delays = FittedDelays((0.0, 0.004), (0.0005, 0.001))
    draws = [delays.delay(1, 2, step, 0.002, seed=7) for step in range(20_000)]
    assert sum(draws) / len(draws) == pytest.approx(0.004 + 0.001, rel=0.03)
    assert min(draws) >= 0.004
    assert delays.delay(1, 2, 5, 0.002, seed=7) == delays.delay(1, 2, 5, 0.002, seed=7)
    assert delays.delay(1, 2, 5, 0.002, seed=7) != delays.delay(1, 2, 5, 0.002, seed=8)
    # a factor stretches in proportion to the work, as a slower device does
    assert delays.delay(1, 2, 5, 0.002, 7, work=0.5) == pytest.approx(
        delays.delay(1, 2, 5, 0.002, 7) - 0.002)


def test_delay_fit_keeps_the_median_and_the_mean():
    assert delay_fit(0.003, 0.005) == pytest.approx((0.003, 0.002))
    assert delay_fit(0.003, 0.002) == pytest.approx((0.003, 0.0))  # no negative delay


def test_the_first_epoch_is_left_out_with_enough_epochs_and_its_warmup_measured():
    epochs = [_sync_epoch(e) for e in range(1, 5)]
    first, rest = split_warmup(epochs)
    assert first.epoch == 1 and [e.epoch for e in rest] == [2, 3, 4]
    slow_first = EpochTimes(1, first.seconds + 0.5, STEPS, first.times)
    assert fit_epochs(rest, True, first=slow_first).warmup_seconds == pytest.approx(0.5)
    assert split_warmup(epochs[:2])[0] is None  # two epochs: both are fitted


def test_a_single_runs_speed_starts_with_the_runs_first_epoch_and_draws_the_others():
    first = _sync_epoch(1, loop=0.0204)  # 20 ms a step slower: its warm-up
    later = [_sync_epoch(2), _sync_epoch(3, loop=0.0104)]  # the second 10 ms a step slower
    period = later[0].seconds / STEPS
    one = first.seconds / STEPS / period
    slower = later[1].seconds / STEPS / period
    assert run_speeds(first, later, period, 1, 0, draws=5) == pytest.approx([one] * 5)
    two = run_speeds(first, later, period, 2, 0, draws=400)
    assert sorted({round(x, 9) for x in two}) == pytest.approx([(one + 1) / 2,
                                                                (one + slower) / 2])
    assert list(run_speeds(first, later, period, 3, 5)) == list(run_speeds(first, later,
                                                                           period, 3, 5))
    long = run_speeds(None, later, period, 10_000, 0, draws=1)  # every epoch drawn
    assert long[0] == pytest.approx((1 + slower) / 2, rel=0.02)


def test_one_runs_range_is_the_middle_95_percent_of_the_single_runs():
    p = Prediction("sync", True, [1.0], singles=list(np.linspace(0, 10, 1001)))
    assert p.run_range() == pytest.approx((0.25, 9.75))


# --- the log ------------------------------------------------------------------------------------
def _header(workers=2, **run):
    config = config_from_train_args(["--epochs", "3"], {}).to_dict()
    config["run"].update(run)
    return {"type": "header", "config": config, "num_workers": workers, "model": "mlp",
            "steps_per_epoch": STEPS}


def _write_log(folder, epochs=3, step_times=True, test_acc=0.9, workers=2, model="mlp"):
    folder.mkdir(exist_ok=True)
    lines = [{**_header(workers), "model": model}]
    for e in range(1, epochs + 1):
        line = {"type": "epoch", "epoch": e, "step": e * STEPS, "wall_seconds": 0.2 * e,
                "train_seconds": 0.2 * e, "test_acc": test_acc}
        if step_times:
            line["step_times"] = _sync_epoch(e).times.as_record()
        lines.append(line)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return folder


def test_read_run_gives_each_epochs_training_seconds_and_the_curve(tmp_path):
    run = read_run(_write_log(tmp_path / "r"))
    assert [e.seconds for e in run.epochs] == pytest.approx([0.2, 0.2, 0.2])
    assert [e.steps for e in run.epochs] == [STEPS] * 3
    assert run.epochs[0].times.compute_p50 == (0.002, 0.006)
    assert run.best_accuracy() == 0.9 and run.num_workers == 2


@pytest.mark.parametrize("make,words", [
    (lambda p: p.mkdir(), "has no metrics.jsonl; give the --run-dir"),
    (lambda p: _write_log(p, step_times=False), "train it again with this hvdtrain"),
    (lambda p: _write_log(p, test_acc=None), "never evaluated"),
    (lambda p: _write_log(p, workers=1), "is a run of 1 worker: it exchanged nothing"),
    # hvdtrain.fit's run: the config names the default mlp, the header the model it trained
    (lambda p: _write_log(p, model="CharLM"), "trained CharLM, which its config does not name "
                                              r"\(--model mlp\): a run of hvdtrain.fit"),
])
def test_a_run_that_cannot_answer_gets_a_message_that_says_what_to_do(tmp_path, make, words):
    make(tmp_path / "r")
    with pytest.raises(ConfigError, match=words) as e:
        read_run(tmp_path / "r")
    assert str(e.value).startswith("--from-run: ")


def _append(text):
    def make(folder):
        with open(_write_log(folder) / "metrics.jsonl", "a") as f:
            f.write(text)
    return make


@pytest.mark.parametrize("make,words", [
    (_append('{"type": "epoch", "x": ' + "[" * 100000 + "]" * 100000 + "}\n"),
     "line 5: nested more than 32 deep, not a line hvdtrain writes"),
    (_append('["not", "a", "line"]\n{"type": "epoch"}\n'),
     "line 5: not a JSON object with a 'type'"),
    (lambda p: (p.mkdir(), (p / "metrics.jsonl").write_bytes(b"\x80\x00" * 50)),
     "is not a text file"),
    # an empty log said "cannot be read (StopIteration: )"
    (lambda p: (p.mkdir(), (p / "metrics.jsonl").write_text("")), "has no header line"),
])
def test_a_log_that_is_not_one_is_a_one_line_config_error(tmp_path, make, words):
    make(tmp_path / "r")
    with pytest.raises(ConfigError, match=words) as e:
        read_run(tmp_path / "r")
    assert str(e.value).startswith("--from-run: ") and "\n" not in str(e.value)


def test_a_run_that_failed_or_was_killed_is_told_from_one_that_finished(tmp_path):
    """A crashed run was answered for as if it had finished, without a word."""
    assert read_run(_write_log(tmp_path / "done")).cut_short == ""
    failed = _append('{"type": "stop", "reason": "failed: RuntimeError: boom"}\n')
    failed(tmp_path / "failed")
    assert read_run(tmp_path / "failed").cut_short == \
        "the run ended in failure (failed: RuntimeError: boom)"
    _write_log(tmp_path / "killed", epochs=2)  # of --epochs 3, and no stop line
    assert "ends after epoch 2 of 3 with no stop line" in read_run(tmp_path / "killed").cut_short
    _append('{"type": "stop", "reason": "reached test_acc >= 0.9"}\n')(tmp_path / "target")
    assert read_run(tmp_path / "target").cut_short == ""


def test_a_killed_runs_cut_last_line_is_named_and_its_whole_lines_read(tmp_path, capsys):
    _append('{"type": "epoch", "epoch": 4, "st')(tmp_path / "r")
    assert len(read_run(tmp_path / "r").epochs) == 3
    assert capsys.readouterr().err == (
        f"hvdtrain compare: warning: the last line of {tmp_path / 'r' / 'metrics.jsonl'} "
        "(line 5) is cut short, as a run killed while writing it leaves it; using the 4 whole "
        "line(s) before it\n")


# --- the replay's pieces ------------------------------------------------------------------------
def test_the_train_args_rebuild_the_runs_config():
    flags = ["--model", "cnn", "--channels", "8,16", "--lr", "0.01", "--batch-size", "16",
             "--eval-every-steps", "5", "--warmup-epochs", "0", "--dataset-args", "",
             "--threads", "2"]
    config = config_from_train_args(flags, {}).to_dict()
    rebuilt = config_from_train_args(train_args_from_config(config), {}).to_dict()
    for section in ("data", "model", "optim"):
        assert rebuilt[section] == config[section]
    assert rebuilt["run"]["eval_every_steps"] == 5 and rebuilt["run"]["batch_size"] == 16
    assert rebuilt["run"]["threads"] == 2
    longer = config_from_train_args(train_args_from_config(config, epochs=7), {})
    assert longer.run.epochs == 7


def test_the_runs_own_mode_is_named_as_modes_names_it():
    from hvdtrain.rules.registry import FAMILIES

    every = modes(list(FAMILIES), [2], [1], [4])
    assert {"sync", "local4", "diloco4", "async", "ssp2", "backup1", "async-slr",
            "dcasgd"} <= {m.name for m in every}
    for mode in every:
        config = config_from_train_args(mode.train_flags(), {}).to_dict()
        assert mode_of_run(config) == mode, mode.name
    odd = config_from_train_args(["--local-steps", "4", "--outer-lr", "0.3",
                                  "--outer-momentum", "0.5"], {}).to_dict()
    assert mode_of_run(odd).name == "diloco4" and mode_of_run(odd).outer_lr == 0.3
    # async DiLoCo with unweighted rounds (--no-round-staleness-weight, as every run before
    # stop 59): still async DiLoCo of its H, not plain async
    unweighted = config_from_train_args(
        ["--mode", "async", "--local-steps", "4", "--outer-lr", "0.7",
         "--no-round-staleness-weight"], {}).to_dict()
    mode = mode_of_run(unweighted)
    assert (mode.name, mode.local_steps, mode.outer_lr, mode.round_staleness_weight) == \
        ("adiloco4-unweighted", 4, 0.7, False)
    del unweighted["ps"]["round_staleness_weight"]  # a log from before the option
    assert mode_of_run(unweighted) == mode
    # compare --outer-momentum 0.5 (the links plan's): both DiLoCo modes keep their names
    for mode in modes(["diloco", "adiloco"], [2], [1], [8], (0.7, 0.5)):
        config = config_from_train_args(mode.train_flags(), {}).to_dict()
        assert mode_of_run(config) == mode, mode.name


def _prediction(name, times, own=False):
    return Prediction(name, own, list(times))


def test_the_recommendation_names_a_winner_only_when_its_interval_is_clear():
    fast = _prediction("backup1", [1.0, 1.1, 1.05])
    slow = _prediction("sync", [2.0, 2.1, 2.2])
    assert recommend([slow, fast]).startswith("backup1: its interval is clear")
    close = _prediction("async", [1.05, 1.12, 1.0])
    assert recommend([slow, fast, close]).startswith("no clear winner")
    missed = _prediction("local4", [0.5, None, 0.6])  # not every seed reached: not a winner
    assert recommend([slow, fast, missed]).startswith("backup1")
    # a replay that missed the run's own time settles nothing, however clear its intervals
    assert recommend([slow, fast], checked=False).startswith(
        "not settled: backup1 was fastest in the replay")


def test_a_check_outside_says_the_bounds_to_four_figures():
    """0.3377 s against an interval from 0.3424 read as 'OUTSIDE' beside '0.35 (0.34-0.35)'."""
    from hvdtrain.compare.from_run_replay import _verdict

    own = _prediction("sync", [0.3424, 0.35, 0.3531])
    told = _verdict(own, 0.3377, ok=False)
    assert "reached the target at 0.3377 s of training; OUTSIDE the prediction (the interval " \
           "0.34" in told
    assert _verdict(own, 0.35, ok=True).endswith("at 0.35 s of training; inside the prediction")


def test_the_check_passes_inside_the_interval_or_the_range_of_single_runs():
    p = Prediction("sync", True, [1.0, 1.4, 1.2], singles=[0.9, 1.0, 1.2, 1.4, 1.5])
    assert overlaps(p, 1.45) and overlaps(p, 0.95) and not overlaps(p, 1.6)
    assert not overlaps(p, None)
    assert not overlaps(_prediction("sync", [None]), 1.0)


def test_each_answer_gets_its_own_folder_never_inside_the_run(tmp_path):
    run = read_run(_write_log(tmp_path / "r"))
    first, second = output_folder(tmp_path / "out", run), output_folder(tmp_path / "out", run)
    assert first != second and first.is_dir() and second.is_dir()
    with pytest.raises(ConfigError, match="inside the run's folder"):
        output_folder(tmp_path / "r", run)
    assert sorted(p.name for p in (tmp_path / "out" / "from-run").iterdir()) == ["r", "r-2"]


def test_the_replay_finds_the_runs_relative_model_file_from_any_folder(tmp_path, monkeypatch):
    from hvdtrain.user_code import resolve_callable
    launch, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    launch.mkdir(), elsewhere.mkdir()
    (launch / "own_net.py").write_text("def build(input_shape, num_classes):\n    return 7\n")
    log = _write_log(launch / "run")
    lines = (log / "metrics.jsonl").read_text().splitlines()
    header = {**json.loads(lines[0]), "folder": str(launch)}
    (log / "metrics.jsonl").write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    monkeypatch.chdir(elsewhere)
    run = read_run(log)
    with pytest.raises(ConfigError, match="no such file"):
        resolve_callable("own_net.py:build", "--model")
    with in_launch_folder(run):
        assert resolve_callable("own_net.py:build", "--model")((8,), 10) == 7
    assert elsewhere.samefile(".")
    with in_launch_folder(read_run(_write_log(tmp_path / "old"))):  # no folder in its header
        assert elsewhere.samefile(".")


def test_an_async_workers_longer_wait_is_its_own_fixed_delay():
    times = _times([0.002, 0.006], [0.002, 0.006], [0.001, 0.004])
    epochs = [EpochTimes(e, 0.01 * STEPS, STEPS, times) for e in (2, 3)]
    async_fit = fit_epochs(epochs, lock_step=False, own_waits=True)
    assert async_fit.delays().fixed == pytest.approx((0.0, 0.003))
    assert async_fit.delays().delay(1, 2, 0, 0.0, 0) == pytest.approx(0.004 + 0.003)
    # a sync run's waits are for the others: no worker's own
    assert fit_epochs(epochs, lock_step=True, own_waits=True).delays().fixed == (0.0, 0.0)


def test_an_async_run_whose_workers_reach_the_server_unevenly_is_said_to():
    from hvdtrain.compare.from_run_replay import UNEVEN_PATHS, uneven_paths

    def fit(waits, local_steps=4):
        times = _times([0.001, 0.001], [0.001, 0.001], waits)
        return fit_epochs([EpochTimes(e, 0.01 * STEPS, STEPS, times) for e in (2, 3)],
                          lock_step=False, local_steps=local_steps, own_waits=True)

    # The lab's placement at 25 Mbit/s, async DiLoCo H = 4: worker 0 across the link waited
    # 11.2 ms a step, worker 1 beside the server 0.62 ms
    said = uneven_paths(fit([0.0112, 0.00062]), 4)
    assert "worker 0 waited 44.80 ms an exchange, worker 1 2.48 ms" in said
    assert "--sim-link-mbit" in said and "ring would cross the slowest" in said
    # a same-host run: the servers' queue, not a path, makes the waits differ a little
    assert uneven_paths(fit([0.00024, 0.00066], 1), 1) == ""
    assert uneven_paths(fit([0.001, 0.001 * UNEVEN_PATHS]), 4) == ""


# --- the flag -----------------------------------------------------------------------------------
def _options(tmp_path, *flags):
    from hvdtrain.cli import build_parser
    from hvdtrain.compare import command

    return command.validate(build_parser().parse_args(
        ["compare", "--out", str(tmp_path / "out"), *flags]))


def test_from_run_replays_one_mode_of_each_family_unless_modes_says(tmp_path):
    from hvdtrain.rules.registry import FAMILIES

    run = _write_log(tmp_path / "r")
    cfg = _options(tmp_path, "--from-run", str(run))
    assert cfg.modes.split(",") == list(FAMILIES)
    assert len(cfg.planned_modes()) == len(FAMILIES) and cfg.planned_modes()[0].name == "sync"
    assert _options(tmp_path, "--from-run", str(run), "--modes", "sync,async").modes == \
        "sync,async"


@pytest.mark.parametrize("flags,words", [
    (["--from-run", "no-such-folder"], "is not a folder"),
    (["--from-run", "{run}", "--simulate"], "drop --simulate"),
    # the run fixes these: --workers 8 was answered for the run's 2, without a word
    (["--from-run", "{run}", "--workers", "8", "--stragglers", "3x"],
     "--stragglers, --workers: --from-run answers for the run as it ran"),
])
def test_from_run_flag_errors_say_what_to_do(tmp_path, flags, words):
    run = _write_log(tmp_path / "r")
    with pytest.raises(ConfigError, match=words):
        _options(tmp_path, *[f.format(run=run) for f in flags])
