"""hvdtrain.losses: the built-in losses against torch's own, the user's loss from a spec, accuracy,
and the check that a loss fits the model's output before training starts."""

from __future__ import annotations

import re
import textwrap

import pytest
import torch
import torch.nn as nn

from hvdtrain.config import ConfigError
from hvdtrain.losses import (CLASSIFICATION_LOSSES, LOSSES, accuracy, check_loss_accepts,
                             check_metric_returns, default_metrics, metric_applies, resolve_loss)
from hvdtrain.user_code import UserCodeError


pytestmark = pytest.mark.usefixtures("isolated_imports")  # see conftest.py

def sample(loss_name: str, n: int = 16, classes: int = 5):
    """A random (output, target) pair of the kind the loss expects."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(n, classes, generator=g)
    if loss_name == "cross_entropy":
        return logits, torch.randint(classes, (n,), generator=g)
    if loss_name == "nll":
        return logits.log_softmax(dim=1), torch.randint(classes, (n,), generator=g)
    if loss_name == "bce_with_logits":
        return logits, torch.rand(n, classes, generator=g)
    if loss_name == "token_cross_entropy":  # (N, T, V) logits, a padded position per sequence
        target = torch.randint(classes, (n, 3), generator=g)
        target[:, 2] = -100
        return torch.randn(n, 3, classes, generator=g), target
    return logits, torch.randn(n, classes, generator=g)


# -- built-in losses -------------------------------------------------------------------------------

TORCH_MODULES = {
    "cross_entropy": nn.CrossEntropyLoss, "mse": nn.MSELoss, "l1": nn.L1Loss,
    "bce_with_logits": nn.BCEWithLogitsLoss, "nll": nn.NLLLoss,
    # torch's loss over the positions, the classes moved to axis 1 where it reads them
    "token_cross_entropy": lambda: lambda out, t: nn.CrossEntropyLoss()(out.transpose(1, 2), t),
}


def by_hand(name: str, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    if name == "cross_entropy":
        return -output.log_softmax(1).gather(1, target[:, None]).mean()
    if name == "nll":
        return -output.gather(1, target[:, None]).mean()
    if name == "token_cross_entropy":
        scored = target != -100
        picked = output.log_softmax(-1).gather(-1, target.clamp(min=0)[..., None])[..., 0]
        return -picked[scored].mean()
    if name == "mse":
        return ((output - target) ** 2).mean()
    if name == "l1":
        return (output - target).abs().mean()
    p = torch.sigmoid(output)
    return -(target * p.log() + (1 - target) * (1 - p).log()).mean()


def test_registry_names():
    assert set(LOSSES) == {"cross_entropy", "mse", "l1", "bce_with_logits", "nll",
                           "token_cross_entropy"}
    assert CLASSIFICATION_LOSSES == {"cross_entropy", "nll"}


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_builtin_loss_is_torchs_mean_loss(name):
    output, target = sample(name)
    loss_fn, resolved_name = resolve_loss(name)
    value = loss_fn(output, target)
    assert resolved_name == name
    assert value.shape == ()
    torch.testing.assert_close(value, TORCH_MODULES[name]()(output, target))
    torch.testing.assert_close(value, by_hand(name, output, target), rtol=1e-5, atol=1e-6)


# -- resolving --loss ------------------------------------------------------------------------------

def test_unknown_name_lists_the_builtins():
    with pytest.raises(ConfigError) as e:
        resolve_loss("hinge")
    message = str(e.value)
    assert message.startswith("--loss: 'hinge' is not a built-in loss name nor MODULE:CALLABLE")
    assert "bce_with_logits, cross_entropy, l1, mse, nll" in message


def test_user_function_from_a_file(tmp_path, monkeypatch):
    (tmp_path / "my_losses.py").write_text(textwrap.dedent("""
        def doubled_mse(output, target):
            return 2 * ((output - target) ** 2).mean()
    """))
    monkeypatch.chdir(tmp_path)
    loss_fn, name = resolve_loss("my_losses.py:doubled_mse")
    assert name == "my_losses.py:doubled_mse"
    assert float(loss_fn(torch.ones(3), torch.zeros(3))) == 2.0
    assert default_metrics(name) == {}


def test_user_module_class_is_instantiated(tmp_path, monkeypatch):
    (tmp_path / "uc_loss_mod.py").write_text(textwrap.dedent("""
        import torch.nn as nn

        class HalfL1(nn.Module):
            def forward(self, output, target):
                return 0.5 * (output - target).abs().mean()
    """))
    monkeypatch.chdir(tmp_path)
    loss_fn, name = resolve_loss("uc_loss_mod:HalfL1")
    assert isinstance(loss_fn, nn.Module)
    assert float(loss_fn(torch.full((4,), 3.0), torch.ones(4))) == 1.0


def test_user_class_whose_init_raises_is_their_bug(tmp_path, monkeypatch):
    (tmp_path / "bad_loss.py").write_text("class Loss:\n    def __init__(self):\n"
                                          "        raise KeyError('margin')\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserCodeError, match=r"^--loss bad_loss.py:Loss raised KeyError"):
        resolve_loss("bad_loss.py:Loss")


def test_callables_pass_through_and_classes_are_instantiated():
    def focal(output, target):
        return output.sum()

    assert resolve_loss(focal) == (focal, "test_callables_pass_through_and_classes_are_"
                                          "instantiated.<locals>.focal")
    loss_fn, name = resolve_loss(nn.MSELoss)
    assert isinstance(loss_fn, nn.MSELoss) and name == "MSELoss"
    instance = nn.L1Loss()
    assert resolve_loss(instance) == (instance, "L1Loss")


# -- metrics ---------------------------------------------------------------------------------------

def test_accuracy_on_a_known_example():
    output = torch.tensor([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4], [0.3, 0.7]])
    target = torch.tensor([0, 0, 0, 1])
    correct, count = accuracy(output, target)
    assert (int(correct), count) == (3, 4)


def test_accuracy_adds_across_micro_batches():
    output, target = sample("cross_entropy", n=10)
    whole = accuracy(output, target)
    parts = [accuracy(output[:3], target[:3]), accuracy(output[3:], target[3:])]
    assert int(sum(p[0] for p in parts)) == int(whole[0])
    assert sum(p[1] for p in parts) == whole[1] == 10


def test_default_metrics():
    assert default_metrics("cross_entropy") == {"acc": accuracy}
    assert default_metrics("nll") == {"acc": accuracy}
    assert default_metrics("mse") == {}
    assert default_metrics("my.py:cross_entropy") == {}


@pytest.mark.parametrize("output_shape, target, applies", [
    ((8, 5), torch.zeros(8, dtype=torch.long), True),
    ((8, 5), torch.zeros(8, dtype=torch.int32), True),
    ((8, 12, 5), torch.zeros(8, 12, dtype=torch.long), False),  # a sequence model's (N, T, C)
    ((8, 5), torch.zeros(8), False),                            # float targets: regression
    ((8, 5), torch.zeros(8, 5, dtype=torch.long), False),
    ((8, 5), torch.zeros(7, dtype=torch.long), False),
    ((8,), torch.zeros(8, dtype=torch.long), False),
])
def test_accuracy_applies_only_to_n_by_c_with_integer_targets(output_shape, target, applies):
    assert metric_applies(accuracy, torch.zeros(output_shape), target) is applies


def test_metric_without_a_shape_rule_applies():
    assert metric_applies(lambda o, t: (0, 1), torch.zeros(8, 12, 5), torch.zeros(8, 12))


def test_accuracy_refuses_what_it_does_not_apply_to():
    with pytest.raises(ValueError, match=r"\(N, C\) outputs"):
        accuracy(torch.zeros(8, 12, 5), torch.zeros(8, 12, dtype=torch.long))


# -- check_loss_accepts ----------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(LOSSES))
def test_matching_output_and_target_pass(name):
    output, target = sample(name)
    check_loss_accepts(LOSSES[name], name, output.requires_grad_(), target)


def test_float_targets_for_cross_entropy():
    with pytest.raises(ConfigError) as e:
        check_loss_accepts(LOSSES["cross_entropy"], "cross_entropy", torch.randn(8, 5),
                           torch.randn(8))
    message = str(e.value)
    assert not isinstance(e.value, UserCodeError)
    assert message.startswith("--loss cross_entropy: cannot score the output against the target")
    assert "(8, 5) torch.float32" in message and "(8,) torch.float32" in message
    assert "(N, C) logits with integer class targets (N,)" in message
    assert "--loss mse" in message


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.int32])
@pytest.mark.parametrize("name", ["cross_entropy", "nll", "token_cross_entropy"])
def test_class_ids_of_any_integer_dtype_score_as_int64_ones(name, dtype):
    """A Dataset's int32 labels (numpy's default on some systems) were refused with torch's
    "expected target dtype to be Long or Byte"; (x, y) pairs were converted when loaded."""
    output = torch.randn(6, 4, 5) if name == "token_cross_entropy" else torch.randn(6, 5)
    target = torch.randint(0, 5, output.shape[:-1])
    check_loss_accepts(LOSSES[name], name, output.requires_grad_(), target.to(dtype))
    torch.testing.assert_close(LOSSES[name](output, target.to(dtype)),
                               LOSSES[name](output, target))


@pytest.mark.parametrize("name", ["cross_entropy", "nll", "token_cross_entropy"])
def test_whole_number_float_class_ids_are_told_to_become_integers(name):
    output = torch.randn(6, 4, 5) if name == "token_cross_entropy" else torch.randn(6, 5)
    target = torch.randint(0, 5, output.shape[:-1]).float()
    with pytest.raises(ConfigError, match=rf"--loss {name}: .*whole numbers held as floats; "
                                          r"class ids must be integers: convert them with "
                                          r"\.long\(\)"):
        check_loss_accepts(LOSSES[name], name, output, target)


@pytest.mark.parametrize("name", ["cross_entropy", "nll"])
@pytest.mark.parametrize("steps", [7, 5])  # T == V: torch would train the wrong axis silently
def test_a_language_models_logits_are_refused_for_the_classes_on_axis_1(name, steps):
    with pytest.raises(ConfigError) as e:
        check_loss_accepts(LOSSES[name], name, torch.randn(4, steps, 5),
                           torch.randint(5, (4, steps)))
    assert f"(4, {steps}, 5) torch.float32 and the target (4, {steps}) torch.int64" in str(e.value)
    assert "classes are on the last axis" in str(e.value)
    assert "pass --loss token_cross_entropy" in str(e.value)


def test_classes_on_axis_1_still_pass_for_cross_entropy():
    """A segmentation model's (N, C, H, W) against (N, H, W), as torch reads it."""
    check_loss_accepts(LOSSES["cross_entropy"], "cross_entropy", torch.randn(2, 3, 4, 6),
                       torch.randint(3, (2, 4, 6)))


