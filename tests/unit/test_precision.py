"""Tier 1 for --precision and --clip-grad-norm (precision.py): autocast in a replica and in every
pipeline stage's thread, the loss scale's skip of an overflowed step, the order unscale -> clip ->
step, and the figures each epoch line gets. The mpirun jobs are in
tests/multiproc/test_precision_multiproc.py."""

import math
import threading

import pytest
import torch
import torch.nn as nn

from hvdtrain.cli import build_parser, config_from_args, main
from hvdtrain.config import ConfigError, ModelConfig, PipelineConfig
from hvdtrain.models import build_model
from hvdtrain.loop import TrainingError
from hvdtrain.pipeline import PipelineReplica
from hvdtrain.precision import Precision, PushGate
from hvdtrain.replica import Replica

CPU = torch.device("cpu")


def _linear():
    torch.manual_seed(0)
    return nn.Linear(6, 3)


def _mlp():
    torch.manual_seed(0)  # Flatten, Linear, ReLU, Linear, ReLU, Linear
    return build_model("mlp", (64,), 10, ModelConfig())


def _batch(n=12, features=6, classes=3, scale=1.0):
    torch.manual_seed(1)
    return scale * torch.randn(n, features), torch.randint(0, classes, (n,))


def _params(model):
    return [p.detach().clone() for p in model.parameters()]


def _norm(tensors):
    return math.sqrt(sum(float(t.double().pow(2).sum()) for t in tensors))


# --- autocast ---------------------------------------------------------------------------------
def test_bf16_forward_runs_in_bfloat16_and_keeps_float32_parameters_and_sums():
    replica = Replica(_linear(), CPU, precision=Precision("bf16", [CPU]))
    x, y = _batch()
    assert replica.forward(x).dtype == torch.bfloat16
    stats = replica.forward_backward(x, y, 1.0)
    assert stats.loss_sum.dtype == torch.float32  # the epoch adds these up: no bf16 rounding
    for p in replica.parameters():
        assert p.dtype == torch.float32 and p.grad.dtype == torch.float32
    # What the run logs is the loss of the bf16 forward, not a float32 recomputation.
    plain = Replica(_linear(), CPU).forward_backward(x, y, 1.0)
    assert stats.loss_sum.item() != plain.loss_sum.item()
    assert abs(stats.loss_sum.item() - plain.loss_sum.item()) < 0.05 * plain.loss_sum.item()


def test_float32_runs_without_autocast():
    replica = Replica(_linear(), CPU)
    assert replica.forward(_batch()[0]).dtype == torch.float32


# --- the loss scale ---------------------------------------------------------------------------
def _backward(replica, x, y):
    replica.model.zero_grad()
    replica.forward_backward(x, y, 1.0)
    return [p.grad.clone() for p in replica.parameters()]


def test_fp16_skips_an_overflowed_step_and_backs_off_the_scale_then_steps_unscaled():
    precision = Precision("fp16", [CPU])
    replica = Replica(_linear(), CPU, precision=precision)
    optimizer = torch.optim.SGD(replica.parameters(), lr=0.1)
    x, y = _batch()
    scale = precision.scaler.get_scale()
    assert scale > 1  # the gradients below are multiplied by it until update() unscales them

    _backward(replica, x, y)
    replica.model.weight.grad[0, 0] = float("inf")  # one element is enough
    before = _params(replica.model)
    assert replica.update(optimizer) is False
    assert all(torch.equal(a, b) for a, b in zip(before, replica.parameters()))
    assert precision.scaler.get_scale() == scale / 2

    scaled = _backward(replica, x, y)
    assert replica.update(optimizer) is True
    # SGD without momentum moved each parameter by lr times the unscaled gradient.
    for old, new, g in zip(before, replica.parameters(), scaled):
        expected = old - 0.1 * g / (scale / 2)
        assert not torch.equal(old, new.detach())
        assert torch.allclose(new.detach(), expected, atol=1e-6)
    figures = replica.take_epoch_metrics()
    assert figures == {"loss_scale": scale / 2, "skipped_steps": 1}
    assert replica.take_epoch_metrics()["skipped_steps"] == 0  # reset for the next epoch


