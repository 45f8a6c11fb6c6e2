"""A loss whose value stays finite but whose gradient is NaN in one training step of one worker,
as an fp16 overflow leaves it: cross entropy plus sqrt(0 * sum(output)), which adds 0 to the loss
and 0 * inf = NaN to every gradient. Which worker and which step come from the environment:
OVERFLOW_RANK (the launcher's rank, default 1) and OVERFLOW_CALL (the n-th loss call with
gradients on that rank, default 6)."""

import os

import torch

calls = 0


def loss(output, target):
    global calls
    value = torch.nn.functional.cross_entropy(output.float(), target)
    rank = os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("HOROVOD_RANK", "0"))
    if torch.is_grad_enabled() and output.requires_grad:
        calls += 1
        if rank == os.environ.get("OVERFLOW_RANK", "1") and \
                calls == int(os.environ.get("OVERFLOW_CALL", "6")):
            value = value + torch.sqrt(output.float().sum() * 0)
    return value
