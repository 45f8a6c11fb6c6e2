"""``hvdtrain compare``: the plan, the figures read from logs, the report (in-process; the real
comparisons that run hvdtrain are in tests/multiproc/test_compare_multiproc.py)."""

import os

import numpy as np
import pytest

from hvdtrain.compare.plan import Mode, modes, plan
from hvdtrain.compare.report import ceiling, finding, summarize
from hvdtrain.compare.stats import bootstrap_ci, ratio_ci, separated
from hvdtrain.compare.results import RunResult, time_to_target
from hvdtrain.stragglers import StragglerModel, parse_straggler


def test_plan_covers_every_condition_mode_and_seed():
    ms = modes(["sync", "async", "ssp"], [0, 4])
    assert [m.name for m in ms] == ["sync", "async", "ssp0", "ssp4"]
    runs = plan(ms, [0, 1], ["none", "3x"], workers=2, train_args=["--epochs", "5"])
    assert len(runs) == 2 * 4 * 2
    assert len({r.name for r in runs}) == len(runs)
    sync = next(r for r in runs if r.name == "sync-seed1-straggler3x")
    assert sync.processes == 2 and sync.straggler == "3x"
    ssp = next(r for r in runs if r.name == "ssp4-seed0")
    assert ssp.processes == 3  # two workers and the server
    cmd = ssp.command("python", "out/ssp4-seed0", cores=2)
    assert cmd[:4] == ["mpirun", "-np", "3", "--oversubscribe"]
    assert cmd[cmd.index("--staleness") + 1] == "4" and "--straggler" not in cmd
    assert Mode("async").train_flags() == ["--mode", "async", "--eval-pauses-workers",
                                              "--staleness", "inf"]
    assert "--oversubscribe" not in sync.command("python", "d", cores=2)
    # every core taken, by 2 or 3 processes: both yield while they wait, so both are timed alike
    for run, cores in [(ssp, 2), (sync, 2)]:
        cmd = run.command("python", "d", cores=cores)
        assert cmd[cmd.index("--mca") + 1:cmd.index("--mca") + 3] == ["mpi_yield_when_idle", "1"]
    assert "--mca" not in sync.command("python", "d", cores=16)
    with pytest.raises(ValueError, match="unknown mode 'hogwild'"):
        modes(["hogwild"], [])


def test_every_remedy_is_a_mode_with_its_train_flags():
    ms = {m.name: m for m in modes(["sync", "local", "backup", "async-slr", "dcasgd"], [],
                                   backups=[1, 2], local_steps=[8])}
    assert list(ms) == ["sync", "local8", "backup1", "backup2", "async-slr", "dcasgd"]
    assert ms["local8"].train_flags() == ["--mode", "sync", "--local-steps", "8"]
    assert not ms["local8"].is_async and ms["backup1"].is_async
    assert ms["backup2"].train_flags() == ["--mode", "async", "--eval-pauses-workers", "--bsp",
                                          "--backup-workers", "2"]
    assert "--staleness-lr" in ms["async-slr"].train_flags()
    assert "--dc-lambda" in ms["dcasgd"].train_flags()
    with pytest.raises(ValueError, match="--backup-workers"):
        modes(["backup"], [], backups=[])


def test_straggler_spec():
    assert parse_straggler("3x") == StragglerModel("last", factor=3.0)
    assert parse_straggler("50ms") == StragglerModel("last", seconds=0.05)
    assert parse_straggler("none") == StragglerModel()
    for bad in ["0.5x", "fast", "-3ms", "3"]:
        with pytest.raises(ValueError):
            parse_straggler(bad)


def _result(name, mode, straggler, seed, times, status="ok"):
    curve = [{"step": 10 * (i + 1), "wall_seconds": t, "train_loss": 1.0 / (i + 1),
              "test_acc": acc} for i, (t, acc) in enumerate(times)]
    return RunResult(name, mode, straggler, seed, status, "" if status == "ok" else "boom",
                     curve[-1]["test_acc"] if curve else None,
                     time_to_target(curve, 0.9), 1000.0, 0.0 if mode == "sync" else 1.5,
                     curve[-1]["wall_seconds"] if curve else None, curve,
                     {} if mode == "sync" else {0: 5, 3: 5})