def test_a_nan_gradient_is_skipped_too():
    precision = Precision("fp16", [CPU])
    replica = Replica(_linear(), CPU, precision=precision)
    x, y = _batch()
    _backward(replica, x, y)
    replica.model.bias.grad[1] = float("nan")
    before = _params(replica.model)
    assert replica.update(torch.optim.SGD(replica.parameters(), lr=0.1)) is False
    assert all(torch.equal(a, b) for a, b in zip(before, replica.parameters()))


def test_a_gradient_that_is_never_finite_ends_the_run_once_no_scale_could_save_it():
    precision = Precision("fp16", [CPU])
    replica = Replica(_linear(), CPU, precision=precision)
    optimizer = torch.optim.SGD(replica.parameters(), lr=0.1)
    x, y = _batch()
    skips = 0
    with pytest.raises(TrainingError, match=r"fp16: 41 steps in a row were skipped.*NaN or inf"):
        while True:  # the scale halves from 2^16 at each skip; below 2^-24 the run ends
            _backward(replica, x, y)
            replica.model.bias.grad[0] = float("nan")
            assert replica.update(optimizer) is False
            skips += 1
    assert skips == 40 and precision.scaler.get_scale() < 2.0 ** -24
    _backward(replica, x, y)  # a finite step in between starts the count again
    assert replica.update(optimizer) is True and precision.skipped_in_a_row == 0


def test_without_a_loss_scale_the_metrics_carry_no_scale_figures():
    assert Precision("32", [CPU]).take_epoch_metrics() == {}
    assert Precision("bf16", [CPU]).take_epoch_metrics() == {}
    assert Precision("32", [CPU]).scaler is None and Precision("bf16", [CPU]).scaler is None


# --- clipping ---------------------------------------------------------------------------------
def _clipped_by_hand(grads, max_norm):
    """What torch.nn.utils.clip_grad_norm_ documents: one factor for all gradients."""
    norm = _norm(grads)
    factor = min(1.0, max_norm / (norm + 1e-6))
    return [g * factor for g in grads], norm


@pytest.mark.parametrize("mode", ["32", "fp16"])
def test_update_applies_the_clipped_gradient(mode):
    precision = Precision(mode, [CPU], clip_grad_norm=0.1)
    replica = Replica(_linear(), CPU, precision=precision)
    optimizer = torch.optim.SGD(replica.parameters(), lr=1.0)  # the step is minus the gradient
    x, y = _batch()
    reference = Replica(_linear(), CPU)  # float32, unclipped: the gradient to clip by hand
    expected, norm = _clipped_by_hand(_backward(reference, x, y), 0.1)
    assert norm > 0.1  # clipping is active
    before = _params(replica.model)
    _backward(replica, x, y)
    assert replica.update(optimizer) is True
    applied = [old - new.detach() for old, new in zip(before, replica.parameters())]
    # fp16: the norm is measured after unscaling (clipping the scaled gradient to 0.1 and then
    # unscaling would apply 0.1 / 65536), and the forward ran in float16, so only 1e-3 agrees.
    tol = 1e-6 if mode == "32" else 1e-3
    assert _norm(applied) <= 0.1 + tol
    for a, e in zip(applied, expected):
        assert torch.allclose(a, e, atol=tol), (a, e)
    figures = replica.take_epoch_metrics()
    assert figures["clipped_fraction"] == 1.0
    assert figures["grad_norm_mean"] == pytest.approx(norm, rel=1e-5 if mode == "32" else 1e-2)