def test_token_accuracy_scores_the_last_axis_and_skips_padding():
    output = torch.zeros(2, 3, 4)
    output[0, :, 1] = output[1, :, 2] = 1.0  # predicts 1 in sequence 0, 2 in sequence 1
    target = torch.tensor([[1, 1, -100], [2, 0, -100]])
    correct, scored = default_metrics("token_cross_entropy")["acc"](output, target)
    assert (int(correct), int(scored)) == (3, 4)


@pytest.mark.parametrize("returned, told", [
    (torch.tensor(0.5), "returned a tensor of shape ()"),
    (0.5, "returned a float"),
    ((1, 2, 3), "returned a tuple of 3"),
    ((torch.ones(3), 3), "returned a tuple of 2"),
])
def test_a_metric_that_returns_no_sum_and_count_is_named_before_training(returned, told):
    with pytest.raises(ConfigError, match=rf"metrics: 'm' {re.escape(told)}; a metric returns "
                                          r"\(sum, count\)"):
        check_metric_returns("m", lambda o, t: returned, torch.zeros(4, 2), torch.zeros(4))
    check_metric_returns("m", lambda o, t: (torch.tensor(3.0), 4), torch.zeros(4, 2),
                         torch.zeros(4))


def test_a_metric_that_raises_is_the_users_bug():
    def metric(output, target):
        raise KeyError("label")

    with pytest.raises(UserCodeError, match=r"metrics 'm' raised KeyError"):
        check_metric_returns("m", metric, torch.zeros(4, 2), torch.zeros(4))


