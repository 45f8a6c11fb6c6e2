"""Tier 1 for the layer-split pipeline: the split arithmetic, the device assignment, the
schedules, and parity of a split model with the unsplit one (the hybrid mpirun jobs are in
tests/multiproc/test_pipeline_multiproc.py)."""

import copy
import time

import pytest
import torch
import torch.nn as nn

from hvdtrain.config import Config, ConfigError, ModelConfig, PipelineConfig
from hvdtrain.models import build_model
from hvdtrain.layout import assign_devices
from hvdtrain.pipeline import (PipelineReplica, balanced_bounds, explicit_bounds,
                               gpipe_bubble, stage_program)
from hvdtrain.replica import Replica


# --- the split ----------------------------------------------------------------------------------
def test_balanced_bounds_minimise_the_largest_stage():
    assert balanced_bounds([1, 1, 1, 1], 2) == [(0, 2), (2, 4)]
    assert balanced_bounds([8, 1, 1, 1, 1], 2) == [(0, 1), (1, 5)]
    assert balanced_bounds([5, 5, 5], 3) == [(0, 1), (1, 2), (2, 3)]
    # The MLP's layers: Flatten, Linear, ReLU, Linear, ReLU, Linear (no-parameter layers count 0).
    sizes = [0, 64 * 256 + 256, 0, 256 * 128 + 128, 0, 128 * 10 + 10]
    # The second Linear alone outweighs the first, so the best split puts it with the small last
    # one; of the equal-cost splits, the one whose largest stage has the fewest layers wins.
    assert balanced_bounds(sizes, 2) == [(0, 3), (3, 6)]


def test_more_stages_than_layers_is_rejected_with_the_arithmetic():
    with pytest.raises(ConfigError, match="the model has 3 layers.*between 1 and 3"):
        balanced_bounds([1, 2, 3], 4)


def test_explicit_split_points():
    assert explicit_bounds((2,), 5) == [(0, 2), (2, 5)]
    assert explicit_bounds((1, 3), 4) == [(0, 1), (1, 3), (3, 4)]
    for bad in [(3, 2), (0,), (5,), (2, 2)]:
        with pytest.raises(ConfigError, match="rise strictly between 1 and 4"):
            explicit_bounds(bad, 5)


def test_split_points_must_match_the_stage_count():
    cfg = Config.from_overrides({"stages": 3, "split_points": "2"})
    with pytest.raises(ConfigError, match="--stages 3 needs 2 split point"):
        cfg.validate()
    cfg = Config.from_overrides({"stages": 2, "micro_batches": 64, "batch_size": 32})
    with pytest.raises(ConfigError, match="32 / --backward-passes-per-step 1 = 32 samples"):
        cfg.validate()


# --- devices ------------------------------------------------------------------------------------
def test_devices_by_local_rank():
    assert assign_devices("cpu,cpu", 2, 0, 1, 0) == ["cpu", "cpu"]
    assert assign_devices("auto", 2, 1, 2, 0) == ["cpu", "cpu"]
    assert assign_devices("cuda", 2, 1, 2, 4) == ["cuda:2", "cuda:3"]
    assert assign_devices("auto", 2, 0, 1, 2) == ["cuda:0", "cuda:1"]
    assert assign_devices("cuda:0,cuda:1,cuda:2,cuda:3", 2, 1, 2, 4) == ["cuda:2", "cuda:3"]
    assert assign_devices("cuda:1,cpu", 2, 0, 1, 2) == ["cuda:1", "cpu"]


def test_impossible_device_assignments_are_rejected_on_every_rank():
    # Rank 0 alone would fit, but rank 1 needs cuda:2 and cuda:3: both ranks must refuse.
    for local_rank in (0, 1):
        with pytest.raises(ConfigError, match=r"2 rank\(s\) on this host x 2 stages need cuda:2, "
                                              r"but this host has 2 GPU"):
            assign_devices("cuda", 2, local_rank, 2, 2)
    with pytest.raises(ConfigError, match="cuda:0, cuda:1 would hold more than one stage"):
        assign_devices("cuda:0,cuda:1", 2, 0, 2, 4)
    with pytest.raises(ConfigError, match=r"one device per stage \(2\)"):
        assign_devices("cpu,cpu,cpu", 2, 0, 1, 0)
    with pytest.raises(ConfigError, match="unknown device 'tpu'"):
        assign_devices("tpu,cpu", 2, 0, 1, 0)


