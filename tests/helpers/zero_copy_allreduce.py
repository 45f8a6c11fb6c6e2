"""Grouped allreduces whose tensors are views into one flat buffer (hvdtrain.flat_gradients),
against separate tensors, and one where rank 0 has views and the others separate tensors; run
under horovodrun or mpirun with HOROVOD_TIMELINE set (tests/multiproc/test_zero_copy_allreduce_
multiproc.py). Prints ``RESULT {json}``: for each group, whether every rank got the average."""

import json

import torch

import horovod.torch as hvd
from hvdtrain.flat_gradients import FlatGradients

SHAPES = [(300, 200), (200,), (7, 300), (7,)]

hvd.init()
rank, size = hvd.rank(), hvd.size()


def in_one_buffer() -> list[torch.Tensor]:
    params = [torch.nn.Parameter(torch.zeros(shape)) for shape in SHAPES]
    FlatGradients(params)
    return [p.grad for p in params]


def separate() -> list[torch.Tensor]:
    return [torch.zeros(shape) for shape in SHAPES]


def averaged_right(tensors: list[torch.Tensor], name: str, op=hvd.Average) -> bool:
    for i, tensor in enumerate(tensors):  # element j of tensor i on rank r: r + i + j / numel
        tensor.copy_(rank + i + torch.arange(tensor.numel()).reshape(tensor.shape) / tensor.numel())
    hvd.grouped_allreduce_(tensors, op=op, name=name)
    mean_rank = (size - 1) / 2 if op == hvd.Average else size * (size - 1) / 2
    scale = 1 if op == hvd.Average else size
    return all(torch.allclose(t, scale * (i + torch.arange(t.numel()).reshape(t.shape) / t.numel())
                              + mean_rank)
               for i, t in enumerate(tensors))


results = {
    "flat": averaged_right(in_one_buffer(), "flat"),
    "flat_sum": averaged_right(in_one_buffer(), "flat_sum", op=hvd.Sum),
    "separate": averaged_right(separate(), "separate"),
    "mixed": averaged_right(in_one_buffer() if rank == 0 else separate(), "mixed"),
}
everyone = hvd.allgather_object(results)
if rank == 0:
    print("RESULT " + json.dumps({k: all(r[k] for r in everyone) for k in results}), flush=True)
hvd.shutdown()  # writes out the timeline
