"""DiLoCo (--local-steps H --outer-lr LR --outer-momentum M): the round rule of
hvdtrain/rules/local_sgd.py against a hand computation, its flags, the scheme's rounds in one
process, and the simulator's use of the same rule. tests/multiproc/test_diloco_multiproc.py
trains it across real ranks."""

import re
from types import SimpleNamespace

import pytest
import torch

from hvdtrain.cli import build_parser, config_from_args
from hvdtrain.compare.sim.simulation import Simulation
from hvdtrain.compare.sim.timing import Timing
from hvdtrain.config import Config, ConfigError
from hvdtrain.replica import Replica
from hvdtrain.rules.local_sgd import OuterNesterov, RoundRule, round_rule
from hvdtrain.rules.registry import DILOCO_OUTER_LR, DILOCO_OUTER_MOMENTUM, Mode, modes

from test_local_sgd import RecordingHorovod, local_sgd_scheme, take_steps


def mean(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.stack(tensors).mean(dim=0)


def diloco_round(rule: RoundRule, workers: list[torch.Tensor]) -> torch.Tensor:
    """A round as the schemes run it: each worker sends, the mean is merged."""
    [new] = rule.merged([mean([rule.sent([w])[0] for w in workers])])
    return new.clone()


# --- the rule -------------------------------------------------------------------------------
def test_the_outer_step_is_nesterov_sgd_on_the_mean_pseudo_gradient():
    start = torch.tensor([1.0, -2.0, 0.5])
    lr, m = 0.7, 0.9
    rule = OuterNesterov([start], lr, m)
    a, b = torch.tensor([0.8, -1.0, 0.5]), torch.tensor([0.6, -2.4, 0.9])
    # By hand: delta = start - mean(local); buf = delta; step = delta + m * buf.
    delta1 = start - (a + b) / 2
    expected1 = start - lr * (delta1 + m * delta1)
    assert torch.allclose(diloco_round(rule, [a, b]), expected1)
    # The next round starts from there; the momentum buffer carries the first delta.
    c, d = expected1 - 0.1, expected1 + torch.tensor([0.3, 0.0, -0.5])
    delta2 = expected1 - (c + d) / 2
    buf2 = m * delta1 + delta2
    expected2 = expected1 - lr * (delta2 + m * buf2)
    assert torch.allclose(diloco_round(rule, [c, d]), expected2)
    assert start.tolist() == [1.0, -2.0, 0.5]  # the caller's tensor is only copied


def test_outer_lr_1_without_momentum_is_plain_averaging():
    torch.manual_seed(0)
    start = torch.randn(5)
    outer, plain = round_rule([start], 1.0, 0.0), round_rule([start], 0.0, 0.0)
    assert type(plain) is RoundRule and type(outer) is OuterNesterov
    for _ in range(3):
        workers = [start + 0.1 * torch.randn(5) for _ in range(3)]
        averaged = diloco_round(plain, [w.clone() for w in workers])
        assert torch.allclose(diloco_round(outer, workers), averaged, atol=1e-6)
        assert torch.allclose(averaged, mean(workers))
        start = averaged


def test_the_gain_is_the_steady_state_multiple_of_the_averaged_progress():
    rule = OuterNesterov([torch.zeros(1)], 0.7, 0.9)
    assert rule.gain == pytest.approx(7.0)
    assert RoundRule.gain == 1.0
    for _ in range(200):  # the same delta every round: the step tends to gain * delta
        before = rule.start[0].clone()
        after = diloco_round(rule, [before - 1.0])
    assert (before - after).item() == pytest.approx(rule.gain, rel=1e-6)


def test_the_state_dict_round_trip_continues_exactly():
    torch.manual_seed(1)
    rule = OuterNesterov([torch.randn(4)], 0.7, 0.9)
    for _ in range(2):
        diloco_round(rule, [rule.start[0] + torch.randn(4) * 0.1 for _ in range(2)])
    state = rule.state_dict()
    restored = OuterNesterov([torch.zeros(4)], 0.7, 0.9)
    restored.load_state_dict(state)
    workers = [rule.start[0] + torch.randn(4) * 0.1 for _ in range(2)]
    assert torch.equal(diloco_round(restored, [w.clone() for w in workers]),
                       diloco_round(rule, workers))
    fresh = OuterNesterov([torch.zeros(4)], 0.7, 0.9)
    fresh.load_state_dict(None)  # a checkpoint of plain local SGD: no momentum yet
    assert fresh.optimizer.state_dict()["state"] == {}


# --- the flags ------------------------------------------------------------------------------
def cli_config(*flags: str) -> Config:
    return config_from_args(build_parser().parse_args(["train", *flags]))


def test_the_flags_set_the_outer_step_and_default_to_plain_local_sgd():
    assert (cli_config().sync.outer_lr, cli_config().sync.outer_momentum) == (0.0, 0.0)
    sync = cli_config("--local-steps", "8", "--outer-lr", "0.7", "--outer-momentum", "0.9").sync
    assert (sync.local_steps, sync.outer_lr, sync.outer_momentum) == (8, 0.7, 0.9)


@pytest.mark.parametrize("flags, message", [
    (["--local-steps", "8", "--outer-lr", "-0.1"], "--outer-lr: invalid value -0.1"),
    (["--local-steps", "8", "--outer-lr", "nan"], "--outer-lr: invalid value nan"),
    (["--local-steps", "8", "--outer-lr", "inf"], "--outer-lr: invalid value inf"),
    (["--local-steps", "8", "--outer-lr", "0.7", "--outer-momentum", "1"],
     "--outer-momentum: invalid value 1.0; use a value in [0, 1)"),
    (["--local-steps", "8", "--outer-lr", "0.7", "--outer-momentum", "-0.5"],
     "--outer-momentum: invalid value -0.5"),
    (["--local-steps", "8", "--outer-momentum", "0.9"], "add --outer-lr"),
    (["--outer-lr", "0.7"], "add --local-steps H with H > 1"),
    (["--mode", "async", "--outer-lr", "0.7"], "add --local-steps H with H > 1"),
])
def test_bad_outer_settings_are_refused_with_the_fix(flags, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        cli_config(*flags)


# --- the scheme, in one process -------------------------------------------------------------
def diloco_scheme(local_steps: int = 4, outer_lr: float = 0.7, outer_momentum: float = 0.9):
    return local_sgd_scheme(local_steps, optimizer="sgd", lr=0.05, outer_lr=outer_lr,
                            outer_momentum=outer_momentum)


def flat(scheme) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in scheme.replica.model.parameters()])


