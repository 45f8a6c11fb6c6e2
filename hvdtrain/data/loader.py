"""torch DataLoaders over the user's own Dataset, with the same batches as the in-memory path.

Map-style datasets (``__getitem__`` and ``__len__``)
    The DataLoader's batch sampler yields exactly the rows of builtin.epoch_batches for this
    worker, so a map-style dataset gives the same batches as InMemoryBatches over the same
    tensors, and the global-batch guarantee carries over; under --balance, the rows of
    builtin.share_batches (unequal shares of the same global batches). Evaluation reads
    builtin.eval_shard.

Streams (``IterableDataset``): the split rule
    Sample i of the stream goes to worker i % num_workers (round-robin). Each worker cuts its
    samples into batches of batch_size and drops a last partial batch, so at step j the workers'
    batches together are samples j*B*W .. (j+1)*B*W - 1 of the stream (B the batch size, W the
    workers): the consecutive global batch a single process would draw. Inside one worker with P
    loader processes, process p collates the batches j (counted from the first one this
    iteration yields) with j % P == p; the DataLoader takes batches from its processes
    round-robin, so the order is the same as with P = 1. Every process therefore reads the whole
    stream and skips the samples of other workers and processes: the dataset must yield the same
    stream in every process. A dataset that splits itself by get_worker_info (as torch's docs
    teach) would give each process a part, so its iteration runs with the worker info hidden
    (_as_one_process) and it yields the whole stream as it would outside a DataLoader.
    A dataset with ``set_epoch(epoch)`` has it called at the start of each training epoch, in
    every process, so it can shuffle per epoch. Resuming at first_step reads and skips the first
    first_step batches. An epoch has len(dataset) // (B*W) steps, or ``stream_steps`` (the
    trainer's --max-steps-per-epoch) when the dataset has no ``__len__``; a worker whose stream
    ends early raises DataError rather than run fewer steps than the others (which hangs
    Horovod). Evaluation: part p of `parts` takes samples i % parts == p, all of them.
    Unequal shares (--balance): each worker reads the stream's global batches of B*W samples
    whole, lays each out as the equal split deals it (worker 0's B samples, then worker 1's...)
    and takes its share's span of that, as builtin.share_batches does with rows.

With data_workers > 0 the loader processes start with forkserver (a fork after MPI has started
can crash or hang; Horovod's examples use forkserver too) and persist across epochs: what changes
per iteration (the batch sampler's batches, the stream's plan) is read at each iteration's start.
They end with the training process, however it ends (loader_processes.py).
"""

from __future__ import annotations

import functools
import itertools
import os
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset, Sampler, get_worker_info
from torch.utils.data import default_collate

from ..errors import ConfigError
from . import loader_processes as processes
from .batches import BatchSource, PartRows, to_device
from .builtin import DataError, epoch_batches, eval_shard, share_batches
from .user_data import HeldOut