# --- schedules ----------------------------------------------------------------------------------
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("stages,micro", [(2, 4), (3, 2), (4, 8), (2, 1)])
def test_every_stage_program_runs_each_micro_batch_once_in_order(schedule, stages, micro):
    for k in range(stages):
        ops = stage_program(schedule, k, stages, micro)
        assert sorted(ops) == sorted([("F", i) for i in range(micro)] +
                                     [("B", i) for i in range(micro)])
        assert [i for op, i in ops if op == "F"] == list(range(micro))
        assert [i for op, i in ops if op == "B"] == list(range(micro))
        for i in range(micro):
            assert ops.index(("F", i)) < ops.index(("B", i))
    if schedule == "1f1b" and stages == 2 and micro == 4:
        assert stage_program(schedule, 0, 2, 4) == [("F", 0), ("F", 1), ("B", 0), ("F", 2),
                                                    ("B", 1), ("F", 3), ("B", 2), ("B", 3)]


def test_gpipe_bubble_formula():
    assert gpipe_bubble(1, 4) == 0
    assert gpipe_bubble(2, 1) == 0.5
    assert gpipe_bubble(4, 8) == pytest.approx(3 / 11)


# --- parity with the unsplit model ----------------------------------------------------------------
def _models(name="mlp"):
    torch.manual_seed(0)
    shape = (64,) if name == "mlp" else (1, 8, 8)
    model = build_model(name, shape, 10, ModelConfig())
    return model, copy.deepcopy(model), shape


@pytest.mark.parametrize("model_name", ["mlp", "cnn"])
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "sequential"])
@pytest.mark.parametrize("micro", [1, 4])
def test_split_model_matches_unsplit_loss_and_gradients(model_name, schedule, micro):
    whole, split, shape = _models(model_name)
    torch.manual_seed(1)
    x, y = torch.randn(32, *shape), torch.randint(0, 10, (32,))
    plain = Replica(whole, torch.device("cpu"))
    piped = PipelineReplica(split, ["cpu", "cpu"],
                            PipelineConfig(stages=2, micro_batches=micro, schedule=schedule))
    assert piped.backward_passes == micro
    a = plain.forward_backward(x, y, grad_scale=0.5)
    b = piped.forward_backward(x, y, grad_scale=0.5)
    assert abs(a.loss_sum.item() - b.loss_sum.item()) < 1e-6 * 32
    assert a.metrics["acc"][0].item() == b.metrics["acc"][0].item() and a.count == b.count
    for (name, p), q in zip(whole.named_parameters(), split.parameters()):
        assert (p.grad - q.grad).abs().max().item() < 1e-6, name
    # the same weights (stages are slices of the model, not copies): checkpoints interchange
    assert list(whole.state_dict()) == list(split.state_dict())
    evaluated_a, evaluated_b = plain.evaluate([(x, y)]), piped.evaluate([(x, y)])
    assert abs(evaluated_a.loss_sum.item() - evaluated_b.loss_sum.item()) < 1e-4
    metrics = piped.take_epoch_metrics()["pipeline"]
    assert 0 <= metrics["bubble_fraction"] < 1
    assert metrics["gpipe_bubble_formula"] == round(gpipe_bubble(2, micro), 4)
    assert len(metrics["stage_busy_seconds"]) == 2 and all(s > 0 for s in
                                                           metrics["stage_busy_seconds"])


def test_three_stages_with_explicit_split_points():
    whole, split, shape = _models()
    x, y = torch.randn(16, *shape), torch.randint(0, 10, (16,))
    piped = PipelineReplica(split, ["cpu"] * 3, PipelineConfig(stages=3, split_points=(2, 4),
                                                               micro_batches=3))
    assert piped.bounds == [(0, 2), (2, 4), (4, 6)]
    a = Replica(whole, torch.device("cpu")).forward_backward(x, y, 1.0)
    b = piped.forward_backward(x, y, 1.0)
    assert abs(a.loss_sum.item() - b.loss_sum.item()) < 1e-5
    for p, q in zip(whole.parameters(), split.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-6)


class Explode(nn.Module):
    def forward(self, x):
        raise RuntimeError("stage exploded")


def test_a_failing_stage_raises_instead_of_hanging_the_others():
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), Explode(), nn.Linear(32, 10))
    piped = PipelineReplica(model, ["cpu", "cpu"],
                            PipelineConfig(stages=2, split_points=(2,), micro_batches=4))
    t0 = time.perf_counter()
    with pytest.raises(RuntimeError, match="stage exploded"):
        piped.forward_backward(torch.randn(8, 64), torch.zeros(8, dtype=torch.long), 1.0)
    assert time.perf_counter() - t0 < 10


