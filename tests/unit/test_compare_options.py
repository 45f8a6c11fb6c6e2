"""compare's options are one documented dataclass (compare/options.py): a flag per field, the
plan's values for what is left unset, checks on construction."""

from dataclasses import fields

import pytest

from hvdtrain.cli import build_parser
from hvdtrain.compare import command
from hvdtrain.compare.options import PLANS, CompareConfig
from hvdtrain.config import ConfigError


def options(tmp_path, *flags) -> CompareConfig:
    return command.validate(build_parser().parse_args(
        ["compare", "--out", str(tmp_path / "out"), *flags]))


def test_every_option_is_documented_and_has_its_flag(tmp_path):
    help = build_parser()._subparsers._group_actions[0].choices["compare"].format_help()
    for f in fields(CompareConfig):
        assert len(f.metadata["help"]) > 20, f.name
        assert "--" + f.name.replace("_", "-") in help, f.name


def test_the_plan_fills_what_the_flags_leave_unset(tmp_path):
    cfg = options(tmp_path, "--plan", "full", "--seeds", "2", "--workers", "3")
    assert cfg.seeds == 2 and cfg.workers == 3
    assert cfg.modes == PLANS["full"]["modes"] and cfg.epochs == PLANS["full"]["epochs"]
    assert [m.name for m in cfg.planned_modes()][:2] == ["sync", "local4"]


def test_the_plans_model_flags_stay_with_its_model(tmp_path):
    """--model mlp under the demo plan ran every run with the CNN's --channels 256,512, which
    the MLP ignores, and the report listed them as the runs' extra flags."""
    assert options(tmp_path).train_args == "--channels 256,512"  # the plan's own CNN
    assert options(tmp_path, "--model", "mlp").train_args == ""
    assert options(tmp_path, "--model", "mlp", "--train-args", "--hidden 64").train_args == \
        "--hidden 64"


def _outer_step(mode) -> tuple[str, str]:
    flags = mode.train_flags()
    return (flags[flags.index("--outer-lr") + 1], flags[flags.index("--outer-momentum") + 1])


def test_the_diloco_modes_take_the_plans_outer_step(tmp_path):
    paper = options(tmp_path, "--modes", "sync,local,diloco,adiloco", "--local-steps", "8")
    steps = {m.name: m for m in paper.planned_modes()}
    assert _outer_step(steps["diloco8"]) == _outer_step(steps["adiloco8"]) == ("0.7", "0.9")
    assert "--outer-lr" not in steps["local8"].train_flags() + steps["sync"].train_flags()
    given = options(tmp_path, "--modes", "diloco,adiloco", "--local-steps", "8",
                    "--outer-lr", "0.5", "--outer-momentum", "0.3")
    assert {_outer_step(m) for m in given.planned_modes()} == {("0.5", "0.3")}
    # the lab's runs are a few rounds long: the paper's 0.9 would outlast them; and its outer
    # rate is the one the lab measured faster (comparison.md)
    lab = options(tmp_path, "--plan", "links")
    assert {_outer_step(m) for m in lab.planned_modes() if m.outer_lr} == {("0.5", "0.5")}
    assert "learning rate 0.5 and Nesterov momentum 0.5" in command._describe(lab)
    mine = options(tmp_path, "--plan", "links", "--outer-lr", "0.7")  # the command line wins
    assert {_outer_step(m) for m in mine.planned_modes() if m.outer_lr} == {("0.7", "0.5")}
    for flag, bad, fix in [("--outer-lr", "0", "use a rate above 0"),
                           ("--outer-lr", "nan", "use a rate above 0"),
                           ("--outer-momentum", "1", "below 1"),
                           ("--outer-momentum", "-0.1", "below 1")]:
        with pytest.raises(ConfigError, match=f"{flag}: invalid value .*{fix}"):
            options(tmp_path, "--modes", "diloco", flag, bad)
    with pytest.raises(ConfigError, match="--outer-momentum"):  # the plan's flag, not the run's
        options(tmp_path, "--modes", "diloco", "--train-args", "--outer-momentum 0.5")