def test_time_to_target_is_the_first_evaluation_at_or_above_it():
    curve = [{"wall_seconds": 1.0, "test_acc": 0.5}, {"wall_seconds": 2.0, "test_acc": None},
             {"wall_seconds": 3.0, "test_acc": 0.9}, {"wall_seconds": 4.0, "test_acc": 0.95}]
    assert time_to_target(curve, 0.9) == 3.0
    assert time_to_target(curve, 0.99) is None


def test_finding_states_what_was_measured():
    results = [
        _result("sync-0", "sync", "3x", 0, [(2.0, 0.8), (4.0, 0.95)]),
        _result("sync-1", "sync", "3x", 1, [(2.2, 0.8), (4.4, 0.95)]),
        _result("sync-2", "sync", "3x", 2, [(2.1, 0.8), (4.2, 0.95)]),
        _result("async-0", "async", "3x", 0, [(1.0, 0.92)]),
        _result("async-1", "async", "3x", 1, [(1.2, 0.93)]),
        _result("async-2", "async", "3x", 2, [(1.1, 0.93)]),
        _result("ssp-0", "ssp2", "3x", 0, [], status="failed"),
    ]
    summary = summarize(results)
    assert summary[("3x", "sync")]["time_ci"][0] == pytest.approx(4.2)
    assert summary[("3x", "ssp2")]["failed"]
    text = finding(summary, "3x", 0.9)
    # sync 4.0 to 4.4 s, async 1.0 to 1.2 s: the bootstrap intervals lie within the ranges
    mean, low, high = summary[("3x", "async")]["time_ci"]
    assert mean == pytest.approx(1.1) and 1.0 <= low < mean < high <= 1.2
    # 1.1 s against 4.2 s, and the ratio's interval from the resampled means of both
    ratio, low, high = summary[("3x", "async")]["time_vs_sync"]
    assert ratio == pytest.approx(1.1 / 4.2) and 1.0 / 4.4 <= low < ratio < high <= 1.2 / 4.0
    assert "**async beats sync**: it needs 0.26 [" in text
    # the failed mode and sync itself have no ratio of times to speak of, a mode whose runs
    # did not all reach the target neither
    assert summary[("3x", "ssp2")]["time_vs_sync"] is None
    assert summary[("3x", "sync")]["time_vs_sync"] is None  # the table says 1
    assert "Not every run of ssp2" in text
    slower = [_result(f"{mode}-{seed}", mode, "none", seed, [(time, 0.95)])
              for mode, times in (("sync", (1.0, 1.1, 1.05)), ("async", (3.0, 3.3, 3.15)))
              for seed, time in enumerate(times)]
    assert "**sync is fastest**; async took 3.00x as long" in finding(summarize(slower), "none", 0.9)
    # two runs a mode: their interval would be only their range, and nothing is settled
    two = [r for r in slower if r.seed < 2]
    assert "fewer than 3 runs of a mode reached the target, too few for an interval (pass " \
           "--seeds 5 or more)" in finding(summarize(two), "none", 0.9)


def test_a_winner_is_named_only_when_the_intervals_separate():
    overlapping = [_result("sync-0", "sync", "3x", 0, [(2.0, 0.95)]),
                   _result("sync-1", "sync", "3x", 1, [(4.0, 0.95)]),
                   _result("async-0", "async", "3x", 0, [(1.5, 0.95)]),
                   _result("async-1", "async", "3x", 1, [(3.5, 0.95)])]
    text = finding(summarize(overlapping), "3x", 0.9)
    assert "beats sync" not in text.replace("whether it beats sync is not settled", "")
    assert "**whether it beats sync is not settled**" in text
    # One run per mode: far apart, yet one run has no interval, so nothing is settled.
    # Two modes not told apart: the finding says what set them close, from the measures
    close = [_result("sync-0", "sync", "3x", 0, [(9.0, 0.95)]),
             _result("sync-1", "sync", "3x", 1, [(9.5, 0.95)]),
             _result("sync-2", "sync", "3x", 2, [(9.25, 0.95)])]
    for seed, (quick, slow) in enumerate([(2.0, 2.5), (2.6, 2.3), (2.3, 2.4)]):
        close += [_result(f"fast-{seed}", "fast", "3x", seed, [(quick, 0.95)]),
                  _result(f"frugal-{seed}", "frugal", "3x", seed, [(slow, 0.95)])]
        close[-2].samples_per_sec = 1500.0  # fast trains 1.5x frugal's samples per second
    apart = [*close[:3], _result("fast-0", "fast", "3x", 0, [(2.0, 0.95)]),
             _result("fast-1", "fast", "3x", 1, [(2.2, 0.95)]),
             _result("fast-2", "fast", "3x", 2, [(2.1, 0.95)]),
             _result("frugal-0", "frugal", "3x", 0, [(3.0, 0.95)]),
             _result("frugal-1", "frugal", "3x", 1, [(3.2, 0.95)]),
             _result("frugal-2", "frugal", "3x", 2, [(3.1, 0.95)])]
    assert ("**fast beats frugal** too: it needs 0.68 [0.64, 0.71] of its time, and the intervals"
            " separate.") in finding(summarize(apart), "3x", 0.9)
    text = finding(summarize(close), "3x", 0.9)
    # fast: 2.3 s at 1500 samples/s; frugal: 2.4 s at 1000
    assert ("fast and frugal are not told apart (their intervals overlap): it trained 1.50x "
            "frugal's samples per second and needed 1.44x its samples to reach the target.") in text
    single = [_result("sync-0", "sync", "3x", 0, [(9.0, 0.95)]),
              _result("async-0", "async", "3x", 0, [(1.0, 0.95)])]
    text = finding(summarize(single), "3x", 0.9)
    assert "but fewer than 3 runs of a mode reached the target, too few for an interval (pass " \
        "--seeds 5 or more), so **whether it beats sync is not settled**" in text and \
        "overlap" not in text


