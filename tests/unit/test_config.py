"""Tier 1: options, validation messages, config files, and the CLI's exit codes."""

import pytest

from hvdtrain.cli import build_parser, config_from_args, main
from hvdtrain.config import Config, ConfigError, load_config_file


def parse(*argv):
    return config_from_args(build_parser().parse_args(["train", *argv]))


def test_defaults_are_valid_and_flags_override():
    cfg = parse("--lr", "0.1", "--hidden", "64,32", "--batch-size", "16", "--no-progress")
    assert cfg.optim.lr == 0.1
    assert cfg.model.hidden == (64, 32)
    assert cfg.run.batch_size == 16
    assert cfg.run.progress is False
    assert Config().validate().run.mode == "sync"


@pytest.mark.parametrize("argv, flag, hint", [
    (["--lr", "-0.1"], "--lr", "positive learning rate"),
    (["--lr", "nan"], "--lr", "positive learning rate"),
    (["--batch-size", "0"], "--batch-size", "positive per-worker batch"),
    (["--epochs", "0"], "--epochs", "at least one epoch"),
    (["--momentum", "1.5"], "--momentum", "[0, 1)"),
    (["--test-fraction", "1"], "--test-fraction", "between 0 and 1"),
    (["--batch-size", "30", "--backward-passes-per-step", "4"], "--backward-passes-per-step",
     "30 % 4 = 2"),
    (["--dataset", "mnist"], "--data-path", "train-images-idx3-ubyte"),
    (["--hidden", "64,0"], "--hidden", "positive layer widths"),
    (["--batch-size", "many"], "--batch-size", "cannot read 'many'"),
    (["--staleness", "-1"], "--staleness", "0 (lock-step)"),
    (["--num-servers", "0"], "--num-servers", "at least 1 server"),
    (["--stages", "0"], "--stages", "1 (no split)"),
    (["--straggler", "slow"], "--straggler", "such as 3x"),
    (["--timeout-s", "-5"], "--timeout-s", "wait forever"),
    (["--checkpoint-steps", "-1"], "--checkpoint-steps", "positive number of steps"),
    (["--auto-resume"], "--auto-resume", "pass --run-dir"),
    (["--elastic"], "--elastic", "needs --run-dir"),
    (["--auto-resume", "--resume", "r"], "--auto-resume", "pass --run-dir"),
    # Adasum combines inside its optimizer step: no combined gradient to clip or unscale
    (["--reduce-op", "adasum", "--clip-grad-norm", "1"], "--clip-grad-norm", "no combined"),
    (["--reduce-op", "adasum", "--precision", "fp16"], "--precision", "--reduce-op average"),
    # elastic runs on Gloo, which has no Adasum: tracebacks at the first step
    (["--reduce-op", "adasum", "--elastic", "--run-dir", "r"], "--reduce-op", "no Adasum"),
])
def test_invalid_values_name_the_flag_and_the_fix(argv, flag, hint):
    with pytest.raises(ConfigError) as err:
        parse(*argv)
    assert str(err.value).startswith(flag)
    assert hint in str(err.value)


def test_cli_exit_code_2_for_bad_values_and_unknown_flags(capsys):
    assert main(["train", "--lr", "-1"]) == 2
    assert "--lr: invalid value -1.0" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--learning-rate", "0.1"])
    assert exit_info.value.code == 2
    assert "unrecognized arguments: --learning-rate" in capsys.readouterr().err


def test_toml_and_yaml_files_and_flags_win(tmp_path):
    toml = tmp_path / "run.toml"
    toml.write_text('[optim]\nlr = 0.2\noptimizer = "adam"\n[run]\nepochs = 3\n'
                    'batch-size = 8\n[model]\nhidden = [32, 16]\n')
    cfg = parse("--config", str(toml), "--epochs", "5")
    assert (cfg.optim.lr, cfg.optim.optimizer, cfg.run.batch_size) == (0.2, "adam", 8)
    assert cfg.model.hidden == (32, 16)
    assert cfg.run.epochs == 5  # the flag overrides the file
    yaml = tmp_path / "run.yaml"
    yaml.write_text("lr: 0.3\nsynthetic_shape: 1x4x4\n")
    cfg = parse("--config", str(yaml), "--dataset", "synthetic")
    assert cfg.optim.lr == 0.3 and cfg.data.synthetic_shape == (1, 4, 4)
    # a file's option that this run does not read is left for the runs that do (its flag is
    # refused: test_bad_input.py)
    assert parse("--config", str(yaml)).data.synthetic_shape == (1024,)
    with pytest.raises(ConfigError, match="--synthetic-shape: it shapes --dataset synthetic"):
        parse("--config", str(yaml), "--synthetic-shape", "8")


@pytest.mark.parametrize("name, text", [
    ("both.toml", "epochs = 1\n[sync]\nfusion_threshold_mb = 32\ncompression = 'fp16'\n"
                  "[ps]\nstaleness = 2\ndc_lambda = 0.04\nchunk_mb = 2.0\n"),
    ("both.yaml", "epochs: 1\nsync:\n  fusion_threshold_mb: 32\n  compression: fp16\nps:\n"
                  "  staleness: 2\n  dc_lambda: 0.04\n  chunk_mb: 2.0\n")])