def test_epoch_figures_average_the_norm_and_count_the_clipped_steps():
    precision = Precision("32", [CPU], clip_grad_norm=1.0)
    params = [nn.Parameter(torch.zeros(2))]
    gate = PushGate(params)
    for grad in ([3.0, 4.0], [0.3, 0.4]):  # norms 5 (clipped) and 0.5 (left alone)
        params[0].grad = torch.tensor(grad)
        precision.update(gate, params)
    assert torch.allclose(params[0].grad, torch.tensor([0.3, 0.4]))
    assert precision.take_epoch_metrics() == {"grad_norm_mean": 2.75, "clipped_fraction": 0.5}
    assert precision.take_epoch_metrics() == {}  # no steps since the reset
    # a step whose gradient overflowed (fp16 skips it) has no norm: it made the mean NaN
    for grad in ([3.0, 4.0], [float("inf"), 0.0]):
        params[0].grad = torch.tensor(grad)
        precision.update(gate, params)
    assert precision.take_epoch_metrics() == {"grad_norm_mean": 5.0, "clipped_fraction": 1.0}


def test_clipping_off_leaves_the_gradient_alone():
    precision = Precision("32", [CPU])
    params = [nn.Parameter(torch.zeros(2))]
    params[0].grad = torch.tensor([30.0, 40.0])
    precision.update(PushGate(params), params)
    assert torch.equal(params[0].grad, torch.tensor([30.0, 40.0]))
    assert not precision.needs_synchronized_gradients
    assert Precision("32", [CPU], clip_grad_norm=1.0).needs_synchronized_gradients
    assert Precision("fp16", [CPU]).needs_synchronized_gradients


# --- the async worker's gate ------------------------------------------------------------------
@pytest.mark.parametrize("poison, passed", [(None, True), (float("inf"), False)])
def test_push_gate_opens_only_for_a_finite_gradient(poison, passed):
    precision = Precision("fp16", [CPU], clip_grad_norm=1.0)
    replica = Replica(_linear(), CPU, precision=precision)
    gate = PushGate(replica.parameters())
    assert gate.passed is False
    _backward(replica, *_batch())
    if poison is not None:
        replica.model.weight.grad[1, 2] = poison
    before = _params(replica.model)
    assert replica.update(gate) is passed
    assert gate.passed is passed
    # The gate updates nothing: the server applies the pushed gradient.
    assert all(torch.equal(a, b) for a, b in zip(before, replica.parameters()))
    if passed:  # what is pushed: unscaled and clipped
        assert _norm([p.grad for p in replica.parameters()]) <= 1.0 + 1e-3


# --- a pipeline: one scale, one clipping norm, autocast in every stage's thread ---------------
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_a_pipeline_clips_all_stages_by_one_global_norm(schedule):
    whole, split = _mlp(), _mlp()
    x, y = _batch(features=64, classes=10)
    c = 0.05
    a = Replica(whole, CPU, precision=Precision("32", [CPU], clip_grad_norm=c))
    piped = PipelineReplica(split, ["cpu", "cpu"],
                            PipelineConfig(stages=2, micro_batches=2, schedule=schedule),
                            precision=Precision("32", [CPU, CPU], clip_grad_norm=c))
    a.forward_backward(x, y, 1.0)
    piped.forward_backward(x, y, 1.0)
    a.update(PushGate(a.parameters()))
    piped.update(PushGate(piped.parameters()))
    assert a.take_epoch_metrics()["clipped_fraction"] == 1.0
    assert piped.take_epoch_metrics()["clipped_fraction"] == 1.0
    # Each stage alone has a smaller norm than the whole: clipping per stage would scale the
    # stages by different factors, and the gradients would differ here.
    for (name, p), q in zip(whole.named_parameters(), split.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-6), name
    assert _norm([q.grad for q in split.parameters()]) == pytest.approx(c, rel=1e-4)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_a_pipeline_runs_every_stage_under_bf16_autocast(schedule):
    x, y = _batch(features=64, classes=10, scale=5.0)  # large inputs: bf16 rounding shows
    cfg = PipelineConfig(stages=2, micro_batches=2, schedule=schedule)
    piped = PipelineReplica(_mlp(), ["cpu", "cpu"], cfg, precision=Precision("bf16", [CPU, CPU]))
    seen = []  # (stage, the thread it ran in, its Linear layers' output dtype)

    def record(k):
        return lambda module, inputs, output: seen.append(
            (k, threading.current_thread().name.startswith("stage"), output.dtype))

    for k, stage in enumerate(piped.stages):
        for layer in stage:
            if isinstance(layer, nn.Linear):
                layer.register_forward_hook(record(k))
    loss = piped.forward_backward(x, y, 1.0).loss_sum.item()
    assert {k for k, _, _ in seen} == {0, 1}
    assert {(in_stage_thread, dtype) for _, in_stage_thread, dtype in seen} == \
        {(True, torch.bfloat16)}, seen
    bf16 = Replica(_mlp(), CPU, precision=Precision("bf16", [CPU])).forward_backward(x, y, 1.0)
    fp32 = Replica(_mlp(), CPU).forward_backward(x, y, 1.0)
    assert abs(loss - bf16.loss_sum.item()) < 1e-4
    assert abs(loss - fp32.loss_sum.item()) > 1e-3
    for p in piped.model.parameters():
        assert p.dtype == torch.float32 and p.grad.dtype == torch.float32