class LoaderBatches(BatchSource):
    def __init__(self, dataset: Any, device: torch.device | str = "cpu", data_workers: int = 0,
                 seed: int = 0, pin_memory: bool | None = None, stream_steps: int | None = None,
                 collate: Callable[[list], Any] | None = None):
        """dataset: a map-style Dataset or an IterableDataset yielding (x, y) samples.
        data_workers: loader processes per worker (--data-workers); 0 loads in this process.
        seed: seeds the loader processes' torch, random and numpy generators (augmentations).
        pin_memory: page-locked batches for fast copies; None means: when device is CUDA.
        stream_steps: steps per epoch of a stream without __len__ (--max-steps-per-epoch).
        collate: makes a batch of a list of samples (--collate); None: torch's default_collate,
        which stacks samples of one shape."""
        self.is_stream = isinstance(dataset, IterableDataset)
        if not self.is_stream and not (hasattr(dataset, "__getitem__")
                                       and hasattr(dataset, "__len__")):
            raise TypeError(f"{type(dataset).__name__} is not a dataset: pass a map-style "
                            "torch Dataset (with __getitem__ and __len__) or an IterableDataset")
        if data_workers < 0:
            raise ConfigError(f"--data-workers {data_workers}: must be 0 (load in the training "
                              "process) or more")
        self.dataset = dataset
        self.device = torch.device(device)
        self.data_workers = data_workers
        self.seed = seed
        self.pin_memory = self.device.type == "cuda" if pin_memory is None else pin_memory
        self.name = dataset.name if isinstance(dataset, HeldOut) else type(dataset).__name__
        self.collate = collate or StackSamples(self.name)
        try:
            self.num_samples: int | None = len(dataset)
        except TypeError:  # an IterableDataset without __len__
            self.num_samples = None
        if self.num_samples is None and not stream_steps:
            raise ConfigError(f"{self.name} is a stream without __len__, so the number of steps "
                              "per epoch is unknown; pass --max-steps-per-epoch (every worker "
                              "must run the same number of steps) or give the dataset __len__")
        if stream_steps is not None and stream_steps < 1:
            raise ConfigError(f"--max-steps-per-epoch {stream_steps}: must be at least 1")
        self.stream_steps = stream_steps
        self._batches = _BatchList()
        self._stream = _StreamShard(dataset, self.collate) if self.is_stream else None
        self._loader: DataLoader | None = None  # built on first use, kept (persistent workers)
        self._iteration = 0  # the newest iteration; an older one must not go on

    def describe(self) -> str:
        kind = "stream from" if self.is_stream else "DataLoader over"
        size = (f"{self.num_samples} samples" if self.num_samples is not None
                else f"length unknown, {self.stream_steps} steps per epoch")
        procs = (f"{self.data_workers} loader process{'es' if self.data_workers > 1 else ''}"
                 if self.data_workers else "loading in the training process")
        return f"{kind} {self.name}, {size}, {procs}"

    def steps_per_epoch(self, batch_size: int, num_workers: int) -> int:
        if self.num_samples is None:
            return self.stream_steps
        steps = self.num_samples // num_workers // batch_size  # what epoch_batches drops to
        if self.is_stream and self.stream_steps:
            steps = min(steps, self.stream_steps)
        return steps

    # --- batches ---------------------------------------------------------------------------
    def train_batches(self, epoch: int, worker: int, num_workers: int, batch_size: int,
                      seed: int, first_step: int, steps: int,
                      shares: Sequence[int] | None = None) -> Iterator[tuple[Any, Any]]:
        self._check_steps(first_step, steps, batch_size, num_workers)
        self._check_shares(shares)
        if first_step == steps:
            return
        if not self.is_stream:
            rows = (epoch_batches(self.num_samples, batch_size, worker, num_workers, epoch, seed)
                    if shares is None else
                    share_batches(self.num_samples, batch_size, worker, shares, epoch, seed))
            self._batches.batches = rows[first_step:steps].tolist()
            yield from self._iterate()
            return
        offset = sum(shares[:worker]) if shares is not None else 0
        self._stream.plan_train(epoch, worker, num_workers, batch_size, first_step, steps,
                                offset, shares[worker] if shares is not None else 0)
        step = first_step
        for got, batch in self._iterate():
            _check_order(got, step, self.name)
            yield batch
            step += 1
            if step == steps:
                return
        raise DataError(
            f"worker {worker}: the stream from {self.name} ended at step {step + 1} of {steps} "
            f"in epoch {epoch + 1} (it gave {step - first_step} batches of {batch_size} x "
            f"{num_workers} workers); every worker must get the same number of steps in an "
            "epoch (sync's collectives would wait for the missing ones): lower "
            "--max-steps-per-epoch, or fix the dataset's __len__ to the number of samples it "
            "really yields")

    def part_batches(self, parts: Iterator[tuple[int, int, int]], num_parts: int,
                     batch_size: int, seed: int) -> Iterator[tuple[Any, Any]]:
        if self.is_stream:  # no batch of a stream can be read without the ones before it
            raise NotImplementedError(f"{self.name} is a stream: it is read in order only")
        rows = PartRows(self.num_samples, batch_size, num_parts, seed)
        # Read lazily by the batch sampler, in this process, as the loader asks for batches.
        self._batches.batches = (rows.of(*piece) for piece in parts)
        yield from self._iterate()

    def another_reader(self) -> LoaderBatches:
        """Its own loader, since one serves a single iteration at a time; loading in this
        process, since the simulator's virtual workers share it and loader processes for each
        would multiply."""
        return LoaderBatches(self.dataset, self.device, 0, self.seed, self.pin_memory,
                             self.stream_steps, self.collate)

    @property
    def random_access(self) -> bool:
        return not self.is_stream

    @property
    def takes_shares(self) -> bool:
        return True

    @property
    def lookahead(self) -> int:
        return 2 * self.data_workers  # the DataLoader's default prefetch_factor per process

    def eval_batches(self, part: int, parts: int, batch_size: int) -> Iterator[tuple[Any, Any]]:
        if not self.is_stream:
            shard = eval_shard(self.num_samples, part, parts)
            self._batches.batches = [list(range(start, min(start + batch_size, shard.stop)))
                                     for start in range(shard.start, shard.stop, batch_size)]
            yield from self._iterate()
            return
        self._stream.plan_eval(part, parts, batch_size)
        for expected, (got, batch) in enumerate(self._iterate()):
            _check_order(got, expected, self.name)
            yield batch

    def sample(self) -> tuple[Any, Any]:
        if self.is_stream:
            samples = list(itertools.islice(iter(self.dataset), 2))
        else:
            samples = [self.dataset[i] for i in range(min(2, self.num_samples))]
        if not samples:
            raise DataError(f"{self.name} holds no samples; check the data it reads")
        return to_device(_pair(self.collate(samples), self.name), self.device)

    def close(self) -> None:
        loader, self._loader = self._loader, None
        iterator = getattr(loader, "_iterator", None)  # the persistent workers' iterator
        if iterator is not None and hasattr(iterator, "_shutdown_workers"):
            iterator._shutdown_workers()

    # --- the loader ------------------------------------------------------------------------
    def _iterate(self) -> Iterator[Any]:
        """The batches of what the sampler or the stream plan says now, on the device. Starting
        one ends the previous: the persistent loader serves one iteration at a time."""
        self._iteration += 1
        iteration = self._iteration
        for batch in self._start():
            if self._iteration != iteration:
                raise RuntimeError(f"batches of {self.name} were requested again before this "
                                   "iteration finished; a source serves one iteration at a time")
            if self.is_stream:
                step, batch = batch
                yield step, _pair(to_device(batch, self.device, self.pin_memory), self.name)
            else:
                yield _pair(to_device(batch, self.device, self.pin_memory), self.name)

    def _start(self) -> Iterator[Any]:
        if self._loader is None:
            self._loader = self._build()
        try:
            with warnings.catch_warnings(), processes.tensors_shared_by_name():
                # torch's advice (start method fork) is wrong here
                warnings.filterwarnings("ignore", message="Got pickle error")
                return iter(self._loader)  # starts the loader processes the first time
        except Exception as e:
            problem = processes.pickling_problem(self.dataset) if self.data_workers else None
            if problem is None:
                raise
            self._loader = None
            raise ConfigError(
                f"--data-workers {self.data_workers}: {self.name} cannot be sent to the loader "
                f"processes ({problem}). They start with forkserver, which pickles the dataset: "
                "define its class, and any function it holds, at the top level of an importable "
                "module (not inside a function or a notebook cell), or use --data-workers 0"
            ) from e

    def _build(self) -> DataLoader:
        workers = self.data_workers
        options: dict[str, Any] = dict(
            num_workers=workers, pin_memory=self.pin_memory,
            generator=torch.Generator().manual_seed(self.seed))  # the loader processes' seeds
        if workers:
            # Horovod: fork after MPI has started can crash or hang; forkserver starts clean.
            processes.forkserver_preloads_torch()
            ends = functools.partial(processes.end_with_trainer, os.getpid(),
                                     processes.shared_temp_dir())
            options.update(multiprocessing_context="forkserver", persistent_workers=True,
                           worker_init_fn=ends)
        if self.is_stream:
            return DataLoader(self._stream, batch_size=None, **options)  # batches come whole
        return DataLoader(self.dataset, batch_sampler=self._batches, collate_fn=self.collate,
                          **options)