class TwoRanksHorovod(RecordingHorovod):
    """RecordingHorovod that also keeps what each collective sent, and claims 2 ranks."""

    def __init__(self):
        super().__init__()
        self.sent: dict[str, torch.Tensor] = {}

    def allreduce_async_(self, tensor, op, name):
        self.sent[name] = tensor.clone()
        return super().allreduce_async_(tensor, op, name)

    def size(self):
        return 2


def test_a_round_sends_pseudo_gradients_and_steps_from_the_round_start():
    scheme, _ = diloco_scheme()
    scheme.port.hvd = hvd = TwoRanksHorovod()
    start = [p.detach().clone() for p in scheme.replica.model.parameters()]
    take_steps(scheme, 3)
    assert hvd.take() == []
    take_steps(scheme, 1)  # the 4th step ends the round
    model = scheme.replica.model
    names = [n for n, _ in model.named_parameters()]
    assert hvd.take() == [f"hvdtrain.local_sgd.delta.{n}" for n in names] + \
        [f"hvdtrain.local_sgd.buffer.{n}" for n in ("1.running_mean", "1.running_var")]
    # One rank alone: the average is its own delta, and the first outer step (an empty momentum
    # buffer becomes the delta) is start - lr * (1 + m) * delta.
    deltas = [hvd.sent[f"hvdtrain.local_sgd.delta.{name}"] for name in names]
    assert max(d.abs().max() for d in deltas) > 0
    for s, p, delta in zip(start, model.parameters(), deltas):
        assert torch.allclose(p.detach(), s - 0.7 * 1.9 * delta, atol=1e-6)
    # The outer step's gain 0.7 / (1 - 0.9) divides sync's N = 2 (LocalSGDSync.lr_scale).
    assert scheme.lr_scale.workers == 2 and scheme.lr_scale.gain == pytest.approx(7)


def test_reading_the_model_at_an_epochs_end_applies_the_outer_step_over_the_steps_so_far():
    scheme, hvd = diloco_scheme(outer_lr=0.5, outer_momentum=0.0)
    start = flat(scheme).clone()
    take_steps(scheme, 2)
    local = flat(scheme).clone()
    scheme.eval_replica(closing=True)
    assert {n.split(".")[2] for n in hvd.take()} == {"delta", "buffer"}
    # Outer lr 0.5 without momentum: halfway from the start to the local parameters.
    assert torch.allclose(flat(scheme), (start + local) / 2, atol=1e-6)
    scheme.eval_replica(closing=True)
    assert hvd.take() == []  # nothing moved since


