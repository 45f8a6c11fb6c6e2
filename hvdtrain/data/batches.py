"""The one batch interface the trainer consumes, whatever holds the samples.

A :class:`BatchSource` hands each worker its batches of an epoch, already on the training device.
Two kinds implement it: in_memory.InMemoryBatches (tensors on the device; a batch is one index
lookup) and loader.LoaderBatches (a torch DataLoader over the user's Dataset). Both keep the
global-batch guarantee: at each step the workers' batches together are the batch that a single
process would draw, and every worker runs the same number of steps (uneven steps hang Horovod).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch

from ..errors import ConfigError
from .builtin import epoch_batches


class PartRows:
    """The sample rows of (epoch, step, part) pieces, with each epoch's permutation computed
    once per part and kept for two epochs (a resumed run may finish an earlier epoch's pieces
    while the next one is under way). ``place``: what each such table of rows (a numpy array,
    a row per step) becomes once computed; InMemoryBatches puts it on the training device, so
    that a step's rows are a view there and not a copy from the host that waits for the GPU."""

    def __init__(self, num_samples: int, batch_size: int, num_parts: int, seed: int,
                 place: Callable[[Any], Any] | None = None):
        self.args = (num_samples, batch_size, num_parts, seed)
        self.place = place
        self._rows: dict[tuple[int, int], Any] = {}

    def row(self, epoch: int, step: int, part: int) -> Any:
        """The rows of piece (epoch, step, part): a row of the placed table."""
        rows = self._rows.get((epoch, part))
        if rows is None:
            num_samples, batch_size, num_parts, seed = self.args
            for key in [k for k in self._rows if k[0] < epoch - 1]:
                del self._rows[key]
            rows = epoch_batches(num_samples, batch_size, part, num_parts, epoch, seed)
            rows = self._rows[(epoch, part)] = rows if self.place is None else self.place(rows)
        return rows[step]

    def of(self, epoch: int, step: int, part: int) -> list[int]:
        return self.row(epoch, step, part).tolist()


def to_device(obj: Any, device: torch.device | str, non_blocking: bool = False) -> Any:
    """Move a tensor, or tensors nested in tuples, lists and dicts, to `device`. Anything else
    (numbers, strings) comes back as it is."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device, non_blocking=non_blocking)
    if isinstance(obj, Mapping):
        moved = {k: to_device(v, device, non_blocking) for k, v in obj.items()}
        try:
            return moved if type(obj) is dict else type(obj)(moved)  # OrderedDict and the like
        except TypeError:  # a mapping type that cannot be built from a dict (defaultdict)
            return moved
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a namedtuple
        return type(obj)(*(to_device(v, device, non_blocking) for v in obj))
    if isinstance(obj, (tuple, list)):
        return type(obj)(to_device(v, device, non_blocking) for v in obj)
    return obj


class BatchSource(ABC):
    """Where one split's batches come from. Worker indices and counts are arguments, not state,
    so an elastic run that changes its workers keeps using the same source."""

    num_samples: int | None  # None for a stream (an IterableDataset) without __len__
    device: torch.device

    @abstractmethod
    def describe(self) -> str:
        """One line for the log, e.g. "1437 samples (in memory)"."""

    @abstractmethod
    def steps_per_epoch(self, batch_size: int, num_workers: int) -> int:
        """Steps in one epoch, the same on every worker; 0 means not even one global batch."""

    @abstractmethod
    def train_batches(self, epoch: int, worker: int, num_workers: int, batch_size: int,
                      seed: int, first_step: int, steps: int,
                      shares: Sequence[int] | None = None) -> Iterator[tuple[Any, Any]]:
        """This worker's batches (x, y) for steps first_step..steps-1 of the epoch, on
        self.device: exactly steps - first_step of them. ``shares``: each worker's samples per
        step (--balance; they add up to batch_size x num_workers), None for batch_size each;
        only a source whose ``takes_shares`` is true accepts them."""

    @property
    def takes_shares(self) -> bool:
        """Whether train_batches can give the workers unequal shares of each global batch
        (builtin.share_batches), which --balance needs."""
        return False

    def part_batches(self, parts: Iterator[tuple[int, int, int]], num_parts: int,
                     batch_size: int, seed: int) -> Iterator[tuple[Any, Any]]:
        """Batches of pieces of the sync plan handed out one at a time (async training's global
        plan, ps/dispatch.py): for each (epoch, step, part) from ``parts``, batch ``step`` of
        worker ``part``'s share of that epoch, as train_batches(epoch, part, num_parts, ...)
        would give it. ``parts`` is read lazily: the next piece may not be known yet. Only a
        source with random access can do this (see random_access)."""
        raise NotImplementedError(f"{type(self).__name__} reads its samples in order only")

    @property
    def random_access(self) -> bool:
        """Whether part_batches works: any batch of any epoch can be read on its own."""
        return type(self).part_batches is not BatchSource.part_batches

    @property
    def lookahead(self) -> int:
        """How many batches this source reads ahead of the one being trained (loader
        processes' prefetch), so that pieces handed out one at a time arrive in time."""
        return 0

    @abstractmethod
    def eval_batches(self, part: int, parts: int, batch_size: int) -> Iterator[tuple[Any, Any]]:
        """Batches of this part's share of the split; the parts together cover every sample
        exactly once. The last batch may be smaller."""

    @abstractmethod
    def sample(self) -> tuple[Any, Any]:
        """A batch of (at most) two samples, for checking a model and loss before training."""

    def another_reader(self) -> BatchSource:
        """A source over the same samples whose iterations run beside this one's: the
        simulator's virtual workers (compare/sim) each read their own batches, in one process.
        A source whose iterations share nothing (in memory) is its own other reader."""
        return self

    def close(self) -> None:
        """Stop any loader processes. Safe to call twice."""

    def __enter__(self) -> BatchSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_shares(self, shares: Sequence[int] | None) -> None:
        if shares is not None and not self.takes_shares:
            raise ConfigError(f"--balance: {self.describe()} cannot give the workers unequal "
                              "shares of a batch; drop --balance")

    def _check_steps(self, first_step: int, steps: int, batch_size: int,
                     num_workers: int) -> None:
        available = self.steps_per_epoch(batch_size, num_workers)
        if not 0 <= first_step <= steps <= available:
            raise ValueError(f"steps {first_step}..{steps} out of range: an epoch of "
                             f"{self.describe()} has {available} steps of {batch_size} x "
                             f"{num_workers} workers")
