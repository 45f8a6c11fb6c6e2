"""The ports through which an engine reaches the other workers. A backend implements one:
Horovod and torch.distributed in sync/, a virtual collective in compare/sim/, a fake in the
engines' unit tests. Everything here is collective: every worker calls the same methods in the
same order (as with any allreduce), and a port's ``name`` arguments only label the operation
for backends that match operations by name (Horovod)."""

from __future__ import annotations

from typing import Any, Protocol, Sequence

import torch


class PendingValues(Protocol):
    """A sum started now and read later (the stop vote: started at one vote, read at the next)."""

    def wait(self) -> list[int]: ...


class CollectivePort(Protocol):
    """What an engine may ask of the other workers."""

    @property
    def rank(self) -> int: ...

    @property
    def size(self) -> int: ...

    def average_(self, tensors: Sequence[tuple[str, torch.Tensor]]) -> None:
        """Every tensor becomes its mean across workers, in place (all started before any is
        awaited, so that a backend may fuse them)."""

    def average_gradients(self, params: Sequence[torch.Tensor]) -> None:
        """The gradients of ``params`` become their mean across workers (sync's step). A backend
        may have started the reduction during backward already (Horovod's hooks): then this
        waits for it."""

    def broadcast_(self, tensors: Sequence[tuple[str, torch.Tensor]]) -> None:
        """Every tensor becomes worker 0's, in place (the start: every replica from worker 0's
        parameters and buffers)."""

    def sum(self, values: Sequence[float], name: str = "sum") -> list[float]:
        """The float64 sum of ``values`` across workers."""

    def start_sum(self, values: Sequence[int], name: str = "vote") -> PendingValues:
        """A sum of integers (exact) that the caller reads later with ``wait()``."""

    def broadcast_object(self, obj: Any, name: str = "object") -> Any:
        """Worker 0's ``obj`` on every worker."""

    def gather_object(self, obj: Any, name: str = "gather") -> list[Any]:
        """Every worker's ``obj``, in rank order, on every worker."""

    def agree(self, value: int, name: str = "agree") -> tuple[int, int]:
        """(smallest, largest) of ``value`` across workers: whether the workers agree on it."""

    def barrier(self) -> None:
        """Returns once every worker has called it."""