def test_the_checkpoint_holds_the_outer_state_and_plain_local_sgd_none():
    scheme, hvd = diloco_scheme()
    take_steps(scheme, 5)
    state = scheme.state_dict()
    outer = state["outer"]
    assert set(outer) == {"start", "optimizer"}
    assert [s.shape for s in outer["start"]] == [p.shape for p in scheme.replica.model.parameters()]
    buffers = [s["momentum_buffer"] for s in outer["optimizer"]["state"].values()]
    assert len(buffers) == len(outer["start"]) and any(b.abs().max() > 0 for b in buffers)
    assert torch.equal(torch.cat([s.reshape(-1) for s in outer["start"]]), flat(scheme))
    plain, _ = diloco_scheme(outer_lr=0.0, outer_momentum=0.0)
    take_steps(plain, 5)
    assert "outer" not in plain.state_dict()  # local SGD's checkpoint, as before


# --- the simulator --------------------------------------------------------------------------
DIGITS = ["--dataset", "digits", "--model", "mlp", "--hidden", "32", "--threads", "1"]


def simulate(mode: Mode, *flags: str, timing: Timing = Timing(step_seconds=1.0)) -> Simulation:
    sim = Simulation(mode, 2, "", 0, [*DIGITS, *flags], 0.9, timing)
    sim.result = sim.run()
    return sim


def test_the_compare_mode_is_named_per_local_steps_and_passes_the_paper_settings():
    [diloco] = modes(["diloco"], [], local_steps=[8])
    assert (diloco.name, diloco.local_steps) == ("diloco8", 8)
    assert (diloco.outer_lr, diloco.outer_momentum) == (DILOCO_OUTER_LR, DILOCO_OUTER_MOMENTUM)
    assert diloco.train_flags() == ["--mode", "sync", "--local-steps", "8", "--outer-lr", "0.7",
                                    "--outer-momentum", "0.9"]
    assert Mode("local8", scheme="sync", local_steps=8).train_flags() == \
        ["--mode", "sync", "--local-steps", "8"]
    assert [m.name for m in modes(["diloco"], [], local_steps=[4, 16])] == ["diloco4", "diloco16"]


def test_a_simulated_diloco_run_learns_and_pays_one_allreduce_per_round():
    # 2 epochs of 10 steps, H = 4: rounds end at steps 4, 8, 10 of each epoch (the epoch's end).
    [diloco] = modes(["diloco"], [], local_steps=[4])
    timing = Timing(step_seconds=0.5, allreduce_seconds=0.25)
    sim = simulate(diloco, "--epochs", "2", "--max-steps-per-epoch", "10", timing=timing)
    assert sim.round_seconds == pytest.approx([4 * 0.5 + 0.25, 4 * 0.5 + 0.25,
                                               2 * 0.5 + 0.25] * 2)
    assert sim.result.status == "ok" and sim.result.final_test_acc > 0.5
    local = simulate(Mode("local4", scheme="sync", local_steps=4), "--epochs", "2",
                     "--max-steps-per-epoch", "10", timing=timing)
    assert not torch.allclose(sim.final_parameters, local.final_parameters, atol=1e-4)


def test_simulated_evaluations_inside_a_round_score_its_start_and_change_nothing():
    # As the real scheme: rounds at steps 4, 8 and the epoch's end (10) whatever the
    # evaluations; one every 2 steps scores the round's start at that moment of the round.
    [diloco] = modes(["diloco"], [], local_steps=[4])
    timing = Timing(step_seconds=0.5, allreduce_seconds=0.25)
    flags = ("--epochs", "1", "--max-steps-per-epoch", "10")
    rare = simulate(diloco, *flags, "--eval-every-steps", "0", timing=timing)
    often = simulate(diloco, *flags, "--eval-every-steps", "2", timing=timing)
    assert often.round_seconds == rare.round_seconds == pytest.approx([2.25, 2.25, 1.25])
    assert torch.equal(often.final_parameters, rare.final_parameters)
    curve = {point["step"]: point for point in often.result.curve}
    assert sorted(curve) == [2, 4, 6, 8, 10]
    # step 2: half a round in, before any round: the start; step 6: 2 steps after the first
    # round, which ended at 2.25 s, and scored what it agreed
    assert curve[2]["wall_seconds"] == pytest.approx(1.0)
    assert curve[6]["wall_seconds"] == pytest.approx(2.25 + 1.0)
    assert curve[6]["test_acc"] == curve[4]["test_acc"]


