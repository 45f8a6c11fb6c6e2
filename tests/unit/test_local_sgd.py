"""--local-steps (local SGD in sync mode): the options it refuses, and when LocalSGDSync averages,
checked in one process against a stand-in for Horovod that records each collective.
tests/multiproc/test_local_sgd_multiproc.py checks the arithmetic across real ranks."""

import pytest
import torch

from hvdtrain.cli import build_parser, config_from_args, main
from hvdtrain.config import Config, ConfigError
from hvdtrain.replica import Replica


def cli_config(*flags: str) -> Config:
    return config_from_args(build_parser().parse_args(["train", *flags]))


def test_the_flag_sets_local_steps_and_defaults_to_1():
    assert cli_config().sync.local_steps == 1
    assert cli_config("--local-steps", "4").sync.local_steps == 4


@pytest.mark.parametrize("flags, message", [
    (["--local-steps", "0"], "--local-steps: invalid value 0; use 1"),
    (["--local-steps", "-2"], "--local-steps: invalid value -2; use 1"),
    # async DiLoCo (tests/unit/test_async_diloco.py): every push pulls
    (["--mode", "async", "--local-steps", "4", "--pull-every", "2"],
     "--pull-every: invalid value 2; with --local-steps 4 every push"),
    (["--local-steps", "4", "--elastic", "--run-dir", "r"],
     "--local-steps 4 does not work with --elastic"),
    (["--local-steps", "4", "--reduce-op", "adasum"], "drop --reduce-op adasum"),
    (["--local-steps", "2", "--sync-batchnorm"], "drop --sync-batchnorm"),
    (["--local-steps", "2", "--compression", "fp16"], "--compression fp16 compresses gradients, "
     "which --local-steps 2 never sends: its rounds travel in --wire-dtype; use --wire-dtype fp16"),
])
def test_a_combination_without_meaning_is_refused(flags, message):
    with pytest.raises(ConfigError, match=message.replace("-", r"\-")):
        cli_config(*flags)


@pytest.mark.parametrize("flags", [
    ["--elastic", "--run-dir", "r"], ["--reduce-op", "adasum"], ["--sync-batchnorm"],
    ["--compression", "fp16"], ["--mode", "async"],
])
def test_the_same_options_pass_with_one_local_step(flags):
    cli_config("--local-steps", "1", *flags)


@pytest.mark.parametrize("flags, message", [
    (["--local-steps", "0"], "hvdtrain: error: --local-steps: invalid value 0"),
    (["--mode", "async", "--local-steps", "3", "--dc-lambda", "0.04"],
     "delay compensation corrects one stale gradient"),
])
def test_the_command_line_exits_2_before_training(monkeypatch, capsys, flags, message):
    from hvdtrain import cli

    monkeypatch.setattr(cli, "train", lambda *a, **k: pytest.fail("bad input reached training"))
    assert main(["train", *flags]) == 2
    assert message in capsys.readouterr().err


# --- when the scheme averages -----------------------------------------------------------------
class RecordingHorovod:
    """Horovod's calls that HorovodPort makes, for one rank that is alone: every collective
    leaves its tensors as they are and is recorded by name."""

    Average = "average"

    def __init__(self):
        self.names: list[str] = []

    def allreduce_async_(self, tensor, op, name):
        assert op == self.Average
        self.names.append(name)
        return name

    def synchronize(self, handle):
        return None

    def allgather(self, tensor, name):
        return tensor

    def allgather_object(self, obj, name=None):
        return [obj]

    def take(self) -> list[str]:
        names, self.names = self.names, []
        return names


def local_sgd_scheme(local_steps: int, optimizer: str = "adam", lr: float = 0.01, **options):
    """A LocalSGDSync on a small model with a recording stand-in for Horovod; ``options`` are
    further Config overrides (DiLoCo's outer_lr, outer_momentum)."""
    from hvdtrain.sync.horovod_port import HorovodPort
    from hvdtrain.sync.local_rounds_scheme import LocalSGDSync

    cfg = Config.from_overrides({"local_steps": local_steps, "optimizer": optimizer,
                                 "lr": lr, **options}).validate()
    hvd = RecordingHorovod()
    scheme = LocalSGDSync(cfg, runtime=None, port=HorovodPort(hvd))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.BatchNorm1d(6),
                                torch.nn.Linear(6, 3))
    scheme.attach(Replica(model, torch.device("cpu")))
    return scheme, hvd


def take_steps(scheme, n: int) -> None:
    for _ in range(n):
        scheme.step(torch.randn(8, 4), torch.randint(0, 3, (8,)), lr=0.01)


def kinds(names: list[str]) -> set[str]:
    return {name.split(".")[2] for name in names}  # hvdtrain.local_sgd.<kind>.<tensor>


def test_every_h_steps_the_parameters_and_float_buffers_are_averaged():
    scheme, hvd = local_sgd_scheme(local_steps=4)
    assert type(scheme.optimizer) is torch.optim.Adam  # the worker's own, no Horovod wrapper
    take_steps(scheme, 3)
    assert hvd.take() == []  # no collective inside a round
    take_steps(scheme, 1)
    model = scheme.replica.model
    expected = [f"hvdtrain.local_sgd.param.{n}" for n, _ in model.named_parameters()] + \
               [f"hvdtrain.local_sgd.buffer.{n}" for n in ("1.running_mean", "1.running_var")]
    assert hvd.take() == expected  # num_batches_tracked, an integer, is equal on every rank


