"""The simulator's virtual collective: N virtual workers, each running the real scheme's engine
(engines/) on a thread of its own, that meet in the collectives of engines/ports.py.

The workers run one at a time, in rank order, handing a baton on: a worker runs until it joins
a collective (or finishes its work), then the next rank runs. The last to join a collective
computes its result from every worker's part, in rank order, and the baton goes back to rank 0.
So a run is deterministic, and the one real replica that the virtual workers share, and torch's
global random state, are never used by two threads at once. No time passes here: the simulator's
clocks (Simulation, ShareClock) count it.

Averages are computed as the simulator always computed them, so that its results did not move
when the engines came: gradients summed in rank order and divided by N, other tensors as
torch.stack(...).mean(0).
"""

from __future__ import annotations

import copy
import threading
from typing import Any, Callable, Sequence

import torch


class CollectiveMismatch(RuntimeError):
    """The virtual workers did not join the same collectives in the same order (a bug in the
    engine or in the simulator's driver: a real job would hang there)."""


class _Aborted(BaseException):
    """Unwinds a worker's thread when the run ends while it waits in a collective."""


class _Done:
    """A start_sum's values: the virtual collective is done when its last worker joins."""

    def __init__(self, values: list[int]):
        self._values = values

    def wait(self) -> list[int]:
        return self._values


class VirtualCluster:
    """``size`` virtual workers, one thread each (started at the first :meth:`run`). Each
    worker's CollectivePort is :meth:`port`; :meth:`run` runs a piece of work on every worker
    and returns once all have done it."""

    def __init__(self, size: int, wire: torch.dtype | None = None):
        if size < 1:
            raise ValueError(f"a virtual cluster needs 1 or more workers, not {size}")
        self.size = size
        self.wire = wire  # the gradients' dtype in the allreduce: --compression fp16's
        self.ports = [VirtualPort(self, rank) for rank in range(size)]
        self._batons = [threading.Semaphore(0) for _ in range(size + 1)]  # the last: run()'s
        self._threads: list[threading.Thread] = []
        self._work: Callable[[int], Any] | None = None
        self._results: list[Any] = []
        self._finished: list[bool] = []
        self._waiting: list[bool] = [False] * size  # inside a collective
        self._error: BaseException | None = None
        self._aborting = self._closing = False
        self._parts: list[Any] = [None] * size
        self._joined: list[tuple[str, str] | None] = [None] * size
        self._count = 0
        self._result: Any = None

    def port(self, rank: int) -> VirtualPort:
        return self.ports[rank]

    # --- running work on every worker -------------------------------------------------------------
    def run(self, work: Callable[[int], Any]) -> list[Any]:
        """``work(rank)`` on every worker's thread, one at a time as their collectives allow;
        the results in rank order. An exception in any worker ends every worker's work and is
        raised here."""
        if not self._threads:
            self._threads = [threading.Thread(target=self._serve, args=(rank,), daemon=True,
                                              name=f"virtual-worker-{rank}")
                             for rank in range(self.size)]
            for thread in self._threads:
                thread.start()
        self._work, self._error = work, None
        self._results = [None] * self.size
        self._finished = [False] * self.size
        self._pass(0)
        self._batons[self.size].acquire()
        if self._error is not None:
            error, self._error = self._error, None
            self._abort_waiting()
            raise error
        return self._results

    def close(self) -> None:
        """Ends the workers' threads."""
        self._closing = True
        for rank, thread in enumerate(self._threads):
            self._batons[rank].release()
            thread.join()
        self._threads = []

    def _serve(self, rank: int) -> None:
        """A worker's thread: waits for the baton, does its work, hands the baton on."""
        while True:
            self._batons[rank].acquire()
            if self._closing:
                return
            try:
                self._results[rank] = self._work(rank)
            except _Aborted:
                self._pass(self.size)  # back to _abort_waiting
                continue
            except BaseException as error:  # noqa: BLE001 (raised again by run())
                self._error = error
                self._pass(self.size)
                continue
            self._finished[rank] = True
            if self._count:  # others wait in a collective that this worker never joined
                self._error = CollectiveMismatch(
                    f"virtual worker {rank} finished its work while the others joined "
                    f"{self._joined[0] or self._joined[-1]}")
                self._pass(self.size)
                continue
            self._pass(rank + 1)  # the last worker's next is run()'s caller

    def _pass(self, to: int) -> None:
        self._batons[to].release()

    def _abort_waiting(self) -> None:
        """Unwinds every worker that waits in a collective, one at a time."""
        self._aborting = True
        for rank in range(self.size):
            if self._waiting[rank]:
                self._pass(rank)
                self._batons[self.size].acquire()
        self._aborting = False
        self._parts = [None] * self.size
        self._joined = [None] * self.size
        self._count = 0

    # --- meeting in a collective ------------------------------------------------------------------
    def meet(self, rank: int, kind: str, name: str, part: Any,
             combine: Callable[[list[Any]], Any]) -> Any:
        """Worker ``rank`` joins the collective ``kind`` (labelled ``name``) with ``part``;
        returns ``combine(every worker's part, in rank order)``, computed once, by the last
        worker to join."""
        self._parts[rank], self._joined[rank] = part, (kind, name)
        self._count += 1
        if any(self._finished):
            raise CollectiveMismatch(f"virtual worker {rank} joined {kind} {name!r}, which "
                                     "another worker, already finished, never joined")
        if self._count == self.size:
            if len(set(self._joined)) != 1:
                raise CollectiveMismatch(f"the virtual workers joined different collectives: "
                                         f"{self._joined}")
            self._result = combine(list(self._parts))
            self._parts = [None] * self.size
            self._joined = [None] * self.size
            self._count = 0
            following = 0  # everyone has joined: the workers go on in rank order
        else:
            following = rank + 1
        if self.size == 1:
            return self._result
        self._waiting[rank] = True
        self._pass(following)
        self._batons[rank].acquire()
        self._waiting[rank] = False
        if self._aborting or self._closing:
            raise _Aborted
        return self._result


