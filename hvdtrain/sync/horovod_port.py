"""The collective port (engines/ports.py) over Horovod. Every operation is named
``hvdtrain.<name>``: Horovod matches the ranks' collectives by name, and tests read them."""

from __future__ import annotations

from typing import Any, Sequence

import torch


class HorovodPending:
    """An integer sum in flight (the stop vote): started now, read at the next vote."""

    def __init__(self, hvd: Any, handle: Any):
        self._hvd, self._handle, self._values = hvd, handle, None

    def wait(self) -> list[int]:
        if self._values is None:
            self._values = [int(v) for v in self._hvd.synchronize(self._handle).tolist()]
        return self._values


class HorovodPort:
    """CollectivePort over Horovod (``hvd``: horovod.torch, or a stand-in in the unit tests).

    ``optimizer``: the scheme's ``hvd.DistributedOptimizer`` once it has one; its backward hooks
    start the gradients' allreduce during backward, and ``average_gradients`` waits for it
    (``synchronize``). Without one the gradients are averaged as any tensors are."""

    def __init__(self, hvd: Any = None):
        if hvd is None:
            import horovod.torch as hvd
        self.hvd = hvd
        self.optimizer: Any = None

    @property
    def rank(self) -> int:
        return self.hvd.rank()

    @property
    def size(self) -> int:
        return self.hvd.size()

    def average_(self, tensors: Sequence[tuple[str, torch.Tensor]]) -> None:
        # All started before any is awaited, so tensor fusion packs them into few allreduces;
        # one tensor at a time, since a pipelined replica spans devices.
        hvd = self.hvd
        with torch.no_grad():
            handles = [hvd.allreduce_async_(t, op=hvd.Average, name=f"hvdtrain.{name}")
                       for name, t in tensors]
            for handle in handles:
                hvd.synchronize(handle)

    def average_gradients(self, params: Sequence[torch.Tensor]) -> None:
        if self.optimizer is not None:
            self.optimizer.synchronize()  # started in backward; Adasum's is a no-op (its step)
            return
        self.average_([(f"gradient.{i}", p.grad) for i, p in enumerate(params)
                       if p.grad is not None])

    def broadcast_(self, tensors: Sequence[tuple[str, torch.Tensor]]) -> None:
        # a dict, as Horovod sorts it by name: the order every rank broadcasts in
        self.hvd.broadcast_parameters(dict(tensors), root_rank=0)

    def sum(self, values: Sequence[float], name: str = "sum") -> list[float]:
        tensor = torch.tensor(list(values), dtype=torch.float64)
        return self.hvd.allreduce(tensor, op=self.hvd.Sum, name=f"hvdtrain.{name}").tolist()

    def start_sum(self, values: Sequence[int], name: str = "vote") -> HorovodPending:
        hvd = self.hvd
        return HorovodPending(hvd, hvd.allreduce_async(torch.tensor(list(values)), op=hvd.Sum,
                                                       name=f"hvdtrain.{name}"))

    def broadcast_object(self, obj: Any, name: str = "object") -> Any:
        return self.hvd.broadcast_object(obj, root_rank=0, name=f"hvdtrain.{name}")

    def gather_object(self, obj: Any, name: str = "gather") -> list[Any]:
        return self.hvd.allgather_object(obj, name=f"hvdtrain.{name}")

    def agree(self, value: int, name: str = "agree") -> tuple[int, int]:
        values = self.hvd.allgather(torch.tensor([int(value)]), name=f"hvdtrain.{name}")
        return int(values.min()), int(values.max())

    def barrier(self) -> None:
        self.hvd.barrier()