def test_reading_the_model_ends_a_round_early_and_only_once():
    scheme, hvd = local_sgd_scheme(local_steps=4)
    take_steps(scheme, 2)
    scheme.eval_replica()
    assert kinds(hvd.take()) == {"param", "buffer"}  # an evaluation: the model, not the state
    scheme.eval_replica()
    assert hvd.take() == []  # nothing moved since
    take_steps(scheme, 1)
    scheme.state_dict()
    names = hvd.take()
    assert kinds(names) == {"param", "buffer", "optim"}  # a checkpoint: the optimizer state too
    assert {n.rsplit(".", 1)[1] for n in names if ".optim." in n} == {"exp_avg", "exp_avg_sq"}
    scheme.epoch_done(None)
    assert hvd.take() == []  # the checkpoint has averaged everything already


def test_each_epoch_line_counts_its_rounds_and_close_sums_them():
    scheme, hvd = local_sgd_scheme(local_steps=4, optimizer="sgd")
    take_steps(scheme, 10)  # rounds after steps 4 and 8; the epoch's last 2 steps are apart
    assert scheme.take_epoch_metrics() == {"averaging_rounds": 3}  # counting its closing round
    scheme.epoch_done(None)  # ...which happens here, when nothing evaluated the epoch
    assert "hvdtrain.local_sgd.optim.0.momentum_buffer" in hvd.take()
    take_steps(scheme, 4)
    scheme.eval_replica()  # the round just ended: nothing left to average
    assert scheme.take_epoch_metrics() == {"averaging_rounds": 1}
    scheme.epoch_done(None)
    assert kinds(hvd.take()) == {"param", "buffer", "optim"}  # the state, once per epoch
    assert scheme.close() == {"local_steps": 4, "averaging_rounds": 4}


def test_end_of_training_shares_a_short_last_round():
    scheme, hvd = local_sgd_scheme(local_steps=4)
    take_steps(scheme, 5)
    hvd.take()
    assert scheme.end_of_training() is False
    assert kinds(hvd.take()) == {"param", "buffer", "optim"}


class GatheringHorovod(RecordingHorovod):
    """One rank's object collectives as well: a gather and a broadcast of one rank are the
    object itself."""

    def allgather_object(self, obj, name=None):
        self.names.append(name)
        return [obj]

    def broadcast_object(self, obj, root_rank=0, name=None):
        return obj

    def size(self):
        return 1

    def rank(self):
        return 0


def test_a_checkpoint_inside_an_epoch_averages_nothing_and_keeps_the_round():
    from hvdtrain.scheme import Progress
    scheme, _ = local_sgd_scheme(local_steps=4, optimizer="sgd")
    scheme.port.hvd = hvd = GatheringHorovod()
    take_steps(scheme, 6)  # one round after step 4, two steps into the next
    scheme.step_done(Progress(epoch=0, step=6, global_step=6))
    hvd.take()
    before = {k: v.clone() for k, v in scheme.replica.model.state_dict().items()}
    assert scheme.end_of_training() is False  # a stop at a step: the round goes on
    state = scheme.state_dict()
    names = hvd.take()
    assert names[0] == "hvdtrain.local_sgd.ranks" and kinds(names[1:]) == {"checkpoint"}
    assert state["local_round"]["steps"] == 2 and state["local_round"]["rounds"] == 1
    [own] = state["local_round"]["ranks"]
    for k, v in scheme.replica.model.state_dict().items():
        assert torch.equal(v, before[k]) and torch.equal(own["model"][k], v), k
    # at an epoch's end (the trainer's progress at step 0) the checkpoint averages, as before
    scheme.step_done(Progress(epoch=1, step=0, global_step=12))
    assert "local_round" not in scheme.state_dict()
    assert kinds(hvd.take()) == {"param", "buffer", "names", "optim"}  # names: the state held


def test_a_diloco_checkpoint_inside_a_round_holds_the_model_its_evaluations_score():
    """A --stop-at target reached at an evaluation inside a DiLoCo round saved the ranks'
    average of their inner steps, not the model that was scored and reached the target."""
    from hvdtrain.scheme import Progress
    scheme, _ = local_sgd_scheme(local_steps=4, optimizer="sgd", outer_lr=0.7,
                                 outer_momentum=0.9)
    scheme.port.hvd = GatheringHorovod()
    take_steps(scheme, 6)  # one round after step 4, two steps into the next
    scheme.step_done(Progress(epoch=0, step=6, global_step=6))
    live, scored = scheme.rounds.model_to_score()
    names = [name for name, _ in scheme.replica.model.named_parameters()]
    state = scheme.state_dict()
    for name, agreed in zip(names, scored):
        assert torch.equal(state["model"][name], agreed), name
    assert not torch.equal(state["model"][names[0]], live[0])  # not the inner steps' weights
    [own] = state["local_round"]["ranks"]  # each rank's own weights still resume the round
    assert torch.equal(own["model"][names[0]], live[0])
