"""A misspelled name gets the nearest real ones (a command's flags, fit()'s options, a tracker
that is a flag of its own), under the usage of the command it was given to; the last line of a
run reads as English."""

from types import SimpleNamespace

import pytest
import torch

import hvdtrain
from hvdtrain import cli, requeue
from hvdtrain.cli import main, report, throughput_summary
from hvdtrain.config import Config, ConfigError
from hvdtrain.config.values import near_names
from hvdtrain.train_flags import parse_train_flags

TOP_USAGE = "usage: hvdtrain [-h] [--version] COMMAND ..."


def test_near_names_spells_out_initials_and_sets_dashes_aside():
    options = ["lr", "lr_schedule", "batch_size", "epochs", "weight_decay"]
    assert near_names("learning_rate", options) == ["lr"]  # difflib alone finds nothing
    assert near_names("bs", options) == ["batch_size"]
    assert near_names("epoch", options) == ["epochs"]
    assert near_names("--learning-rate", ["--lr", "--epochs"]) == ["--lr"]
    assert near_names("--weight_decay", ["--weight-decay"]) == ["--weight-decay"]
    assert near_names("staleness", options) == []
    assert near_names("--ep", ["--help", "--epochs"])[0] == "--epochs"  # cut short; was --help


@pytest.fixture
def nothing_runs(monkeypatch):
    """A command line that gets past its flags must not train, compare or launch anything."""
    def refuse(*args, **kwargs):
        pytest.fail("a bad flag got past the parser")
    monkeypatch.setattr(cli, "train", refuse)
    monkeypatch.setattr(cli, "_other_command", refuse)
    monkeypatch.setattr(requeue, "main", refuse)
    monkeypatch.setattr(requeue, "StopRelay", lambda: None)  # no signal handlers in pytest
    monkeypatch.setattr("hvdtrain.doctor.doctor_cli.main", refuse)


@pytest.mark.parametrize("argv, hint", [
    (["train", "--epoch", "2"], "unrecognized arguments: --epoch 2; --epoch: did you mean "
                                "--epochs?"),
    (["train", "--lr-schedual", "cosine"], "--lr-schedual: did you mean --lr-schedule"),
    (["train", "--learning-rate=0.1", "--epoch", "3"],
     "--learning-rate: did you mean --lr?; --epoch: did you mean --epochs?"),
    (["compare", "--epoch", "2"], "--epoch: did you mean --epochs?"),
    (["compare", "--worker", "2"], "--worker: did you mean --workers"),
    (["doctor", "--expct", "a:4"], "--expct: did you mean --expect?"),
    (["run", "--epoch", "2"], "unrecognized arguments: --epoch"),  # run has no near flag
])
def test_a_misspelled_flag_gets_its_commands_usage_and_the_nearest_flags(argv, hint, capsys,
                                                                        nothing_runs):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: hvdtrain {argv[0]} [-h]")  # the command's, not the top one
    assert TOP_USAGE not in err
    assert f"hvdtrain {argv[0]}: error: " in err and hint in err


def test_every_command_refuses_its_own_unknown_flags():
    """Each command `hvdtrain --help` lists, through the parser the docs come from too."""
    parser = cli.build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    assert set(commands) >= {"train", "compare", "run", "doctor"}
    for name, command in commands.items():
        assert isinstance(command, cli.CommandParser), name


def test_a_flag_before_the_command_keeps_the_top_level_usage(capsys, nothing_runs):
    with pytest.raises(SystemExit) as exit_info:
        main(["--bogus", "train"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.startswith(TOP_USAGE)


def test_train_args_of_compare_suggest_the_nearest_flag():
    with pytest.raises(ConfigError, match=r"--train-args: unknown flag\(s\) --epoch 3; --epoch: "
                                          r"did you mean --epochs\?; see hvdtrain train --help"):
        parse_train_flags(["--epoch", "3"], "--train-args")


def test_fit_suggests_the_option_a_misspelled_keyword_meant():
    data = (torch.randn(8, 2), torch.randint(0, 2, (8,)))
    with pytest.raises(ConfigError) as e:
        hvdtrain.fit(torch.nn.Linear(2, 2), data, epochs=1, learning_rate=0.1)
    assert str(e.value).startswith("unknown option 'learning_rate' (did you mean lr?); valid "
                                   "options are: ")
    with pytest.raises(ConfigError, match=r"^unknown option 'zzz'; valid options are: "):
        Config.from_overrides({"zzz": 1})  # nothing near: no suggestion


def test_tracker_tensorboard_points_to_the_tensorboard_flag():
    with pytest.raises(ConfigError) as e:
        Config.from_overrides({"tracker": "tensorboard"}).validate()
    message = str(e.value)
    assert message.startswith("--tracker: unknown tracker 'tensorboard'; use mlflow, wandb")
    assert "for TensorBoard pass --tensorboard instead (tensorboard=True in fit())" in message
    with pytest.raises(ConfigError) as e:
        Config.from_overrides({"tracker": "neptune"}).validate()
    assert "--tensorboard" not in str(e.value)


@pytest.mark.parametrize("epochs, said", [(1, "after 1 epoch;"), (3, "after 3 epochs;")])
def test_the_done_line_counts_epochs_in_english(epochs, said, tmp_path, capsys):
    final = SimpleNamespace(epoch=epochs, test_acc=0.5, test_loss=0.7, train_loss=0.6,
                            throughput={})
    trainer = SimpleNamespace(is_main=True, history=[final], run_dir=tmp_path,
                              stopping=SimpleNamespace(verdict=SimpleNamespace(target=None)),
                              checkpointer=SimpleNamespace(path=tmp_path / "checkpoint.pt"))
    report(trainer)
    assert f"done: test accuracy 0.5000 {said} log " in capsys.readouterr().out


def test_one_epochs_throughput_is_not_called_an_average_over_epochs():
    def epoch(tflops):
        return SimpleNamespace(throughput={"tflops": tflops})
    assert throughput_summary([epoch(2.0)]) == ", 2 TFLOP/s over the epoch"
    assert throughput_summary([epoch(1.0), epoch(2.0)]) == (", 1.5 TFLOP/s on average over "
                                                            "the epochs")


def test_run_without_a_launcher_says_the_launcher_comes_first(capsys):
    with pytest.raises(SystemExit) as ended:
        main(["run", "-np", "2", "hvdtrain", "train"])
    assert ended.value.code == 2
    assert "unrecognized arguments: -np; the launcher comes first and -np is its flag, e.g. " \
           "hvdtrain run mpirun -np ..." in capsys.readouterr().err