def test_a_pipeline_has_one_loss_scale_for_all_stages():
    piped = PipelineReplica(_mlp(), ["cpu", "cpu"], PipelineConfig(stages=2, micro_batches=2),
                            precision=Precision("fp16", [CPU, CPU]))
    x, y = _batch(features=64, classes=10)
    piped.forward_backward(x, y, 1.0)
    piped.stages[0][1].weight.grad[0, 0] = float("inf")  # the first stage overflows only
    before = _params(piped.model)
    assert piped.update(torch.optim.SGD(piped.parameters(), lr=0.1)) is False
    # The last stage's finite gradient is not applied either: the whole step is skipped.
    assert all(torch.equal(a, b) for a, b in zip(before, piped.model.parameters()))
    assert piped.take_epoch_metrics()["skipped_steps"] == 1


# --- options ----------------------------------------------------------------------------------
def parse(*argv):
    return config_from_args(build_parser().parse_args(["train", *argv]))


def test_precision_and_clipping_options():
    cfg = parse("--precision", "bf16", "--clip-grad-norm", "1.5")
    assert cfg.run.precision == "bf16" and cfg.optim.clip_grad_norm == 1.5
    assert parse().run.precision == "32" and parse().optim.clip_grad_norm == 0.0


def test_a_negative_clipping_norm_names_the_flag():
    with pytest.raises(ConfigError) as err:
        parse("--clip-grad-norm", "-1")
    assert str(err.value).startswith("--clip-grad-norm")
    assert "positive norm" in str(err.value)


def test_an_unknown_precision_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--precision", "fp17"])
    assert exit_info.value.code == 2
    assert "--precision: invalid choice: 'fp17'" in capsys.readouterr().err
    # The same from a config file, and from code that builds a Precision itself.
    config = tmp_path / "run.toml"
    config.write_text('[run]\nprecision = "fp17"\n')
    with pytest.raises(ConfigError, match="--precision: invalid choice 'fp17'"):
        parse("--config", str(config))
    with pytest.raises(ConfigError, match="--precision: invalid choice 'fp17'"):
        Precision("fp17", [CPU])


def test_fp16_on_cpu_runs_with_a_note(capsys):
    from hvdtrain.precision import check_devices

    check_devices("fp16", [CPU], is_main=True)
    assert "--precision fp16 on CPUs runs" in capsys.readouterr().out
    check_devices("fp16", [CPU], is_main=False)
    check_devices("bf16", [CPU], is_main=True)
    assert capsys.readouterr().out == ""
    assert Precision("fp16", [CPU]).scaler is not None
