"""Gradients kept in one flat buffer per device and dtype, so that Horovod allreduces them where
they are.

Horovod copies every gradient of a fused allreduce into its fusion buffer and back out: two
passes over the model per step. hvdtrain's Horovod build
(scripts/setup/horovod-0.28.1-zero-copy-allreduce.patch) skips both when the tensors already lie
back to back in the order Horovod fuses them, which is the order of the optimizer's parameters
with one gradient group (sync.gradient_groups). The buffer also outlives the step, where a
gradient set to None is made again by the next backward. Measured on 2 cores (scripts/
bench_sync.py's MLP of 2.1M parameters, horovodrun --gloo, 4 interleaved rounds, with
freed_memory.py's malloc settings): 7,590 samples/s at np=2 against 6,866 without the buffer;
at np=1, where nothing is reduced, zeroing and adding into the buffer made it 0.87, so a single
rank goes without (docs/benchmarks.md, "Stop 41").

Backward adds into ``p.grad`` in place when it exists, and Horovod writes the average back into
the same tensor, so the views stay views. Anything that moves a gradient elsewhere instead (set
to None, a new tensor, ``set_``) is put back into the buffer at the next ``zero()``. The sync
scheme uses it where it pays: one gradient group, uncompressed, averaged (not Adasum).
"""

from __future__ import annotations

from typing import Iterable

import torch


class FlatGradients:
    """``p.grad`` of every parameter that trains, as views into one zeroed buffer per (device,
    dtype), in the order given; ``zero()`` replaces ``optimizer.zero_grad()``."""

    def __init__(self, parameters: Iterable[torch.Tensor]):
        self.parameters = [p for p in parameters if p.requires_grad]
        kinds: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
        for p in self.parameters:
            kinds.setdefault((p.device, p.dtype), []).append(p)
        self.buffers: list[torch.Tensor] = []
        places: dict[int, tuple[torch.Tensor, int]] = {}  # where each gradient lives
        for (device, dtype), members in kinds.items():
            buffer = torch.zeros(sum(p.numel() for p in members), device=device, dtype=dtype)
            offset = 0
            for p in members:
                if p.grad is not None:  # a gradient already there is kept
                    buffer[offset:offset + p.numel()].copy_(p.grad.reshape(-1))
                places[id(p)] = (buffer, offset)
                offset += p.numel()
            self.buffers.append(buffer)
        self._places = [places[id(p)] for p in self.parameters]
        self._addresses = [buffer.data_ptr() + offset * buffer.element_size()
                           for buffer, offset in self._places]
        self._put_back()

    def zero(self) -> None:
        """Zero every gradient: one fill per buffer."""
        for buffer in self.buffers:
            buffer.zero_()
        self._put_back()

    def _put_back(self) -> None:
        # An address test per parameter: a gradient set to None, replaced (Horovod's
        # broadcast_optimizer_state gives each parameter a new zero gradient) or pointed at other
        # memory (Tensor.set_, as Horovod's optimizer does with a decompressed average) would
        # otherwise keep its old values while the buffer is zeroed.
        for p, (buffer, offset), address in zip(self.parameters, self._places, self._addresses):
            if p.grad is None or p.grad.data_ptr() != address:
                p.grad = buffer[offset:offset + p.numel()].view_as(p)
