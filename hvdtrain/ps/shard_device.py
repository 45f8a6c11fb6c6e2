"""A server's shard on a GPU (``--server-device cuda|auto``): the master parameters and the
optimizer state live on the server rank's device, and the update runs there.

MPI moves host memory, so the shard keeps a host copy of its parameters: the buffer the replies
are sent from (pinned; the shared-memory window for the workers of the server's host), which
the apply step's adjustments (DC-ASGD) and the engine read. Each chunk of a push goes
host -> device (its gradient), is updated on the device, and comes back device -> host (the
chunk's fresh parameters) before its reply is sent, so the host copy always holds what the
device holds between two chunks. On the CPU (the default, ``cpu``) none of this exists: the
shard optimizer updates the host buffer itself (shard.py builds a plain ShardOptimizer).

The device is a parameter, so the same code runs with ``device=cpu`` in the tests, with two
distinct buffers and real copies between them.
"""

from __future__ import annotations

import torch

from ..config import OptimConfig
from .shard_optimizer import ShardOptimizer


class DeviceShardOptimizer:
    """ShardOptimizer's interface (params, chunks, vectors, apply, scalars, load) over a master
    copy on ``device``; ``params`` is the host copy that MPI sends from."""

    def __init__(self, params: torch.Tensor, chunks: list[tuple[int, int]], cfg: OptimConfig,
                 outer, device: torch.device):
        self.params, self.chunks, self.device = params, chunks, device
        self.cuda = device.type == "cuda"
        self.master = torch.empty(params.numel(), dtype=torch.float32, device=device)
        self.inner = ShardOptimizer(self.master, chunks, cfg, outer)  # its state: on the device
        longest = max(b - a for a, b in chunks)
        self.gradient = torch.empty(longest, dtype=torch.float32, device=device)
        self.params_received()

    @property
    def vectors(self) -> dict[str, torch.Tensor]:
        return self.inner.vectors

    def params_received(self) -> None:
        """The host copy was written (INIT's parameters): the master copy takes it."""
        self.master.copy_(self.params)

    def apply(self, chunk: int, grad: torch.Tensor, lr: float) -> None:
        """Update chunk ``chunk`` on the device, then bring it back to the host copy. The copy
        back is blocking: the reply sends the host copy as soon as this returns. It also ends
        the gradient's non-blocking copy, so the buffer ``grad`` lives in may take the next
        chunk."""
        a, b = self.chunks[chunk]
        staged = self.gradient[:b - a]
        staged.copy_(grad, non_blocking=self.cuda)
        self.inner.apply(chunk, staged, lr)
        self.params[a:b].copy_(self.master[a:b])

    def scalars(self) -> dict[str, float]:
        return self.inner.scalars()

    def load(self, vectors: dict[str, torch.Tensor], scalars: dict[str, float]) -> None:
        self.inner.load(vectors, scalars)  # copy_ moves a checkpoint's CPU tensors over


def host_buffer(n: int, device: torch.device) -> torch.Tensor:
    """The host copy of a shard that is not in a shared window: pinned for a GPU shard, so that
    its chunks cross the bus at full speed."""
    return torch.zeros(n, dtype=torch.float32, pin_memory=device.type == "cuda")


def shard_optimizer_on(device: torch.device, params: torch.Tensor,
                       chunks: list[tuple[int, int]], cfg: OptimConfig, outer=None):
    """The shard's optimizer: on the CPU today's ShardOptimizer over the host buffer itself;
    elsewhere the device's master copy behind the same interface."""
    if device.type == "cpu":
        return ShardOptimizer(params, chunks, cfg, outer)
    return DeviceShardOptimizer(params, chunks, cfg, outer, device)