def test_mse_refuses_shapes_it_would_broadcast():
    """mse_loss only warns on (N, 1) against (N,), then averages an (N, N) matrix."""
    with pytest.raises(ConfigError) as e:
        check_loss_accepts(LOSSES["mse"], "mse", torch.randn(8, 1), torch.randn(8))
    message = str(e.value)
    assert message.startswith("--loss mse: the model's output is (8, 1) torch.float32 and the "
                              "target (8,) torch.float32, shapes that differ")
    assert "same shape" in message


def test_class_labels_for_mse():
    with pytest.raises(ConfigError,
                       match=r"--loss mse: .*\(8,\) torch.int64.*--loss cross_entropy"):
        check_loss_accepts(LOSSES["mse"], "mse", torch.randn(8, 5), torch.randint(5, (8,)))


def test_bce_with_logits_shape_mismatch():
    with pytest.raises(ConfigError, match=r"--loss bce_with_logits: .*float targets in \[0, 1\]"):
        check_loss_accepts(LOSSES["bce_with_logits"], "bce_with_logits", torch.randn(8, 1),
                           torch.rand(8))


def test_user_loss_that_raises_is_their_bug():
    def my_loss(output, target):
        raise RuntimeError("bad reduction")

    with pytest.raises(UserCodeError, match=r"^--loss my.py:my_loss raised RuntimeError: "
                                            r"bad reduction"):
        check_loss_accepts(my_loss, "my.py:my_loss", torch.randn(8, 5), torch.zeros(8).long())