def test_sim_allreduce_ms_is_checked_and_sets_the_simulated_allreduce(tmp_path):
    for bad in ("nan", "inf", "-1"):
        with pytest.raises(ConfigError, match="--sim-allreduce-ms, .* use 0 or more "
                                              "milliseconds"):
            options(tmp_path, "--simulate", "--sim-allreduce-ms", bad)
    assert options(tmp_path, "--simulate").sim_seconds("allreduce") == 0.0  # an ideal network
    cfg = options(tmp_path, "--simulate", "--sim-allreduce-ms", "50", "--sim-step-ms", "10",
                  "--sim-apply-ms", "1")
    timing = command._simulation_timing(cfg, [])  # all figures given: nothing is measured
    assert timing.allreduce_seconds == pytest.approx(0.05)
    assert timing.step_seconds == pytest.approx(0.01)
    assert timing.apply_seconds == pytest.approx(0.001)
    assert timing.sample_seconds is None  # the step grows in proportion to its samples


def test_sim_sample_ms_is_a_part_of_a_given_step(tmp_path):
    with pytest.raises(ConfigError, match="--sim-sample-ms is a part of --sim-step-ms"):
        options(tmp_path, "--simulate", "--sim-sample-ms", "0.01")
    cfg = options(tmp_path, "--simulate", "--sim-step-ms", "0.6", "--sim-sample-ms", "0.005",
                  "--sim-apply-ms", "0.05")
    timing = command._simulation_timing(cfg, [])
    assert timing.sample_seconds == pytest.approx(5e-6)
    assert timing.compute_seconds(16, 32) == pytest.approx(0.00052)  # 0.44 ms fixed + 16 x 5 us
    assert "balanced" in [m.name for m in options(tmp_path, "--simulate", "--modes",
                                                  "sync,balanced").planned_modes()]


@pytest.mark.parametrize("modes, flags", [
    ("adiloco", ["--outer-momentum-every", "8"]),
    ("adiloco", ["--dynamic-local-steps"]),
    ("diloco,adiloco", ["--wire-dtype", "fp16"]),
])
def test_a_simulated_plan_reads_flags_that_suit_only_its_modes(tmp_path, modes, flags):
    # Train flags that plain sync refuses, given to a plan without plain sync: the simulated
    # plan's global batch, budget, sweep and measured step used to read them under sync's
    # Config, so the plan failed before its first run (stop 59); real runs took them.
    import shlex

    cfg = options(tmp_path, "--simulate", "--modes", modes, "--local-steps", "4",
                  "--global-batch", "64", "--sim-step-ms", "1", "--sim-apply-ms", "0.1",
                  f"--train-args={shlex.join(flags)}")
    args = ["--dataset", "digits", "--model", "mlp", *flags]
    assert command._reading_mode(cfg, args).name == modes.split(",")[0] + "4"
    assert command._reading_mode(cfg, ["--dataset", "digits"]).name == "sync"
    scaled = command._simulated_args(cfg, args)
    assert scaled[-4:-2] == ["--batch-size", "32"]
    command._simulation_timing(cfg, scaled)
    from hvdtrain.compare.budget import sync_budget
    assert sync_budget(scaled, 2, command._reading_mode(cfg, args)).global_batch == 64


@pytest.mark.parametrize("flags, message", [
    (["--workers", "2", "--faults", "kill:rank=2,step=4"],
     r"--faults: rank 2 is not a training process: each run has --workers 2 \(ranks 0\.\.1\)"),
    (["--simulate", "--faults", "kill:rank=1,step=4"], "inject no faults; drop --faults"),
])
def test_faults_are_checked_before_any_run_and_refused_where_nothing_injects_them(
        tmp_path, flags, message):
    with pytest.raises(ConfigError, match=message):
        options(tmp_path, *flags)


def test_faults_with_from_run_are_refused(tmp_path):
    (tmp_path / "run").mkdir()
    with pytest.raises(ConfigError, match="--from-run inject no faults"):
        options(tmp_path, "--from-run", str(tmp_path / "run"), "--faults", "kill:rank=1,step=4")