def test_the_ratio_interval_is_narrower_than_setting_one_interval_against_the_other():
    rng = np.random.default_rng(2)
    fast, slow = list(rng.normal(14, 1.5, 4)), list(rng.normal(77, 9, 4))
    ratio, low, high = ratio_ci(fast, slow)
    assert ratio == pytest.approx(np.mean(fast) / np.mean(slow)) and low < ratio < high
    (_, fast_low, fast_high), (_, slow_low, slow_high) = bootstrap_ci(fast), bootstrap_ci(slow)
    assert fast_low / slow_high < low and high < fast_high / slow_low
    # more runs, a narrower interval; nothing to divide by, no interval
    wide = high - low
    _, low, high = ratio_ci(list(rng.normal(14, 1.5, 40)), list(rng.normal(77, 9, 40)))
    assert high - low < wide / 2
    assert ratio_ci([], [1.0]) is None and ratio_ci([1.0], []) is None
    assert ratio_ci([1.0], [0.0]) is None


def test_bootstrap_interval_covers_the_mean_and_narrows_with_more_seeds():
    rng = np.random.default_rng(1)
    few, many = rng.normal(10, 1, 5), rng.normal(10, 1, 80)
    m5, lo5, hi5 = bootstrap_ci(list(few))
    m80, lo80, hi80 = bootstrap_ci(list(many))
    assert lo5 < m5 < hi5 and lo80 < m80 < hi80
    assert m5 == pytest.approx(float(few.mean())) and hi80 - lo80 < hi5 - lo5
    # The width of a mean's 95% interval is about 2 x 1.96 standard errors.
    assert hi80 - lo80 == pytest.approx(2 * 1.96 * many.std() / np.sqrt(80), rel=0.15)
    assert bootstrap_ci([]) is None and bootstrap_ci([2.0]) == (2.0, 2.0, 2.0)
    assert separated((1, 0.9, 1.1), (2, 1.9, 2.1)) and not separated((1, 0.9, 1.6), (2, 1.5, 2.1))


def test_ceiling_of_a_persistent_straggler():
    # The figures: 2x for N=2, k=3; 2.5x for N=4, k=3.
    assert ceiling("3x", 2) == pytest.approx(2.0) and ceiling("3x", 4) == pytest.approx(2.5)
    assert ceiling("none", 8) == 1.0
    assert ceiling("50ms", 2) is None and ceiling("3x@0.1", 2) is None


