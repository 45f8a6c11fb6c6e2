"""Grouped allreduces whose tensors are views into one flat buffer (hvdtrain.sync.flat_gradients),
against separate tensors, and one where rank 0 has views and the others separate tensors; run
under horovodrun or mpirun with HOROVOD_TIMELINE set (tests/multiproc/test_zero_copy_allreduce_
multiproc.py). Prints ``RESULT {json}``: for each group, whether every rank got the average (or
the sum)."""

import json

import torch

import horovod.torch as hvd
from hvdtrain.sync.flat_gradients import FlatGradients

SHAPES = [(300, 200), (200,), (7, 300), (7,)]

hvd.init()
rank, size = hvd.rank(), hvd.size()


def in_one_buffer() -> list[torch.Tensor]:
    params = [torch.nn.Parameter(torch.zeros(shape)) for shape in SHAPES]
    FlatGradients(params)
    return [p.grad for p in params]


def separate() -> list[torch.Tensor]:
    return [torch.zeros(shape) for shape in SHAPES]


def ramp(tensor: torch.Tensor) -> torch.Tensor:
    """0, 1/n, 2/n, ... shaped like ``tensor``: every element differs, so a misplaced one shows."""
    return torch.arange(tensor.numel()).reshape(tensor.shape) / tensor.numel()


def reduced_right(tensors: list[torch.Tensor], name: str, op=hvd.Average) -> bool:
    for i, tensor in enumerate(tensors):  # tensor i on rank r: r + i + its ramp
        tensor.copy_(rank + i + ramp(tensor))
    hvd.grouped_allreduce_(tensors, op=op, name=name)
    ranks = (size - 1) / 2 if op == hvd.Average else size * (size - 1) / 2  # of r
    scale = 1 if op == hvd.Average else size
    return all(torch.allclose(t, scale * (i + ramp(t)) + ranks) for i, t in enumerate(tensors))


results = {
    "flat": reduced_right(in_one_buffer(), "flat"),
    "flat_sum": reduced_right(in_one_buffer(), "flat_sum", op=hvd.Sum),
    "separate": reduced_right(separate(), "separate"),
    "mixed": reduced_right(in_one_buffer() if rank == 0 else separate(), "mixed"),
}
everyone = hvd.allgather_object(results)
if rank == 0:
    print("RESULT " + json.dumps({k: all(r[k] for r in everyone) for k in results}), flush=True)
hvd.shutdown()  # writes out the timeline