def test_loss_must_be_a_scalar():
    with pytest.raises(ConfigError) as e:
        check_loss_accepts(lambda o, t: (o - t) ** 2, "my.py:sq", torch.randn(8), torch.randn(8))
    message = str(e.value)
    assert message.startswith("--loss my.py:sq returned a tensor of shape (8,), not a scalar")
    assert "loss.mean()" in message


def test_loss_must_be_a_tensor():
    with pytest.raises(ConfigError, match=r"returned a float, not a tensor.*not \.item\(\)"):
        check_loss_accepts(lambda o, t: float(((o - t) ** 2).mean()), "my.py:f",
                           torch.randn(8), torch.randn(8))


def test_loss_must_keep_the_gradient():
    output = torch.randn(8, requires_grad=True)
    with pytest.raises(ConfigError, match="no gradient"):
        check_loss_accepts(lambda o, t: ((o.detach() - t) ** 2).mean(), "my.py:f", output,
                           torch.randn(8))


class ModelOutput:  # a Hugging Face-style output object
    def __init__(self, logits):
        self.logits = logits


@pytest.mark.parametrize("output", [{"logits": torch.randn(4, 3)}, (torch.randn(4, 3),),
                                    ModelOutput(torch.randn(4, 3))])
@pytest.mark.parametrize("name", ["cross_entropy", "token_cross_entropy", "mse"])
def test_an_output_that_is_no_tensor_is_told_to_return_the_logits(name, output):
    with pytest.raises(ConfigError, match=rf"--loss {name}: the model's output is of type "
                                          rf"{type(output).__name__}, not a tensor; .*return the "
                                          r"logits from forward .* --loss MODULE:CALLABLE"):
        check_loss_accepts(LOSSES[name], name, output, torch.zeros(4, dtype=torch.long))


@pytest.mark.parametrize("name", ["cross_entropy", "nll"])
def test_an_output_with_an_extra_axis_is_told_to_drop_it_not_that_it_has_one_class(name):
    with pytest.raises(ConfigError, match=rf"--loss {name}: .*\(4, 1, 10\).*more axes than class "
                                          r"scores .* drop the extra axes"):
        check_loss_accepts(LOSSES[name], name, torch.randn(4, 1, 10), torch.zeros(4).long())
    with pytest.raises(ConfigError, match="one output column"):  # (N, 1) still is one class
        check_loss_accepts(LOSSES[name], name, torch.randn(4, 1), torch.zeros(4).long())