def test_one_file_holds_both_modes_options_each_read_under_its_mode(tmp_path, name, text):
    """A [ps] section was refused in a sync run, as if the user had given --staleness."""
    path = tmp_path / name
    path.write_text(text)
    sync = parse("--config", str(path))
    assert (sync.run.mode, sync.ps.staleness, sync.ps.dc_lambda) == ("sync", float("inf"), 0.0)
    assert sync.ps.chunk_mb == 1.0 and sync.sync.fusion_threshold_mb == 32  # each its mode's
    assert sync.sync.compression == "fp16"
    asynchronous = parse("--config", str(path), "--mode", "async")
    assert (asynchronous.ps.staleness, asynchronous.ps.dc_lambda) == (2.0, 0.04)
    assert asynchronous.ps.chunk_mb == 2.0 and asynchronous.sync.fusion_threshold_mb == 64
    assert asynchronous.sync.compression == "none"  # sync's allreduce: the server has none
    with pytest.raises(ConfigError, match="--compression: .*take --wire-dtype fp16"):
        parse("--config", str(path), "--mode", "async", "--compression", "fp16")
    with pytest.raises(ConfigError, match="--staleness: an option of the parameter server"):
        parse("--config", str(path), "--staleness", "0")  # given on the command line


@pytest.mark.parametrize("line, flags", [
    ("[ps]\nbsp = true\nbackup_workers = 1", ["--backup-workers", "1"]),
    ("[ps]\nwire_dtype = 'bf16'", ["--wire-dtype", "bf16"]),
    ("[sync]\nouter_momentum = 0.5", ["--outer-momentum", "0.5"]),
    ("[pipeline]\nmicro_batches = 4\nschedule = '1f1b'", ["--micro-batches", "4"]),
    ("early_stop_patience = 3", ["--early-stop-patience", "3"]),
    ("model_args = {width = 3}", ["--model-args", '{"width": 3}']),
    ("data_path = '/tmp'", ["--data-path", "/tmp"]),
    ("hidden = [8]\nchannels = [4]", ["--channels", "4"]),
    ("[ps]\nshared_memory = false", None),
    ("[sync]\nreduce_op = 'adasum'\ncycle_time_ms = 5", ["--mode", "async", "--reduce-op",
                                                          "adasum"])])
def test_a_file_keeps_options_that_this_run_does_not_read_and_flags_are_refused(tmp_path, line,
                                                                                flags):
    """Each was refused from a file in a sync run (with a flag the user never typed), though
    the file may serve the runs that read it."""
    path = tmp_path / "shared.toml"
    path.write_text("epochs = 1\n" + line + "\n")
    mode = ["--mode", "async"] if flags and "--mode" in flags else []
    parse("--config", str(path), *mode)  # left for the runs that read it
    if flags:
        with pytest.raises(ConfigError, match=f"^{flags[-2]}"):
            parse(*flags)


def test_config_files_merge_in_order_and_a_bad_value_names_its_file(tmp_path):
    first, second = tmp_path / "first.yaml", tmp_path / "second.toml"
    first.write_text("epochs: 1\nlr: 0.01\n")
    second.write_text("seed = 3\nlr = 0.02\n")
    cfg = parse("--config", str(first), "--config", str(second))  # the first was dropped
    assert (cfg.run.epochs, cfg.run.seed, cfg.optim.lr) == (1, 3, 0.02)
    second.write_text("epochs = 'two'\n")
    with pytest.raises(ConfigError, match=r"second\.toml: --epochs: cannot read 'two'"):
        parse("--config", str(second))
    second.write_text("lr = true\n")  # trained at lr 1
    with pytest.raises(ConfigError, match=r"--lr: cannot read True \(a boolean, not a number"):
        parse("--config", str(second))
    with pytest.raises(ConfigError, match="--chunk-mb: it tunes the parameter server's"):
        parse("--chunk-mb", "4")
    with pytest.raises(ConfigError, match="--fusion-threshold-mb: an option of Horovod's"):
        parse("--mode", "async", "--fusion-threshold-mb", "1")


def test_an_option_given_twice_in_a_file_is_refused_and_a_near_name_is_suggested(tmp_path):
    twice = tmp_path / "twice.toml"  # the section's 0.2 had won in silence
    twice.write_text("lr = 0.1\n[optim]\nlr = 0.2\n")
    with pytest.raises(ConfigError, match=r"twice\.toml: lr is given at the top level and again "
                                          r"under \[optim\]; keep one of them"):
        load_config_file(str(twice))
    inside = tmp_path / "inside.yaml"  # YAML kept the last of a mapping's keys, TOML refused
    inside.write_text("optim:\n  lr: 0.1\n  lr: 0.2\n")
    with pytest.raises(ConfigError, match=r"inside\.yaml: the key 'lr' is given twice in one "
                                          r"mapping \(line 3\); keep one"):
        load_config_file(str(inside))
    section = tmp_path / "section.toml"
    section.write_text("[optm]\nlr = 0.2\n")
    with pytest.raises(ConfigError, match=r"unknown option\(s\) optm; optm: did you mean "
                                          r"\[optim\]\?"):
        load_config_file(str(section))
    typo = tmp_path / "typo.yaml"
    typo.write_text("epochz: 2\n")
    with pytest.raises(ConfigError, match="epochz: did you mean epochs?"):
        load_config_file(str(typo))


def test_config_file_errors(tmp_path):
    bad_key = tmp_path / "bad.toml"
    bad_key.write_text("[optim]\nlearning_rate = 0.1\n")
    with pytest.raises(ConfigError, match="unknown option.*learning_rate"):
        load_config_file(str(bad_key))
    broken = tmp_path / "broken.toml"
    broken.write_text("lr = = 0.1\n")
    with pytest.raises(ConfigError, match="cannot parse"):
        load_config_file(str(broken))
    with pytest.raises(ConfigError, match="not found"):
        load_config_file(str(tmp_path / "missing.toml"))
    bad_choice = tmp_path / "choice.toml"
    bad_choice.write_text('optimizer = "lamb"\n')
    with pytest.raises(ConfigError, match="choose one of sgd, adam, adamw"):
        parse("--config", str(bad_choice))
