"""Losses and metrics: the built-ins by name, or the user's own through ``--loss MODULE:CALLABLE``.

A loss is ``loss(output, target) -> scalar tensor``, the MEAN over the batch.

A metric is ``metric(output, target) -> (sum, count)``, so that micro-batches and workers add
their sums and counts and divide once at the end (a mean of means would weigh a short last batch
like a full one).

Accuracy is defined only for (N, C) outputs with (N,) integer targets. A run whose output has
another shape reports its loss alone: the trainer asks :func:`metric_applies` on the first batch
and drops a metric that does not apply, instead of crashing or, worse, comparing the wrong axis.

A language model's logits have their classes (the vocabulary) on the LAST axis, (N, T, V)
against (N, T) token ids, where torch's cross_entropy reads classes from axis 1: with T == V it
trains the wrong objective without an error. ``token_cross_entropy`` takes that layout (with its
token accuracy), and the built-in cross_entropy and nll refuse it, naming that loss.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F

from .errors import ConfigError
from .user_code import UserCodeError, call_user, resolve_callable

Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
Metric = Callable[[torch.Tensor, torch.Tensor], tuple[Any, Any]]

IGNORE_INDEX = -100  # torch's cross_entropy default: a target of padding, not scored


def _as_class_ids(target: torch.Tensor) -> torch.Tensor:
    """Class ids of any integer dtype as the int64 that torch's class losses take (they refuse
    int32, which labels read from files often are); int64 and uint8 pass as they are, without a
    copy. (x, y) pairs were converted when loaded (data/user_data.py); a Dataset's are here."""
    if target.dtype in (torch.int64, torch.uint8) or not integer_labels(target.dtype):
        return target
    return target.long()


