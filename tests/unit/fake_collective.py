"""A fake collective for the engines' unit tests: N workers, one thread each, meeting at a
barrier for every operation, as ranks meet in an allreduce. Each worker's port records the
names of the operations it joined."""

from __future__ import annotations

import copy
import threading
from typing import Any, Callable, Sequence

import torch


class Meeting:
    """Where the workers' threads exchange their values: each puts its own, all read all."""

    def __init__(self, size: int):
        self.size = size
        self._barrier = threading.Barrier(size, timeout=30)  # a test that hangs fails instead
        self._slots: list[Any] = [None] * size

    def exchange(self, rank: int, value: Any) -> list[Any]:
        self._slots[rank] = value
        self._barrier.wait()
        values = list(self._slots)
        self._barrier.wait()  # nobody writes the next value before everyone has read this one
        return values


class Done:
    def __init__(self, values: list[int]):
        self._values = values

    def wait(self) -> list[int]:
        return self._values


class FakePort:
    """One worker's CollectivePort (engines/ports.py) on a Meeting; ``names`` records every
    operation it joined, by name."""

    def __init__(self, meeting: Meeting, rank: int):
        self.meeting = meeting
        self._rank = rank
        self.names: list[str] = []

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def size(self) -> int:
        return self.meeting.size

    def _all(self, name: str, value: Any, record: bool = True) -> list[Any]:
        if record:
            self.names.append(name)
        values = self.meeting.exchange(self._rank, (name, value))
        assert len({n for n, _ in values}) == 1, f"workers disagree on the operation: {values}"
        return [v for _, v in values]

    def average_(self, tensors: Sequence[tuple[str, torch.Tensor]]) -> None:
        names = [n for n, _ in tensors]
        self.names.extend(names)  # one operation, every tensor's name recorded
        every = self._all(",".join(names), [t.clone() for _, t in tensors], record=False)
        with torch.no_grad():
            for i, (_, t) in enumerate(tensors):
                t.copy_(torch.stack([own[i] for own in every]).mean(dim=0))

    def average_gradients(self, params: Sequence[torch.Tensor]) -> None:
        grads = [p.grad for p in params if p.grad is not None]
        every = self._all("gradients", [g.clone() for g in grads])
        for i, g in enumerate(grads):
            g.copy_(torch.stack([own[i] for own in every]).mean(dim=0))

    def broadcast_(self, tensors: Sequence[tuple[str, torch.Tensor]]) -> None:
        every = self._all("broadcast", [t.clone() for _, t in tensors])
        with torch.no_grad():
            for (_, t), first in zip(tensors, every[0]):
                t.copy_(first)

    def sum(self, values: Sequence[float], name: str = "sum") -> list[float]:
        every = self._all(name, [float(v) for v in values])
        return [sum(column) for column in zip(*every)]

    def start_sum(self, values: Sequence[int], name: str = "vote") -> Done:
        every = self._all(name, [int(v) for v in values])
        return Done([sum(column) for column in zip(*every)])

    # Objects travel as copies, as through a pickle: sent as they stand at the call, and no
    # worker shares another's tensors.
    def broadcast_object(self, obj: Any, name: str = "object") -> Any:
        return copy.deepcopy(self._all(name, copy.deepcopy(obj))[0])

    def gather_object(self, obj: Any, name: str = "gather") -> list[Any]:
        return copy.deepcopy(self._all(name, copy.deepcopy(obj)))

    def agree(self, value: int, name: str = "agree") -> tuple[int, int]:
        every = self._all(name, int(value))
        return min(every), max(every)

    def barrier(self) -> None:
        self._all("barrier", None)


def run_workers(size: int, work: Callable[[FakePort], Any]) -> list[Any]:
    """``work(port)`` on ``size`` workers at once, one thread each; their results in rank order
    (an exception in any worker is raised here)."""
    meeting = Meeting(size)
    results: list[Any] = [None] * size
    errors: list[BaseException] = []

    def run(rank: int) -> None:
        try:
            results[rank] = work(FakePort(meeting, rank))
        except BaseException as error:  # noqa: BLE001 (handed to the test's thread)
            errors.append(error)
            meeting._barrier.abort()  # the others stop waiting for this one

    threads = [threading.Thread(target=run, args=(rank,)) for rank in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results