def _write_log(path, *records):
    import json
    path.mkdir(parents=True, exist_ok=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


HEADER = {"type": "header", "steps_per_epoch": 10, "num_workers": 2,
          "config": {"run": {"batch_size": 32}}}


def test_a_run_stopped_at_its_target_is_read_up_to_its_stop_line(tmp_path):
    from hvdtrain.compare.plan import PlannedRun
    from hvdtrain.compare.results import read_result
    run = PlannedRun("sync-seed0", Mode("sync"), 0, "3x", 2)
    # Stopped in its first epoch: no epoch line; the stop line says where training ended.
    _write_log(tmp_path / "sync", HEADER,
               {"type": "eval", "step": 4, "wall_seconds": 1.5, "train_seconds": 1.0,
                "test_acc": 0.9},
               {"type": "eval", "step": 8, "wall_seconds": 3.0, "train_seconds": 2.0,
                "test_acc": 0.96},
               {"type": "stop", "step": 9, "epoch": 1, "wall_seconds": 3.4,
                "train_seconds": 2.4, "reason": "reached the target"})
    result = read_result(run, tmp_path / "sync", {"status": "ok"}, 0.95)
    assert result.status == "ok", result.reason
    assert result.time_to_target == 2.0 and result.final_test_acc == 0.96
    assert result.wall_seconds == 2.4
    assert result.samples_per_sec == pytest.approx(9 * 32 * 2 / 2.4)  # every worker, every step


def test_async_throughput_counts_what_the_servers_received(tmp_path):
    from hvdtrain.compare.plan import PlannedRun
    from hvdtrain.compare.results import read_result
    run = PlannedRun("async-seed0", Mode("async"), 0, "3x", 3)
    # Worker 0 made 10 steps, the straggler 4: the servers got 14 pushes, not 2 x 10.
    _write_log(tmp_path / "async", HEADER,
               {"type": "epoch", "epoch": 1, "step": 10, "wall_seconds": 2.5,
                "train_seconds": 2.0, "test_acc": 0.9},
               {"type": "scheme", "samples": 14 * 32, "staleness_histogram": {"0": 10, "1": 4}})
    result = read_result(run, tmp_path / "async", {"status": "ok"}, 0.95)
    assert result.samples_per_sec == pytest.approx(14 * 32 / 2.0)
    assert result.time_to_target is None and result.mean_staleness == pytest.approx(4 / 14)


# --- how many processes a run may start (issue 24) ----------------------------------------------
def compare_args(tmp_path, *flags):
    from hvdtrain.cli import build_parser

    return build_parser().parse_args(["compare", "--out", str(tmp_path / "out"), *flags])


def refusal(tmp_path, *flags) -> str | None:
    from hvdtrain.compare.command import validate
    from hvdtrain.config import ConfigError

    try:
        validate(compare_args(tmp_path, *flags))
    except ConfigError as e:
        return str(e)
    return None


def test_more_processes_than_the_host_holds_are_refused_before_anything_starts(
        tmp_path, monkeypatch, capsys):
    """compare --workers 100000 launched mpirun -np 100000 --oversubscribe on one host."""
    from hvdtrain.cli import main
    from hvdtrain.compare import runner

    monkeypatch.setattr(os, "cpu_count", lambda: 2)  # room for 4 processes a core: 8

    def launch(run, *args):
        raise AssertionError(f"{run.name} was launched with {run.processes} processes")
    monkeypatch.setattr(runner, "run_one", launch)
    assert main(["compare", "--workers", "100000", "--out", str(tmp_path / "out")]) == 2
    message = capsys.readouterr().err
    assert ("--workers 100000: each run starts 100001 processes (100000 workers and the parameter "
            "server of the async modes), but this host has 2 cores") in message
    assert "use --workers 7 or fewer, run across more hosts with --hostfile, or simulate " \
           "100000 workers in one process with --simulate" in message
    # The demo plan has async modes: 7 workers and a server fit, 8 do not; sync alone takes 8.
    assert refusal(tmp_path, "--workers", "7") is None
    assert "use --workers 7 or fewer" in refusal(tmp_path, "--workers", "8")
    assert refusal(tmp_path, "--workers", "8", "--modes", "sync") is None
    assert "each run starts 9 processes (9 workers)" in refusal(
        tmp_path, "--workers", "9", "--modes", "sync")
    assert refusal(tmp_path, "--workers", "100000", "--simulate") is None  # no process starts


def test_a_hostfile_holds_as_many_processes_as_its_slots(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    hosts = tmp_path / "hosts"
    hosts.write_text("# two nodes\nnode-a slots=4\nnode-b  slots=4 max_slots=8  # the second\n")
    flags = ("--hostfile", str(hosts), "--modes", "sync")
    assert refusal(tmp_path, *flags, "--workers", "8") is None
    assert (f"each run starts 9 processes (9 workers), but the hosts of {hosts} have 8 slots, "
            f"room for 8: use --workers 8 or fewer, add hosts or slots to {hosts}"
            in refusal(tmp_path, *flags, "--workers", "9"))
    oversubscribed = (*flags, "--launcher-args=--oversubscribe")
    assert refusal(tmp_path, *oversubscribed, "--workers", "32") is None
    assert "room for 32" in refusal(tmp_path, *oversubscribed, "--workers", "33")
    # A host without slots= gets as many as it has cores, which cannot be known from here.
    hosts.write_text("node-a\nnode-b slots=4\n")
    assert refusal(tmp_path, *flags, "--workers", "64") is None


def test_a_finished_run_of_another_plan_in_out_is_refused_before_anything_starts(
        tmp_path, monkeypatch, capsys):
    """compare --target X into an --out holding a plan's runs made with --target Y re-ran its
    sync-seed0 over the old one, and left the other plan's runs and plots beside the report."""
    import json
    import sys

    from hvdtrain.cli import main
    from hvdtrain.compare import runner

    launched = []

    def finish(run, out, *args):  # as a run that trained: its status names its command
        run_dir = out / "runs" / run.name
        run_dir.mkdir(parents=True, exist_ok=True)
        status = {"status": "ok", "reason": "", "returncode": 0, "seconds": 1.0,
                  "command": run.command(sys.executable, str(run_dir))}
        (run_dir / runner.STATUS).write_text(json.dumps(status))
        launched.append(run.name)
        return status
    monkeypatch.setattr(runner, "run_one", finish)
    out = tmp_path / "out"
    argv = ["compare", "--modes", "sync", "--seeds", "1", "--stragglers", "none", "--out",
            str(out)]
    main([*argv, "--target", "0.9"])
    assert launched == ["sync-seed0"]
    capsys.readouterr()
    assert main([*argv, "--target", "0.8"]) == 2 and launched == ["sync-seed0"]
    told = capsys.readouterr().err
    assert f"{out / 'runs' / 'sync-seed0'} holds a finished run of another plan (it had " \
           "--stop-at test_acc>=0.9 where this plan has --stop-at test_acc>=0.8)" in told, told
    assert "pass another --out to keep it, or --force to replace the runs" in told
    main([*argv, "--target", "0.8", "--force"])
    assert launched == ["sync-seed0"] * 2


def test_runs_of_a_model_file_edited_since_are_neither_reused_nor_replaced_silently(tmp_path):
    """An edited --model FILE.py left the command as it was, so the finished runs of the old
    model were skipped and reported as the new one's."""
    import json
    import sys

    from hvdtrain.compare import runner
    from hvdtrain.compare.plan import modes, plan
    from hvdtrain.config import ConfigError

    model = tmp_path / "net.py"
    model.write_text("def build(): ...\n")
    [run] = plan(modes(["sync"], bounds=[]), [0], ["none"], 2, ["--model", f"{model}:build"])
    out = tmp_path / "out"
    run_dir = out / "runs" / run.name
    run_dir.mkdir(parents=True)
    command = run.command(sys.executable, str(run_dir))
    (run_dir / "metrics.jsonl").write_text("")
    (run_dir / runner.STATUS).write_text(json.dumps(
        {"status": "ok", "command": command, "user_code": runner.user_code(command)}))
    assert runner.previous_status(run_dir, command) is not None  # as it was: skipped
    runner.check_no_other_plan([run], out)
    model.write_text("def build(): return None\n")
    assert runner.previous_status(run_dir, command) is None
    with pytest.raises(ConfigError, match=f"holds a finished run of {model} as it was before an "
                                          "edit; pass another --out to keep it, or --force"):
        runner.check_no_other_plan([run], out)


def test_every_flag_that_names_user_code_is_hashed(tmp_path):
    from hvdtrain.compare import runner

    files = {name: tmp_path / f"{name}.py" for name in ("net", "ppl", "acc5", "pad", "data")}
    for path in files.values():
        path.write_text("x = 1\n")
    command = ["train", "--model", f"{files['net']}:build",
               "--metrics", f"ppl={files['ppl']}:ppl,top5={files['acc5']}:top5",
               f"--collate={files['pad']}:pad", "--dataset=" + f"{files['data']}:load"]
    before = runner.user_code(command)
    assert sorted(before) == sorted(str(p) for p in files.values())
    files["acc5"].write_text("x = 2\n")
    assert runner.user_code(command) != before