class VirtualPort:
    """One virtual worker's CollectivePort (engines/ports.py) in a VirtualCluster."""

    def __init__(self, cluster: VirtualCluster, rank: int):
        self.cluster = cluster
        self._rank = rank

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def size(self) -> int:
        return self.cluster.size

    def _meet(self, kind: str, name: str, part: Any, combine: Callable[[list[Any]], Any]) -> Any:
        return self.cluster.meet(self._rank, kind, name, part, combine)

    def average_(self, tensors: Sequence[tuple[str, torch.Tensor]]) -> None:
        self._meet("average_", ",".join(n for n, _ in tensors), [t for _, t in tensors],
                   _average_in_place)

    def average_gradients(self, params: Sequence[torch.Tensor]) -> None:
        for p in params:  # a parameter without a gradient counts as a zero one
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        wire = self.cluster.wire
        self._meet("average_gradients", "gradients", [p.grad for p in params],
                   _sum_then_divide if wire is None else
                   lambda parts: _sum_then_divide(parts, wire))

    def broadcast_(self, tensors: Sequence[tuple[str, torch.Tensor]]) -> None:
        self._meet("broadcast_", ",".join(n for n, _ in tensors), [t for _, t in tensors],
                   _copy_first)

    def sum(self, values: Sequence[float], name: str = "sum") -> list[float]:
        return self._meet("sum", name, [float(v) for v in values], _column_sums)

    def start_sum(self, values: Sequence[int], name: str = "vote") -> _Done:
        return _Done(self._meet("start_sum", name, [int(v) for v in values], _column_sums))

    def broadcast_object(self, obj: Any, name: str = "object") -> Any:
        first = self._meet("broadcast_object", name, obj, lambda parts: parts[0])
        return first if self._rank == 0 else copy.deepcopy(first)  # each its own, as unpickled

    def gather_object(self, obj: Any, name: str = "gather") -> list[Any]:
        return copy.deepcopy(self._meet("gather_object", name, obj, list))

    def agree(self, value: int, name: str = "agree") -> tuple[int, int]:
        return self._meet("agree", name, int(value), lambda parts: (min(parts), max(parts)))

    def barrier(self) -> None:
        self._meet("barrier", "barrier", None, lambda parts: None)


def _average_in_place(parts: list[list[torch.Tensor]]) -> None:
    """Every worker's i-th tensor becomes the mean of the workers' i-th tensors (all means are
    taken before any tensor changes)."""
    with torch.no_grad():
        means = [torch.stack(column).mean(dim=0) for column in zip(*parts)]
        for own in parts:
            for t, mean in zip(own, means):
                t.copy_(mean)


def _sum_then_divide(parts: list[list[torch.Tensor]], wire: torch.dtype | None = None) -> None:
    """Every worker's i-th gradient becomes the sum of the workers' i-th, in rank order, over N;
    with a ``wire`` dtype (Horovod's fp16 compression) each gradient, each partial sum and the
    mean are rounded to it, as the compressed allreduce holds them."""
    def wired(t: torch.Tensor) -> torch.Tensor:
        return t if wire is None else t.to(wire).to(t.dtype)

    with torch.no_grad():
        means = []
        for column in zip(*parts):
            total = wired(column[0].clone())
            for g in column[1:]:
                total = wired(total + wired(g))
            means.append(wired(total / len(column)))
        for own in parts:
            for g, mean in zip(own, means):
                g.copy_(mean)


def _copy_first(parts: list[list[torch.Tensor]]) -> None:
    with torch.no_grad():
        for own in parts[1:]:
            for t, first in zip(own, parts[0]):
                t.copy_(first)


def _column_sums(parts: list[list[Any]]) -> list[Any]:
    return [sum(column) for column in zip(*parts)]