def test_train_args_are_checked_under_each_planned_mode_and_name_the_modes_they_do_not_suit(
        tmp_path):
    # A 16-bit wire suits the server's modes and DiLoCo (fp16 under Horovod), not plain sync
    # (its compression is --compression fp16), so a plan of only those modes takes it ...
    cfg = options(tmp_path, "--modes", "async,adiloco,diloco", "--local-steps", "4",
                  "--train-args", "--wire-dtype fp16")
    assert [m.name for m in cfg.planned_modes()] == ["async", "adiloco4", "diloco4"]
    # ... bf16 too, for the server's modes alone (Horovod has no bfloat16 allreduce) ...
    with pytest.raises(ConfigError, match=r"under mode diloco4: --wire-dtype bf16 with "
                                          r"--local-steps: Horovod .*leave diloco4 out"):
        options(tmp_path, "--modes", "adiloco,diloco", "--local-steps", "4",
                "--train-args", "--wire-dtype bf16")
    # ... and a plan with sync in it is refused before any run, naming sync alone.
    with pytest.raises(ConfigError, match=r"--train-args under mode sync: .*--wire-dtype.*; or "
                                          r"leave sync out of --modes$"):
        options(tmp_path, "--modes", "sync,adiloco", "--local-steps", "4",
                "--train-args", "--wire-dtype bf16")
    # A flag wrong under every mode is one message, as before.
    with pytest.raises(ConfigError, match=r"^--train-args: --lr: invalid value -1.0"):
        options(tmp_path, "--modes", "sync,async", "--train-args", "--lr -1")
    # a server's option is no sync run's; the plan sets the mode, so "add --mode async" is no
    # fix (and a lone flag after --train-args is its value, not "expected one argument")
    with pytest.raises(ConfigError, match=r"^--train-args under mode sync: --eval-pauses-workers: "
                                          r"an option of the parameter server, which this mode "
                                          r"has not: drop it; or leave sync out of --modes$"):
        options(tmp_path, "--modes", "sync,async", "--train-args", "--eval-pauses-workers")
    # compare's own --tracker reaches every run, so the runs read a --tracker-project
    options(tmp_path, "--tracker", "mlflow", "--train-args", "--tracker-project mine")
    with pytest.raises(ConfigError, match=r"^--train-args: --tracker-project: .*no tracker"):
        options(tmp_path, "--train-args", "--tracker-project mine")


def test_backup_workers_are_checked_only_where_the_plan_has_the_backup_mode(tmp_path):
    # the default --backup-workers 1 refused a 1-worker plan that had no backup mode
    one = options(tmp_path, "--simulate", "--workers", "1", "--modes", "sync,async")
    assert [m.name for m in one.planned_modes()] == ["sync", "async"]
    with pytest.raises(ConfigError, match=r"--modes backup: a backup worker is one of 2 or more "
                                          r"workers; raise --workers \(now 1\) or drop backup"):
        options(tmp_path, "--simulate", "--workers", "1", "--modes", "sync,backup")
    with pytest.raises(ConfigError, match="--backup-workers: each number must be 0 to 2"):
        options(tmp_path, "--simulate", "--workers", "3", "--modes", "backup",
                "--backup-workers", "3")


def test_flags_only_simulated_runs_or_another_plan_read_are_refused_where_nothing_reads_them(
        tmp_path):
    """--global-batch 64 on a real plan ran at --batch-size x --workers without a word."""
    for flags, words in ((["--global-batch", "64"], "--global-batch: read only by simulated "
                                                    "runs"),
                         (["--sim-push-ms", "3"], "--sim-push-ms: read only by simulated runs"),
                         (["--sweep-seeds", "3"], "--sweep-seeds: read only by --sweep-workers"),
                         (["--link-mbit", "50"], "--link-mbit: read only by --plan links"),
                         (["--simulate", "--sim-step-ms", "0"], "--sim-step-ms: a step takes "
                                                                "time")):
        with pytest.raises(ConfigError, match=words):
            options(tmp_path, *flags)
    assert options(tmp_path, "--simulate", "--global-batch", "64").global_batch == 64
    assert options(tmp_path, "--sweep-workers", "2,4", "--sweep-seeds", "3").sweep_seeds == 3


def test_each_transports_tuning_goes_to_the_modes_that_read_it_alone(tmp_path):
    """A sync run refuses the server's --chunk-mb, and an async one Horovod's
    --fusion-threshold-mb: a plan of both passes each to its own modes' runs."""
    from hvdtrain.compare.plan import for_mode, plan

    tuning = "--chunk-mb 4 --fusion-threshold-mb=8 --no-shared-memory --cycle-time-ms 2 --lr 0.1"
    cfg = options(tmp_path, "--modes", "sync,async", "--train-args", tuning)
    sync, asynchronous = cfg.planned_modes()
    runs = plan([sync, asynchronous], [0], ["none"], 2, tuning.split())
    assert list(runs[0].train_args) == ["--fusion-threshold-mb=8", "--cycle-time-ms", "2",
                                        "--lr", "0.1"]
    assert list(runs[1].train_args) == ["--chunk-mb", "4", "--no-shared-memory", "--lr", "0.1"]
    assert for_mode(["--shared-memory", "--epochs", "2"], sync) == ["--epochs", "2"]