def test_simulated_diloco_with_outer_lr_1_and_no_momentum_is_local_sgd():
    flags = ("--epochs", "2", "--max-steps-per-epoch", "6")
    outer = simulate(Mode("d", scheme="sync", local_steps=4, outer_lr=1.0), *flags)
    plain = simulate(Mode("local4", scheme="sync", local_steps=4), *flags)
    assert torch.allclose(outer.final_parameters, plain.final_parameters, atol=1e-6)


def test_simulated_diloco_steps_its_workers_at_sync_rate_over_the_gain():
    # One worker, one round of 2 plain SGD steps, outer lr 0.5 without momentum (gain 0.5): the
    # worker steps at lr * 1 / 0.5, and the outer step goes half of the way it moved.
    from hvdtrain.config import DataConfig
    from hvdtrain.data.builtin import load_dataset
    from test_simulate import batch_gradient, digits_model, shards
    from test_simulate import flat as flat_model

    batch, seed, lr = 16, 1, 0.05
    sim = Simulation(Mode("d", scheme="sync", local_steps=2, outer_lr=0.5), 1, "", seed,
                     [*DIGITS, "--batch-size", str(batch), "--epochs", "1",
                      "--max-steps-per-epoch", "2", "--warmup-epochs", "0", "--momentum", "0"],
                     0.9, Timing(step_seconds=1.0))
    sim.run()
    data = load_dataset(DataConfig())
    model = digits_model(seed)
    start = flat_model(model)
    [shard] = shards(1, 0, seed, len(data.x_train))
    for step in range(2):
        grads = batch_gradient(model, data, shard, step, batch)
        with torch.no_grad():
            for p, g in zip(model.parameters(), grads):
                p -= lr / 0.5 * g
    expected = start - 0.5 * (start - flat_model(model))
    assert torch.allclose(sim.final_parameters, expected, atol=1e-6)


def test_an_evaluation_inside_a_round_scores_its_start_and_leaves_training_as_it_was():
    """An early round would be one more outer momentum step and one more exchange: an
    evaluation inside an epoch scores the model agreed at the round's start instead, and the
    run goes on exactly as one that was never evaluated."""
    def trained(evaluations: list[int]):
        scheme, hvd = diloco_scheme(local_steps=4)
        torch.manual_seed(3)  # the same batches for both
        scored = []
        for step in range(1, 11):
            take_steps(scheme, 1)
            if step in evaluations:
                live = flat(scheme).clone()
                replica = scheme.eval_replica()
                weights = []
                replica.replica.evaluate = lambda batches, s=scheme: weights.append(flat(s))
                replica.evaluate([])
                assert torch.equal(flat(scheme), live)  # the live weights are back
                scored.append((weights[0], live, [a.clone() for a in scheme.rule.agreed()]))
        return flat(scheme), hvd.take(), scored

    plain, plain_calls, _ = trained([])
    evaluated, calls, scored = trained([2, 3, 6])
    assert torch.equal(evaluated, plain)
    # the only collectives besides the rounds' own: the BatchNorm statistics, for the scores
    assert [n for n in calls if "eval_buffer" not in n] == plain_calls
    assert sum("eval_buffer" in n for n in calls) == 2 * 3  # BatchNorm's mean and variance
    for weights, live, agreed in scored:
        assert torch.equal(weights, torch.cat([a.reshape(-1) for a in agreed]))
        assert not torch.equal(weights, live)  # the start, not where the rank stands


def test_an_evaluation_at_a_rounds_start_or_under_plain_averaging_scores_the_live_model():
    scheme, hvd = diloco_scheme(local_steps=4)
    take_steps(scheme, 4)  # a round just ended: the live weights are the agreed ones
    hvd.take()
    assert scheme.eval_replica() is scheme.replica and hvd.take() == []
    plain, hvd = local_sgd_scheme(local_steps=4)  # keeps no agreed model: the round ends
    take_steps(plain, 2)
    assert plain.eval_replica() is plain.replica
    assert {n.split(".")[2] for n in hvd.take()} == {"param", "buffer"}
