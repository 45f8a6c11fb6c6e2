"""This rank's copy of the model and the arithmetic of one forward and backward pass.

Update schemes decide what happens to the gradients (allreduce, push to a server); the replica
only computes them. A pipelined replica (pipeline.py) replaces this one behind the same methods.
What a batch is scored by (the loss and the metrics) comes from the workload, as an Objective.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn as nn

from .data.batches import to_device
from .precision import Precision

Metric = Callable[[Any, Any], "tuple[Any, Any] | None"]  # (output, target) -> (sum, count)


@dataclass
class BatchStats:
    """Sums over one batch (not means), so that they add across micro-batches and workers."""

    loss_sum: torch.Tensor  # detached scalar tensor: reading it is the caller's choice
    count: int
    metrics: dict[str, tuple[Any, Any]] = field(default_factory=dict)  # name -> (sum, count)
    # What loss_sum sums over: the samples (count), or the units a loss weighs its mean by
    # (loss_weight_of: token_cross_entropy's scored tokens), so that a mean over several
    # batches, micro-batches or workers is the loss's own mean over all of them.
    loss_weight: Any = None

    def __post_init__(self) -> None:
        if self.loss_weight is None:
            self.loss_weight = self.count

    def __iadd__(self, other: "BatchStats") -> "BatchStats":
        self.loss_sum = self.loss_sum + other.loss_sum
        self.count += other.count
        self.loss_weight = self.loss_weight + other.loss_weight
        for name, (s, c) in other.metrics.items():
            mine = self.metrics.get(name)
            self.metrics[name] = (s, c) if mine is None else (mine[0] + s, mine[1] + c)
        return self

    def mean_loss(self) -> float:
        """The loss's mean over what it weighs (the samples, or the scored tokens)."""
        weight = self.loss_weight
        if isinstance(weight, torch.Tensor):  # one read, not two, of a loss on a GPU
            return (self.loss_sum / weight.clamp(min=1)).item()
        return self.loss_sum.item() / max(weight, 1)


def loss_weight_of(loss: Callable) -> Callable[[Any, Any], Any] | None:
    """A loss's own weight of a batch, (output, target) -> how many units its mean is over,
    where it gives one as its ``loss_weight`` attribute (token_cross_entropy: the positions not
    ignored; a user's loss may too), else None: the batch's samples."""
    return getattr(loss, "loss_weight", None)


def batch_length(obj: Any) -> int:
    """Samples in a batch: the length of its first tensor (targets may be nested)."""
    if isinstance(obj, torch.Tensor):
        return len(obj) if obj.dim() else 1
    if isinstance(obj, dict):
        return batch_length(next(iter(obj.values())))
    if isinstance(obj, (list, tuple)) and obj:
        return batch_length(obj[0])
    raise TypeError(f"cannot count the samples of a batch of type {type(obj).__name__}")


def call_model(model: Callable, x: Any) -> Any:
    """A tensor input is model(x); a tuple or list is model(*x); a dict is model(**x)."""
    if isinstance(x, dict):
        return model(**x)
    if isinstance(x, (list, tuple)):
        return model(*x)
    return model(x)


class Objective:
    """The loss that is minimised and the metrics that are reported beside it."""

    def __init__(self, loss: Callable[[Any, Any], torch.Tensor],
                 metrics: dict[str, Metric] | None = None):
        self.loss = loss
        self.metrics = dict(metrics or {})

    @classmethod
    def classification(cls) -> "Objective":
        """The default: cross entropy, with accuracy beside it."""
        from .losses import accuracy
        return cls(torch.nn.functional.cross_entropy, {"acc": accuracy})

    def score(self, output: Any, target: Any) -> tuple[torch.Tensor, BatchStats]:
        """The batch's mean loss (with its graph) and its sums."""
        loss = self.loss(output, target)
        n = batch_length(target)
        sums: dict[str, tuple[Any, Any]] = {}
        with torch.no_grad():
            for name, metric in self.metrics.items():
                result = metric(output, target)
                if result is not None:  # a metric that does not apply to this output says None
                    sums[name] = result
        weigh = loss_weight_of(self.loss)
        weight = n if weigh is None else weigh(output, target)
        # float32 sums: a bfloat16 loss (autocast) would lose digits as the epoch adds them up
        return loss, BatchStats(loss.detach().float() * weight, n, sums, weight)