class _BatchList(Sampler):
    """The batch sampler of a persistent loader: the batches of whichever iteration starts next.
    The DataLoader reads it (iter) when an iteration starts, in this process, so changing it
    between iterations needs no restart of the loader processes."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


# The fields of _StreamShard.plan.
_EPOCH, _WORKER, _WORKERS, _BATCH_SIZE, _FIRST, _STOP, _TRAIN, _OFFSET, _SHARE = range(9)


class _StreamShard(IterableDataset):
    """One worker's batches of a stream, cut by the split rule, each tagged with its step. What
    to cut sits in a shared-memory tensor that this process writes before each iteration: the
    persistent loader processes hold their own copies of this object, but share that tensor."""

    def __init__(self, dataset: IterableDataset, collate: Callable[[list], Any]):
        self.dataset, self.collate = dataset, collate
        self.plan = torch.zeros(9, dtype=torch.int64).share_memory_()

    def plan_train(self, epoch: int, worker: int, workers: int, batch_size: int,
                   first: int, stop: int, offset: int = 0, share: int = 0) -> None:
        """share > 0: the samples offset..offset+share-1 of each global batch (--balance)."""
        self.plan.copy_(torch.tensor([epoch, worker, workers, batch_size, first, stop, 1,
                                      offset, share]))

    def plan_eval(self, part: int, parts: int, batch_size: int) -> None:
        self.plan.copy_(torch.tensor([0, part, parts, batch_size, 0, -1, 0, 0, 0]))

    def __iter__(self) -> Iterator[tuple[int, Any]]:
        epoch, worker, workers, batch_size, first, stop, train, offset, share = \
            self.plan.tolist()
        info = get_worker_info()
        procs, proc = (info.num_workers, info.id) if info is not None else (1, 0)
        if train and hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)  # in every process: each has its own copy
        stream = _as_one_process(self.dataset)
        if share:
            yield from self._shares(stream, workers, batch_size, first, stop, offset, share,
                                    procs, proc)
            return
        mine = itertools.islice(stream, worker, None, workers)  # round-robin
        mine = itertools.islice(mine, first * batch_size, None)  # resume: skip whole batches
        step = first
        while stop < 0 or step < stop:
            batch = list(itertools.islice(mine, batch_size))
            if not batch or (train and len(batch) < batch_size):
                return  # the end of the stream; the partial batch only counts in evaluation
            if (step - first) % procs == proc:
                yield step, self.collate(batch)
            step += 1


    def _shares(self, stream: Iterator[Any], workers: int, batch_size: int, first: int,
                stop: int, offset: int, share: int, procs: int,
                proc: int) -> Iterator[tuple[int, Any]]:
        """Training batches of unequal shares: a span of each global batch, laid out by the
        equal split (sample i of the global batch is worker i % workers's)."""
        size = batch_size * workers
        stream = itertools.islice(stream, first * size, None)  # resume: skip steps
        step = first
        while stop < 0 or step < stop:
            batch = list(itertools.islice(stream, size))
            if len(batch) < size:
                return  # the end of the stream
            if (step - first) % procs == proc:
                by_worker = [batch[i] for w in range(workers) for i in range(w, size, workers)]
                yield step, self.collate(by_worker[offset:offset + share])
            step += 1


class UnstackableSamples(DataError):
    """Samples that torch's default_collate cannot make one batch of."""


class StackSamples:
    """torch's default_collate, whose error for samples it cannot stack (of different lengths,
    often far into the data, where the first batch passed the start-up check) says what to do.
    A class, not a closure: loader processes receive it pickled."""

    def __init__(self, name: str):
        self.name = name

    def __call__(self, samples: list) -> Any:
        try:
            return _floats_as_default(default_collate(samples))
        except (RuntimeError, TypeError) as e:
            raise UnstackableSamples(
                f"{self.name}: the samples of a batch cannot be stacked into one "
                f"({str(e).splitlines()[0]}); every sample must hold tensors, numbers or arrays "
                "of one shape: pad or crop them to one size in the dataset, or pass --collate "
                "MODULE:CALLABLE (fit: collate=), a function that makes a batch of a list of "
                "(input, target) samples, e.g. padding them to the longest") from None


def _floats_as_default(batch: Any) -> Any:
    """float64 tensors (numpy's default, from a Dataset's arrays) in torch's default float dtype,
    the models' weights' (float32 unless torch.set_default_dtype says otherwise), as an (x, y)
    pair of arrays is converted (user_data.py): float64 inputs had failed in the model's first
    layer with "mat1 and mat2 must have the same dtype"."""
    if isinstance(batch, torch.Tensor):
        default = torch.get_default_dtype()
        return batch.to(default) if batch.dtype == torch.float64 != default else batch
    if isinstance(batch, dict):
        return {key: _floats_as_default(value) for key, value in batch.items()}
    if isinstance(batch, (tuple, list)) and not hasattr(batch, "_fields"):
        return type(batch)(_floats_as_default(value) for value in batch)
    return batch


def _as_one_process(dataset: IterableDataset) -> Iterator[Any]:
    """The dataset's samples with get_worker_info() answering None while its own code runs, so a
    stream that splits itself among loader processes yields all of it here, where the split
    rule needs the whole stream in each process. torch keeps the answer in a module global of
    its worker loop; where a torch version keeps it elsewhere, the stream is read as it is and
    _check_order still stops a split that leaves processes unequal."""
    from torch.utils.data._utils import worker as torch_worker
    info = getattr(torch_worker, "_worker_info", None)
    if info is None:  # not in a loader process, or a torch without that global
        yield from dataset
        return

    def hidden(call):
        torch_worker._worker_info = None
        try:
            return call()
        finally:
            torch_worker._worker_info = info

    samples = hidden(lambda: iter(dataset))
    while True:
        try:
            yield hidden(lambda: next(samples))
        except StopIteration:
            return


def _check_order(got: int, expected: int, name: str) -> None:
    if got != expected:
        raise DataError(f"{name}: the loader processes gave batch {got} where {expected} was "
                        "due; the dataset must yield the same stream in every loader process "
                        "(seed any shuffle from the epoch that set_epoch(epoch) is given)")


def _pair(batch: Any, name: str) -> tuple[Any, Any]:
    if not isinstance(batch, (tuple, list)) or len(batch) != 2:
        kind = f"{len(batch)} items" if isinstance(batch, (tuple, list)) else type(batch).__name__
        raise DataError(f"{name}: a sample must be a pair (input, target), but it gives {kind}; "
                        "return (x, y) from __getitem__ or __iter__")
    return batch[0], batch[1]