def cross_entropy(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(output, _as_class_ids(target))


def nll(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.nll_loss(output, _as_class_ids(target))


def token_cross_entropy(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Cross-entropy with the classes on the last axis: (N, ..., V) logits against (N, ...)
    class ids, the mean over every position whose target is not IGNORE_INDEX."""
    return F.cross_entropy(output.reshape(-1, output.shape[-1]),
                           _as_class_ids(target).reshape(-1))


def scored_positions(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """How many positions token_cross_entropy's mean is over: those not IGNORE_INDEX. A test
    loss over several batches or workers is then the mean over every scored token, whatever
    their lengths (padded sequences), not a mean of per-batch means."""
    return (target != IGNORE_INDEX).sum()


token_cross_entropy.loss_weight = scored_positions  # type: ignore[attr-defined]


LOSSES: dict[str, Loss] = {  # torch's defaults are reduction="mean"
    "cross_entropy": cross_entropy,
    "token_cross_entropy": token_cross_entropy,
    "mse": F.mse_loss,
    "l1": F.l1_loss,
    "bce_with_logits": F.binary_cross_entropy_with_logits,
    "nll": nll,
}
CLASSIFICATION_LOSSES = {"cross_entropy", "nll"}
_ELEMENTWISE_LOSSES = {"mse", "l1", "bce_with_logits"}  # output and target of one shape

_FIX = {
    "cross_entropy": "a classifier's output must be (N, C) logits with integer class targets "
                     "(N,); for real-valued targets pass --loss mse or l1",
    "token_cross_entropy": "the output must be (N, ..., V) logits with the classes on the last "
                           "axis, and the target (N, ...) integer class ids (-100 where a "
                           "position is not scored)",
    "nll": "the output must be (N, C) log-probabilities (end the model with LogSoftmax) with "
           "integer class targets (N,); for raw logits pass --loss cross_entropy",
    "mse": "the output and the target must have the same shape; for class labels pass "
           "--loss cross_entropy",
    "l1": "the output and the target must have the same shape; for class labels pass "
          "--loss cross_entropy",
    "bce_with_logits": "the output and the target must have the same shape, with float targets "
                       "in [0, 1]; for integer class labels pass --loss cross_entropy",
}


def resolve_loss(spec: str | Callable) -> tuple[Loss, str]:
    """The loss function and its name, from a built-in name, ``MODULE:CALLABLE`` or a callable.

    A class (an ``nn.Module`` loss such as ``torch.nn.MSELoss``) is instantiated with no
    arguments. The name of a user's loss is its spec, so it never matches a built-in's.
    """
    if callable(spec) and not isinstance(spec, str):
        name = getattr(spec, "__qualname__", None) or type(spec).__name__
        return _instantiate_if_class(spec, name), name
    spec = spec.strip()
    if spec in LOSSES:
        return LOSSES[spec], spec
    found = resolve_callable(spec, "--loss", builtins=LOSSES)  # ConfigError unless MODULE:CALLABLE
    return _instantiate_if_class(found, spec), spec


def resolve_metrics(text: str, flag: str, loss_name: str) -> dict[str, Metric]:
    """The run's metrics: the built-in ones of ``loss_name`` and those "NAME=MODULE:CALLABLE,..."
    names (--metrics, or fit's metrics= as text), each callable imported; ConfigError for text
    that is not that, or a name the built-ins take."""
    from .config.model_options import metric_specs

    try:
        specs = metric_specs(text)
    except ValueError as e:
        raise ConfigError(f"{flag}: invalid value {text!r}; {e}") from None
    builtin = default_metrics(loss_name)
    for name in specs:  # it replaced the built-in accuracy: acc, test_acc and --stop-at on it
        if name in builtin:
            raise ConfigError(f"{flag}: the name {name!r} is the built-in accuracy's under "
                              f"--loss {loss_name}; give your metric a name of its own")
    return {**builtin, **{name: resolve_callable(spec, flag) for name, spec in specs.items()}}


def is_builtin_loss(loss_fn: Callable, loss_name: str) -> bool:
    return LOSSES.get(loss_name) is loss_fn


def accuracy(output: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(number of samples whose highest logit is the target class, number of samples)."""
    if not accuracy_applies(output, target):
        raise ValueError(f"accuracy needs (N, C) outputs and (N,) integer targets, got output "
                         f"{describe(output)} and target {describe(target)}")
    correct = (output.argmax(dim=1) == target).sum()
    return correct, target.shape[0]


def accuracy_applies(output: Any, target: Any) -> bool:
    return (isinstance(output, torch.Tensor) and _class_ids(target)
            and output.dim() == 2 and target.dim() == 1
            and target.shape[0] == output.shape[0])


def integer_labels(dtype: torch.dtype) -> bool:
    """An integer dtype (not bool): what class ids are held in (the data's labels too)."""
    return not dtype.is_floating_point and not dtype.is_complex and dtype is not torch.bool


def _class_ids(target: Any) -> bool:
    return isinstance(target, torch.Tensor) and integer_labels(target.dtype)


def token_accuracy(output: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, Any]:
    """(positions whose highest logit on the last axis is the target, positions scored): the
    accuracy of token_cross_entropy, padding (IGNORE_INDEX) left out."""
    scored = target != IGNORE_INDEX
    return ((output.argmax(dim=-1) == target) & scored).sum(), scored.sum()


def token_accuracy_applies(output: Any, target: Any) -> bool:
    """Class ids shaped as the output without its last axis: the classes are on that axis."""
    return (isinstance(output, torch.Tensor) and _class_ids(target) and output.dim() >= 2
            and tuple(target.shape) == tuple(output.shape[:-1]))


# Keyed by the built-in metric itself: a user's own metric named "acc" has no shape rule.
_APPLIES: dict[Callable, Callable[[Any, Any], bool]] = {accuracy: accuracy_applies,
                                                         token_accuracy: token_accuracy_applies}


def default_metrics(loss_name: str) -> dict[str, Metric]:
    """The metrics a run reports besides its loss: accuracy for a built-in classification loss
    (over the tokens, for token_cross_entropy)."""
    if loss_name == "token_cross_entropy":
        return {"acc": token_accuracy}
    return {"acc": accuracy} if loss_name in CLASSIFICATION_LOSSES else {}


def check_scores_cover_labels(num_classes: int | None, loss_name: str, output: Any,
                              from_command_line: bool) -> None:
    """Labels past the model's scores failed at the first step that drew one (torch's "Target
    7 is out of bounds"), a test label only after a whole epoch: the start-up check's sample
    batch holds a few labels, and the data's range (training and test) is known."""
    if not (num_classes and loss_name in CLASSIFICATION_LOSSES
            and isinstance(output, torch.Tensor) and output.dim() >= 2):
        return
    width = output.shape[1]
    loss = ("--loss " if from_command_line else "loss=") + loss_name
    if width < num_classes:
        raise ConfigError(
            f"{loss}: the labels run to {num_classes - 1} ({num_classes} classes in the "
            f"training and test data), and the model gives {width} scores per sample; build it "
            f"with {num_classes} outputs (a model factory that names num_classes is given it), "
            f"or renumber the labels 0..{width - 1}")


def check_metric_returns(name: str, metric: Metric, output: Any, target: Any) -> None:
    """Run a metric once on the sample batch, before training: one that raises or returns
    anything but (sum, count) fails here, named, not in the middle of the first epoch."""
    try:
        with torch.no_grad():
            value = metric(output, target)
    except Exception as e:
        raise UserCodeError("metrics", repr(name), e) from e
    if isinstance(value, (tuple, list)) and len(value) == 2 and all(map(_is_number, value)):
        return
    got = (f"a {type(value).__name__} of {len(value)}" if isinstance(value, (tuple, list))
           else f"a tensor of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor)
           else f"a {type(value).__name__}")
    raise ConfigError(f"metrics: {name!r} returned {got}; a metric returns (sum, count) over "
                      "the batch, numbers or one-element tensors, e.g. ((output.argmax(1) == "
                      "target).sum(), target.numel()), so that batches and workers add up "
                      "before the one division")


def _is_number(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return value.numel() == 1 and not value.is_complex()
    return isinstance(value, (int, float)) and not isinstance(value, complex)


def metric_applies(metric: Metric, output: Any, target: Any) -> bool:
    """Whether ``metric``, a built-in one, is defined for this output and target; a metric
    without a shape rule (a user's own) applies always."""
    rule = _APPLIES.get(metric)
    return rule is None or rule(output, target)


def check_loss_accepts(loss_fn: Callable, loss_name: str, output: torch.Tensor,
                       target: torch.Tensor) -> None:
    """Run the loss once on a sample batch, before training, so a mismatch between the model, the
    data and the loss fails with a ConfigError that names --loss, both shapes and the fix.

    A user's loss that raises is a UserCodeError (their bug). A loss must return a scalar tensor
    that autograd can take back to ``output``.
    """
    builtin = is_builtin_loss(loss_fn, loss_name)
    shapes = f"the model's output is {describe(output)} and the target {describe(target)}"
    fix = _FIX.get(loss_name, "")
    if builtin:
        _refuse_silent_mismatches(loss_name, output, target, shapes, fix)
    try:
        value = loss_fn(output, target)
    except Exception as e:
        if not builtin:
            raise UserCodeError("--loss", loss_name, e) from e
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"--loss {loss_name}: cannot score the output against the target: "
                          f"{shapes} ({reason}); {fix}") from None
    if not isinstance(value, torch.Tensor):
        raise ConfigError(f"--loss {loss_name} returned a {type(value).__name__}, not a tensor; "
                          "return a scalar torch.Tensor computed from the output (not .item()), "
                          "so that gradients flow")
    if value.numel() != 1:
        raise ConfigError(f"--loss {loss_name} returned a tensor of shape {tuple(value.shape)}, "
                          f"not a scalar ({shapes}); reduce it to the batch mean, e.g. "
                          "return loss.mean()")
    if getattr(output, "requires_grad", False) and not value.requires_grad:
        raise ConfigError(f"--loss {loss_name} returned a tensor with no gradient: it does not "
                          "depend on the output through autograd; compute it with torch "
                          "operations on the output (no .item(), .detach() or numpy)")


def _refuse_text_targets(loss_name: str, target: Any) -> None:
    """A Dataset's label names, which default_collate batches as a list of strings: torch's
    words were "'tuple' object has no attribute 'dtype'", which blamed the loss."""
    if isinstance(target, (tuple, list)) and target and all(isinstance(t, str) for t in target):
        raise ConfigError(f"--loss {loss_name}: the data's targets are text ({target[0]!r}, ...), "
                          "which a built-in loss cannot score; return class indices 0..K-1 from "
                          "the dataset (e.g. NAMES.index(name), NAMES the sorted label names), "
                          "or numbers for a regression loss")


def _refuse_silent_mismatches(loss_name: str, output: Any, target: Any, shapes: str,
                              fix: str) -> None:
    """The mismatches a built-in loss would train on without an error, or without learning,
    or refuse with torch's own words, which do not say what to change."""
    _refuse_text_targets(loss_name, target)
    if not isinstance(output, torch.Tensor):  # a dict, a tuple, a ModelOutput
        raise ConfigError(f"--loss {loss_name}: the model's output is {describe(output)}, not "
                          "a tensor; a built-in loss scores the tensor that forward returns: "
                          "return the logits from forward (e.g. out.logits or out['logits']), "
                          "or pass your own --loss MODULE:CALLABLE that reads them from the "
                          "output")
    if (loss_name in _ELEMENTWISE_LOSSES and isinstance(target, torch.Tensor)
            and output.shape != target.shape):
        # mse and l1 only warn, then broadcast (N, 1) against (N,) into an (N, N) loss
        raise ConfigError(f"--loss {loss_name}: {shapes}, shapes that differ; {fix}")
    if (loss_name in CLASSIFICATION_LOSSES and token_accuracy_applies(output, target)
            and output.dim() > 2):
        # torch reads classes from axis 1: with T == V a language model's (N, T, V) logits
        # train the wrong objective without an error (and fail obscurely otherwise)
        raise ConfigError(f"--loss {loss_name}: {shapes}: the target matches the output without "
                          "its last axis, so the classes are on the last axis (a language "
                          f"model's logits), where {loss_name} reads them from axis 1; pass "
                          "--loss token_cross_entropy" + (
                              " (it takes raw logits: drop the LogSoftmax, or pass your own "
                              "loss)" if loss_name == "nll" else "") +
                          ". For classes on axis 1 (segmentation) whose sizes happen to agree, "
                          "pass your own --loss MODULE:CALLABLE")
    if (loss_name in {*CLASSIFICATION_LOSSES, "token_cross_entropy"}
            and isinstance(target, torch.Tensor)
            and target.is_floating_point() and target.dim() == output.dim() - 1
            and bool(torch.equal(target, target.round()))):
        # torch's message ("expected scalar type Long") reads as if the loss were wrong
        raise ConfigError(f"--loss {loss_name}: {shapes}: the targets are whole numbers held as "
                          "floats; class ids must be integers: convert them with .long() where "
                          "your data makes them. For real-valued targets pass --loss mse or l1")
    if (loss_name in CLASSIFICATION_LOSSES and isinstance(target, torch.Tensor)
            and output.dim() > 2
            and not target.is_floating_point() and target.dim() < output.dim() - 1):
        # (N, 1, C) against (N,): read as one class on axis 1 ("one output column")
        raise ConfigError(f"--loss {loss_name}: {shapes}: the output has more axes than class "
                          "scores for the target's labels need, (N, C) for (N,) labels; drop "
                          "the extra axes in forward (e.g. .squeeze(1) or .flatten(1))")
    if loss_name in CLASSIFICATION_LOSSES and output.dim() >= 2 and output.shape[1] == 1:
        # One class: every softmax is 1 and the loss 0 for any weights, so nothing would train.
        raise ConfigError(f"--loss {loss_name}: {shapes}, one output column, i.e. one class; "
                          "a classifier needs a column per class. For a single output use "
                          "--loss bce_with_logits (binary) or --loss mse (regression)")


def describe(value: Any) -> str:
    """Shape and dtype, for error messages: (8, 10) torch.float32."""
    if isinstance(value, torch.Tensor):
        return f"{tuple(value.shape)} {value.dtype}"
    return f"of type {type(value).__name__}"  # a user's class name reads badly after "a"


def _instantiate_if_class(found: Callable, spec: str) -> Loss:
    if isinstance(found, type):  # an nn.Module loss class: the instance is the loss
        return call_user(found, "--loss", spec)
    return found
