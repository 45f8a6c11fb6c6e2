"""This rank's copy of the model and the arithmetic of one forward and backward pass.

Update schemes decide what happens to the gradients (allreduce, push to a server); the replica
only computes them. A pipelined replica (pipeline.py) replaces this one behind the same methods.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class BatchStats:
    """Sums over one batch (not means), so that they add across micro-batches and workers."""

    loss_sum: torch.Tensor  # detached scalar tensor: reading it is the caller's choice
    correct: torch.Tensor
    count: int

    def __iadd__(self, other: "BatchStats") -> "BatchStats":
        self.loss_sum = self.loss_sum + other.loss_sum
        self.correct = self.correct + other.correct
        self.count += other.count
        return self


class Replica:
    backward_passes = 1  # backward passes per forward_backward call (a pipeline makes one per
                         # micro-batch); Horovod must wait for all of them before it allreduces

    def __init__(self, model: nn.Module, device: torch.device):
        self.model = model.to(device)
        self.device = device  # where the inputs go
        self.devices = [device]

    def parameters(self):
        return self.model.parameters()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    def describe(self) -> str:
        return str(self.device)

    def take_epoch_metrics(self) -> dict:
        """Extra figures for this epoch's log line (the pipeline's stage times); then reset."""
        return {}

    def forward_backward(self, x: torch.Tensor, y: torch.Tensor, grad_scale: float) -> BatchStats:
        """Add d(grad_scale * mean loss)/d(params) to the gradients; return the batch's sums."""
        logits = self.model(x)
        loss = F.cross_entropy(logits, y)
        (loss * grad_scale if grad_scale != 1.0 else loss).backward()
        with torch.no_grad():
            correct = (logits.argmax(dim=1) == y).sum()
        return BatchStats(loss.detach() * len(y), correct, len(y))

    @torch.no_grad()
    def evaluate(self, x: torch.Tensor, y: torch.Tensor, batch_size: int = 1024) -> BatchStats:
        was_training = self.model.training
        self.model.eval()
        out = self.devices[-1]  # where the logits come out
        total = BatchStats(torch.zeros((), device=out), torch.zeros((), device=out), 0)
        for start in range(0, len(x), batch_size):
            xb, yb = x[start:start + batch_size], y[start:start + batch_size]
            logits = self.forward(xb)
            yb = yb.to(logits.device)
            total += BatchStats(F.cross_entropy(logits, yb, reduction="sum"),
                                (logits.argmax(dim=1) == yb).sum(), len(yb))
        self.model.train(was_training)
        return total