def test_a_model_without_ordered_layers_cannot_be_split():
    class Opaque(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(4, 4)

    with pytest.raises(ConfigError, match="cannot be split by layers"):
        PipelineReplica(Opaque(), ["cpu", "cpu"], PipelineConfig(stages=2))


def test_a_model_with_parameters_outside_its_layers_is_refused_and_tied_ones_are_not():
    """The stages run ``layers`` alone: a skip connection around them took no part in training,
    in silence."""
    class Residual(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4))
            self.skip = nn.Linear(4, 4)

        def forward(self, x):
            return self.layers(x) + self.skip(x)

    with pytest.raises(ConfigError, match=r"--stages: Residual has skip\.weight, skip\.bias "
                                          r"outside its `layers` Sequential"):
        PipelineReplica(Residual(), ["cpu", "cpu"], PipelineConfig(stages=2))

    class Wrapped(nn.Module):  # every parameter is in layers, one of them reachable twice
        def __init__(self):
            super().__init__()
            self.layers = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4))
            self.head = self.layers[2]

    piped = PipelineReplica(Wrapped(), ["cpu", "cpu"], PipelineConfig(stages=2))
    assert len(piped.stages) == 2


class TiedLM(nn.Module):
    """A language model's tied weights: the embedding's matrix is the output head's too."""

    def __init__(self, vocab=11, width=6):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.layers = nn.Sequential(self.embed, nn.Linear(width, width), nn.Tanh(),
                                    TiedHead(self.embed))

    def forward(self, ids):
        return self.layers(ids)


class TiedHead(nn.Module):
    def __init__(self, embed):
        super().__init__()
        self.embed = embed

    def forward(self, h):
        return h @ self.embed.weight.t()


def test_stages_that_share_a_weight_tell_horovod_each_ones_backward_pass():
    """Each stage's backward adds into the tied weight's gradient: 2 hook calls per micro-batch,
    where Horovod, told to expect 1, failed its own assertion at the first step."""
    from hvdtrain.losses import token_cross_entropy
    from hvdtrain.replica import Objective

    torch.manual_seed(0)
    model = TiedLM()
    plain = Replica(copy.deepcopy(model), torch.device("cpu"), Objective(token_cross_entropy))
    piped = PipelineReplica(model, ["cpu", "cpu"], PipelineConfig(stages=2, micro_batches=3),
                            Objective(token_cross_entropy))
    assert piped.backward_passes == 6
    shared = piped.stages[0][0].weight
    calls = []
    shared.register_post_accumulate_grad_hook(lambda p: calls.append(1))
    ids = torch.randint(0, 11, (6, 5))
    a = plain.forward_backward(ids, ids, grad_scale=1.0)
    b = piped.forward_backward(ids, ids, grad_scale=1.0)
    assert len(calls) == piped.backward_passes  # as many as Horovod is told
    assert b.mean_loss() == pytest.approx(a.mean_loss(), abs=1e-5)
    assert torch.allclose(shared.grad, plain.model.embed.weight.grad, atol=1e-5)
    assert PipelineReplica(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4)), ["cpu", "cpu"],
                           PipelineConfig(stages=2, micro_batches=3)).backward_passes == 3
    with pytest.raises(ConfigError, match=r"--stages: the parameter embed\.weight is used by "
                                          r"stages 0, 1, which --devices puts on cpu and "
                                          r"cuda:0; a parameter lives on one device"):
        PipelineReplica(TiedLM(), ["cpu", "cuda:0"], PipelineConfig(stages=2))


# --- GPUs ---------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_split_across_gpu_and_cpu_matches_unsplit():
    devices = ["cuda:0", "cuda:1"] if torch.cuda.device_count() >= 2 else ["cuda:0", "cpu"]
    whole, split, shape = _models()
    x, y = torch.randn(32, *shape), torch.randint(0, 10, (32,))
    piped = PipelineReplica(split, devices, PipelineConfig(stages=2, micro_batches=4))
    a = Replica(whole, torch.device("cpu")).forward_backward(x, y, 1.0)
    b = piped.forward_backward(x.to(devices[0]), y.to(devices[0]), 1.0)
    assert abs(a.loss_sum.item() - b.loss_sum.item()) < 1e-4
    for p, q in zip(whole.parameters(), split.parameters()):
        assert torch.allclose(p.grad, q.grad.cpu(), atol=1e-5)


class _Layered(nn.Module):
    """A model whose forward runs its `layers`, then ``then`` (parameter-free)."""

    def __init__(self, then=lambda out, x: out):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(6, 6), nn.ReLU(), nn.Linear(6, 6))
        self.then = then

    def forward(self, x):
        return self.then(self.layers(x), x)


@pytest.mark.parametrize("then", [lambda out, x: out + x, lambda out, x: out * 10])
def test_a_forward_that_does_more_than_its_layers_is_refused_at_the_check(then):
    """A parameter-free skip or scale passed sequential_layers and was silently not trained."""
    piped = PipelineReplica(_Layered(then), ["cpu", "cpu"], PipelineConfig(stages=2))
    with pytest.raises(ConfigError, match="forward computes something else than its `layers`"):
        piped.checked_forward(torch.randn(4, 6))
    plain = PipelineReplica(_Layered(), ["cpu", "cpu"], PipelineConfig(stages=2))
    assert plain.checked_forward(torch.ones(4, 6)).shape == (4, 6)


