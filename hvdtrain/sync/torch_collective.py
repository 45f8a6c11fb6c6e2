"""The collective port (engines/ports.py) over torch.distributed: ``--collective torch``.

Gloo on CPUs, NCCL on GPUs (sync/torch_runtime.py starts the process group). Averages are a sum
then a division, as Horovod's Average is on Gloo (Gloo has no average), so both backends round
alike. Tensors of one device and dtype travel in one allreduce, as Horovod's tensor fusion packs
them: in place where they already lie back to back in one buffer (flat_gradients.py), else
through a flat copy. Operation names label Horovod's collectives; torch.distributed matches its
collectives by order, so they are ignored here.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.distributed as dist

from ..flat_views import shaped_views


class _PendingSum:
    """An integer sum in flight (the stop vote): started now, read at the next vote."""

    def __init__(self, work: Any, tensor: torch.Tensor):
        self._work, self._tensor = work, tensor

    def wait(self) -> list[int]:
        if self._work is not None:
            self._work.wait()
            self._work = None
        return [int(v) for v in self._tensor.tolist()]


def contiguous_run(tensors: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """One flat view over ``tensors`` if they lie back to back, in this order, in one storage
    (flat_gradients.py's buffer); else None."""
    first = tensors[0]
    offset, size = first.storage_offset(), 0
    for t in tensors:
        if not t.is_contiguous() or t.dtype != first.dtype or t.device != first.device or \
                t.untyped_storage().data_ptr() != first.untyped_storage().data_ptr() or \
                t.storage_offset() != offset + size:
            return None
        size += t.numel()
    return torch.as_strided(first, (size,), (1,), offset)


def by_kind(tensors: Sequence[torch.Tensor]) -> list[list[torch.Tensor]]:
    """``tensors`` grouped by (device, dtype), each group in the given order: one allreduce each
    (a pipelined replica spans devices)."""
    kinds: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for t in tensors:
        kinds.setdefault((t.device, t.dtype), []).append(t)
    return list(kinds.values())


def _scatter(flat: torch.Tensor, tensors: Sequence[torch.Tensor]) -> None:
    """Copy consecutive pieces of ``flat`` back into ``tensors``."""
    for t, piece in zip(tensors, shaped_views(flat, tensors)):
        t.copy_(piece)


class TorchCollective:
    """CollectivePort over the default torch.distributed process group. ``device``: where its
    small tensors (sums, votes) live, the rank's GPU under NCCL (which reduces nothing on the
    CPU). ``compression="fp16"``: gradients travel as float16, as Horovod's Compression.fp16."""

    def __init__(self, device: torch.device | str = "cpu", compression: str = "none"):
        self.device = torch.device(device)
        self.compression = compression
        self._rank, self._size = dist.get_rank(), dist.get_world_size()

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def size(self) -> int:
        return self._size

    def average_(self, tensors: Sequence[tuple[str, torch.Tensor]]) -> None:
        if self._size > 1 and tensors:
            self._average([t for _, t in tensors])

    def average_gradients(self, params: Sequence[torch.Tensor]) -> None:
        if self._size == 1:
            return
        grads = []
        for p in params:
            if p.requires_grad:
                if p.grad is None:  # as Horovod: a parameter without a gradient sends zeros
                    p.grad = torch.zeros_like(p)
                grads.append(p.grad)
        if grads:
            self._average(grads, self.compression == "fp16")

    def _average(self, tensors: list[torch.Tensor], half: bool = False) -> None:
        """Every tensor becomes its mean: every group's allreduce started before any is
        awaited (Gloo runs them on its own threads), then each divided where it lies."""
        with torch.no_grad():
            pending = []
            for group in by_kind(tensors):
                flat = contiguous_run(group)
                sent = flat if flat is not None else torch.cat([t.reshape(-1) for t in group])
                if half and sent.is_floating_point() and sent.dtype != torch.float16:
                    sent = sent.to(torch.float16)
                pending.append((group, flat, sent,
                                dist.all_reduce(sent, op=dist.ReduceOp.SUM, async_op=True)))
            for group, flat, sent, work in pending:
                work.wait()
                sent.div_(self._size)
                if flat is not None and sent is flat:
                    continue  # reduced where the tensors lie
                if flat is not None:
                    flat.copy_(sent)
                    continue
                _scatter(sent, group)

    def broadcast_(self, tensors: Sequence[tuple[str, torch.Tensor]]) -> None:
        """Every tensor becomes rank 0's: one broadcast per device and dtype, in the given order
        (the same on every rank: a model's state_dict)."""
        if self._size == 1 or not tensors:
            return
        with torch.no_grad():
            pending = []
            for group in by_kind([t for _, t in tensors]):
                flat = contiguous_run(group)
                sent = flat if flat is not None else torch.cat([t.reshape(-1) for t in group])
                pending.append((group, flat, sent, dist.broadcast(sent, src=0, async_op=True)))
            for group, flat, sent, work in pending:
                work.wait()
                if flat is None:
                    _scatter(sent, group)

    def sum(self, values: Sequence[float], name: str = "sum") -> list[float]:
        tensor = torch.tensor(list(values), dtype=torch.float64, device=self.device)
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor.tolist()

    def start_sum(self, values: Sequence[int], name: str = "vote") -> _PendingSum:
        tensor = torch.tensor(list(values), dtype=torch.int64, device=self.device)
        return _PendingSum(dist.all_reduce(tensor, op=dist.ReduceOp.SUM, async_op=True), tensor)

    def broadcast_object(self, obj: Any, name: str = "object") -> Any:
        box = [obj]
        dist.broadcast_object_list(box, src=0, device=self._object_device())
        return box[0]

    def gather_object(self, obj: Any, name: str = "gather") -> list[Any]:
        out: list[Any] = [None] * self._size
        dist.all_gather_object(out, obj)
        return out

    def agree(self, value: int, name: str = "agree") -> tuple[int, int]:
        # One allreduce: the largest of -value is minus the smallest value.
        both = torch.tensor([int(value), -int(value)], dtype=torch.int64, device=self.device)
        dist.all_reduce(both, op=dist.ReduceOp.MAX)
        return -int(both[1]), int(both[0])

    def barrier(self) -> None:
        if self.device.type == "cuda":
            dist.barrier(device_ids=[self.device.index or 0])
        else:
            dist.barrier()

    def _object_device(self) -> torch.device | None:
        return self.device if self.device.type == "cuda" else None