class Replica:
    backward_passes = 1  # backward passes per forward_backward call (a pipeline makes one per
                         # micro-batch); Horovod must wait for all of them before it allreduces

    def __init__(self, model: nn.Module, device: torch.device,
                 objective: Objective | None = None, precision: Precision | None = None):
        self.model = model.to(device)
        self.device = device  # where the inputs go
        self.devices = [device]
        self.objective = objective or Objective.classification()
        self.precision = precision or Precision("32", self.devices)
        # What a forward pass calls: the model, or its torch.compile wrapper (--compile), which
        # shares its parameters; self.model stays the plain module, so checkpoints and
        # state_dict keys are the same with and without --compile.
        self.run_model: Any = self.model

    def parameters(self):
        return self.model.parameters()

    @contextlib.contextmanager
    def eager(self):
        """Forward passes without --compile's wrapper inside: for the one-batch check before
        training, where compiling a graph for its 2 samples would only add a compile."""
        compiled, self.run_model = self.run_model, self.model
        try:
            yield self
        finally:
            self.run_model = compiled

    def forward(self, x: Any) -> Any:
        with self.precision.autocast(self.device):
            return call_model(self.run_model, x)

    def describe(self) -> str:
        return str(self.device)

    def take_epoch_metrics(self) -> dict:
        """Extra figures for this epoch's log line (loss scale, clipping, a pipeline's stage
        times); then reset."""
        return self.precision.take_epoch_metrics()

    def update(self, optimizer: torch.optim.Optimizer) -> bool:
        """Unscale, clip and step (precision.py); False when the step was skipped."""
        return self.precision.update(optimizer, [p for p in self.parameters()
                                                 if p.grad is not None])

    def forward_backward(self, x: Any, y: Any, grad_scale: float) -> BatchStats:
        """Add d(grad_scale * mean loss)/d(params) to the gradients (times the loss scale under
        fp16); return the batch's sums."""
        with self.precision.autocast(self.device):
            loss, stats = self.objective.score(call_model(self.run_model, x), y)
        self.precision.backward(loss * grad_scale if grad_scale != 1.0 else loss)
        return stats

    @torch.no_grad()
    def evaluate(self, batches) -> BatchStats | None:
        """Sums over (x, y) batches in eval mode; None when there were none."""
        was_training = self.model.training
        self.model.eval()
        total: BatchStats | None = None
        try:
            for x, y in batches:
                output = self.forward(x)
                device = output_device(output)
                with self.precision.autocast(device or self.device):
                    _, stats = self.objective.score(
                        output, y if device is None else to_device(y, device))
                if total is None:
                    total = stats
                else:
                    total += stats
        finally:
            self.model.train(was_training)
        if total is not None and not torch.isfinite(total.loss_sum).all():
            # NaN in the test data (or a diverged model): argmax over NaN outputs still counted
            # "correct" samples, and reported an accuracy. NaN sums stay NaN across workers.
            total.metrics = {name: (float("nan"), count)
                             for name, (_, count) in total.metrics.items()}
        return total


class ScoredWith:
    """``replica`` scored with other weights than its live ones, and trained on untouched: its
    ``evaluate`` copies ``weights`` into ``live`` (tensors in the same order and shapes; the
    tensors the model reads, or a flat buffer they are views of), scores, and copies the live
    values back, calling ``refresh`` (if given) after each copy for a model that reads copies
    of ``live``. For DiLoCo's evaluations inside a round: the model the workers last agreed on
    is scored, and the round goes on as if nothing had read it. Anything else is the
    replica's own."""

    def __init__(self, replica: Replica, live: list[torch.Tensor], weights: list[torch.Tensor],
                 refresh: Callable[[], None] = lambda: None):
        self.replica, self.live, self.weights, self.refresh = replica, live, weights, refresh

    @torch.no_grad()
    def evaluate(self, batches) -> BatchStats | None:
        stash = [t.clone() for t in self.live]  # one model's copy, while it is scored
        for t, w in zip(self.live, self.weights):
            t.copy_(w)
        self.refresh()
        try:
            return self.replica.evaluate(batches)
        finally:
            for t, kept in zip(self.live, stash):
                t.copy_(kept)
            self.refresh()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.replica, name)


def output_device(output: Any) -> torch.device | None:
    if isinstance(output, torch.Tensor):
        return output.device
    if isinstance(output, dict):
        return output_device(next(iter(output.values()), None))
    if isinstance(output, (list, tuple)) and output:
        return output_device(output[0])
    return None


def split_batch(obj: Any, parts: int) -> list[Any]:
    """A batch (a tensor, or a tuple/list/dict of them) cut into ``parts`` consecutive pieces
    along the sample dimension, as torch.tensor_split cuts a tensor."""
    if isinstance(obj, torch.Tensor):
        return list(obj.tensor_split(parts))
    if isinstance(obj, dict):
        pieces = {k: split_batch(v, parts) for k, v in obj.items()}
        return [{k: v[i] for k, v in pieces.items()} for i in range(parts)]
    if isinstance(obj, (list, tuple)):
        columns = [split_batch(v, parts) for v in obj]
        return [type(obj)(col[i] for col in columns) for i in range(parts)]
    raise TypeError(f"cannot split a batch of type {type(obj).__name__}")