class _InputDropout(_Layered):
    """Dropout of the input in forward alone: applied only in training, so an eval-mode check
    passed it and the split trained without it."""

    def forward(self, x):
        return self.layers(nn.functional.dropout(x, 0.5, self.training))


def test_what_forward_does_only_in_training_is_refused_and_the_check_moves_no_statistics():
    piped = PipelineReplica(_InputDropout(), ["cpu", "cpu"], PipelineConfig(stages=2))
    piped.model.eval()
    with pytest.raises(ConfigError, match="in training mode their outputs differ"):
        piped.checked_forward(torch.randn(4, 6))
    assert not piped.model.training  # the check puts the mode back
    # dropout inside `layers` draws the same masks either way: not refused
    model = _Layered()
    model.layers.insert(1, nn.Dropout(0.5))
    model.layers.append(nn.BatchNorm1d(6))
    model.eval()  # as launch.py checks it
    before = model.layers[-1].running_mean.clone()
    PipelineReplica(model, ["cpu", "cpu"], PipelineConfig(stages=2)).checked_forward(
        torch.randn(8, 6))
    assert torch.equal(model.layers[-1].running_mean, before)


class _Pair(nn.Module):
    def forward(self, x):
        return x, x


class _Sum(nn.Module):
    def forward(self, pair):
        return pair[0] + pair[1]


def test_inputs_and_stage_outputs_that_are_not_one_tensor_are_refused_at_the_check():
    """A tuple between stages crashed the first step (AttributeError: 'tuple' object has no
    attribute 'detach'); a dict input was called on the first layer and blamed the model."""
    model = nn.Sequential(nn.Linear(6, 6), _Pair(), _Sum(), nn.Linear(6, 3))
    split_at_pair = PipelineReplica(model, ["cpu", "cpu"],
                                    PipelineConfig(stages=2, split_points=(2,)))
    with pytest.raises(ConfigError, match=r"stage 1 \(layers 0-1\) ends with layer 1, a _Pair, "
                                          r"which returns a tuple; .* \(stage 2 begins at layer 2\)"):
        split_at_pair.checked_forward(torch.randn(4, 6))
    fine = PipelineReplica(model, ["cpu", "cpu"], PipelineConfig(stages=2, split_points=(3,)))
    assert fine.checked_forward(torch.randn(4, 6)).shape == (4, 3)
    with pytest.raises(ConfigError, match="the samples' inputs are a dict, and a split model's "
                                          "first stage takes one tensor"):
        fine.checked_forward({"x": torch.randn(4, 6)})


def test_dropout_in_stages_that_share_a_device_draws_the_same_masks_in_any_order():
    """Threads of CPU stages drew from one generator in whatever order they ran: the same
    flags gave another result each run, and a resume could not be exact. Each micro-batch's
    masks now come from the step's seed, so every schedule draws the same ones."""
    def grads(schedule):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 32), nn.Dropout(0.5), nn.Linear(32, 32),
                              nn.Dropout(0.5), nn.Linear(32, 3))
        piped = PipelineReplica(model, ["cpu", "cpu"],
                                PipelineConfig(stages=2, micro_batches=4, schedule=schedule))
        for step in range(3):  # the first step learns which stages draw
            torch.manual_seed(step)
            piped.forward_backward(torch.randn(16, 8), torch.arange(16) % 3, 1.0)
        return [p.grad.clone() for p in model.parameters()]

    gpipe = grads("gpipe")
    for other in ("sequential", "1f1b", "gpipe"):
        assert all(torch.equal(a, b) for a, b in zip(gpipe, grads(other))), other


def test_a_split_refuses_batchnorm_micro_batches_of_one_sample_and_a_module_list():
    from hvdtrain.pipeline import _check_batchnorm_micro_batches

    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    cfg = Config.from_overrides({"stages": 2, "micro_batches": 20}).validate()
    with pytest.raises(ConfigError, match="--micro-batches 20: a backward pass of 32 samples "
                                          ".*BatchNorm1d needs 2 or more .* at most 16"):
        _check_batchnorm_micro_batches(model, cfg)
    _check_batchnorm_micro_batches(nn.Sequential(nn.Linear(4, 2)), cfg)  # nothing to refuse

    class Listed(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 2)])

    with pytest.raises(ConfigError, match=r"its `layers` is a ModuleList: make it "
                                          r"nn.Sequential\(\*layers\)"):
        PipelineReplica(Listed(), ["cpu", "cpu"], PipelineConfig(stages=2))
