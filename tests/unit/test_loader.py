"""The batch sources: a DataLoader over a Dataset gives exactly the in-memory path's batches, a
stream is split by the documented rule, and evaluation covers every sample once."""

from __future__ import annotations

import random
from collections import namedtuple

import pytest
import torch
from torch.utils.data import Dataset, IterableDataset, TensorDataset, get_worker_info

from hvdtrain.config import ConfigError
from hvdtrain.data.batches import to_device
from hvdtrain.data.builtin import DataError
from hvdtrain.data.in_memory import InMemoryBatches
from hvdtrain.data.loader import LoaderBatches

N, BATCH, SEED = 53, 4, 11  # 53: not a multiple of any batch, so the drop rules matter


def data(n: int = N) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.arange(n * 3, dtype=torch.float32).reshape(n, 3)
    return x, torch.arange(n) % 5


# Loader processes (forkserver) unpickle these by module name: they live at the top level.
class Stream(IterableDataset):
    """Sample i is (float tensor [i], label i); set_epoch shuffles the stream per epoch."""

    def __init__(self, n: int, has_len: bool = True, shuffle: bool = False):
        self.n, self.has_len, self.shuffle, self.epoch = n, has_len, shuffle, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def order(self) -> list[int]:
        ids = list(range(self.n))
        if self.shuffle:
            random.Random(self.epoch).shuffle(ids)
        return ids

    def __iter__(self):
        for i in self.order():
            yield torch.tensor([float(i)]), torch.tensor(i)

    def __len__(self) -> int:
        if not self.has_len:
            raise TypeError("no length")  # what len() of a stream without __len__ raises
        return self.n


class Nested(Dataset):
    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int):
        x = {"image": torch.full((2, 2), float(i)), "extra": (torch.tensor(i), [torch.tensor(-i)])}
        return x, torch.tensor(i)


def assert_same(a: list, b: list) -> None:
    assert len(a) == len(b)
    for (xa, ya), (xb, yb) in zip(a, b):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


def epochs_match(loader: LoaderBatches, memory: InMemoryBatches, workers: int,
                 epochs: range, first_step: int = 0) -> None:
    steps = memory.steps_per_epoch(BATCH, workers)
    assert loader.steps_per_epoch(BATCH, workers) == steps == N // workers // BATCH
    for epoch in epochs:
        for w in range(workers):
            got = list(loader.train_batches(epoch, w, workers, BATCH, SEED, first_step, steps))
            want = list(memory.train_batches(epoch, w, workers, BATCH, SEED, first_step, steps))
            assert len(got) == steps - first_step > 0
            assert_same(got, want)


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_loader_gives_the_in_memory_batches(workers):
    x, y = data()
    loader, memory = LoaderBatches(TensorDataset(x, y), "cpu"), InMemoryBatches(x, y, "cpu")
    epochs_match(loader, memory, workers, range(3))
    epochs_match(loader, memory, workers, range(2), first_step=2)  # a resume inside an epoch


def test_the_job_plans_pieces_are_the_same_rows_from_memory_and_from_a_loader():
    # Async workers train pieces (epoch, step, part) of the job's plan in whatever order server
    # 0 hands them out, across epochs: each piece is the rows a worker of that part would
    # train at that step of that epoch (train_batches), from either source.
    x, y = data()
    parts = 2
    steps = InMemoryBatches(x, y).steps_per_epoch(BATCH, parts)
    pieces = [(0, 1, 1), (0, 0, 0), (1, 2, 1), (0, 2, 0), (2, 0, 1), (1, 0, 0)]
    expected = {(e, s, p): batch for e in range(3) for p in range(parts)
                for s, batch in enumerate(InMemoryBatches(x, y).train_batches(
                    e, p, parts, BATCH, SEED, 0, steps))}
    for source in (InMemoryBatches(x, y), LoaderBatches(TensorDataset(x, y), "cpu")):
        got = list(source.part_batches(iter(pieces), parts, BATCH, SEED))
        assert len(got) == len(pieces)
        for piece, (xs, ys) in zip(pieces, got):
            assert torch.equal(xs, expected[piece][0]) and torch.equal(ys, expected[piece][1])


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_workers_batches_form_the_single_process_batch(workers):
    x, y = data()
    memory = InMemoryBatches(x, y)
    single = list(memory.train_batches(1, 0, 1, BATCH * workers, SEED, 0,
                                       memory.steps_per_epoch(BATCH * workers, 1)))
    per_worker = [list(memory.train_batches(1, w, workers, BATCH, SEED, 0,
                                            memory.steps_per_epoch(BATCH, workers)))
                  for w in range(workers)]
    for step, (xs, _) in enumerate(single[:len(per_worker[0])]):
        together = torch.cat([per_worker[w][step][0] for w in range(workers)])
        assert sorted(together[:, 0].tolist()) == sorted(xs[:, 0].tolist())


def test_loader_processes_give_the_same_batches():
    x, y = data()
    memory = InMemoryBatches(x, y)
    with LoaderBatches(TensorDataset(x, y), "cpu", data_workers=2) as loader:
        assert "2 loader processes" in loader.describe()
        epochs_match(loader, memory, 2, range(2))
        epochs_match(loader, memory, 3, range(1), first_step=1)
        # An epoch abandoned halfway must not leak its batches into the next one.
        next(iter(loader.train_batches(5, 0, 2, BATCH, SEED, 0, 3)))
        epochs_match(loader, memory, 2, range(6, 7))
        parts = [torch.cat([b[1] for b in loader.eval_batches(p, 2, BATCH)]) for p in range(2)]
        assert torch.equal(torch.cat(parts), y)


def test_the_temp_folders_of_trainers_that_are_gone_are_swept(tmp_path):
    import os
    import subprocess
    import sys

    from hvdtrain.data.loader_processes import (NAMESPACE_FILE, TEMP_PREFIX, pid_namespace,
                                                sweep_temp_dirs)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    # (name, its namespace file): a gone trainer's of this namespace is swept; a live one's,
    # multiprocessing's own, another namespace's (a container sharing the temp folder: its PIDs
    # mean nothing here) and one that names none stay
    folders = {f"{TEMP_PREFIX}{gone}-ab_1": pid_namespace(),
               f"{TEMP_PREFIX}{os.getpid()}-x": pid_namespace(), "pymp-k2j3h4": None,
               f"{TEMP_PREFIX}{gone}-cd_2": "1", f"{TEMP_PREFIX}{gone}-ef_3": None}
    for name, namespace in folders.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "listener-1").touch()
        if namespace is not None:
            (tmp_path / name / NAMESPACE_FILE).write_text(namespace)
    sweep_temp_dirs(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(list(folders)[1:])


def test_an_older_iteration_cannot_go_on():
    x, y = data()
    loader = LoaderBatches(TensorDataset(x, y), "cpu")
    old = loader.train_batches(0, 0, 1, BATCH, SEED, 0, 5)
    next(old)
    list(loader.eval_batches(0, 1, BATCH))
    with pytest.raises(RuntimeError, match="one iteration at a time"):
        next(old)


@pytest.mark.parametrize("parts", [1, 2, 3])
def test_eval_batches_cover_every_sample_once(parts):
    x, y = data()
    for source in (InMemoryBatches(x, y), LoaderBatches(TensorDataset(x, y))):
        batches = [b for p in range(parts) for b in source.eval_batches(p, parts, BATCH)]
        assert all(len(b[1]) <= BATCH for b in batches)
        assert torch.equal(torch.cat([b[0] for b in batches]), x)
    stream = LoaderBatches(Stream(N))
    for p in range(parts):  # part p takes the samples i % parts == p, all of them
        mine = torch.cat([b[1] for b in stream.eval_batches(p, parts, BATCH)])
        assert mine.tolist() == list(range(p, N, parts))


def stream_steps_match(source: LoaderBatches, workers: int, epochs: range, first_step: int,
                       shuffle: bool) -> None:
    steps = source.steps_per_epoch(BATCH, workers)
    assert steps == N // (BATCH * workers)
    for epoch in epochs:
        order = Stream(N, shuffle=shuffle)
        order.set_epoch(epoch)
        stream = order.order()
        batches = [list(source.train_batches(epoch, w, workers, BATCH, SEED, first_step, steps))
                   for w in range(workers)]
        assert {len(b) for b in batches} == {steps - first_step}
        for step in range(first_step, steps):
            ys = [batches[w][step - first_step][1] for w in range(workers)]
            for w in range(workers):  # sample i of the stream goes to worker i % workers
                start = step * BATCH * workers + w
                assert ys[w].tolist() == stream[start:start + BATCH * workers:workers]
            together = sorted(torch.cat(ys).tolist())
            assert together == sorted(stream[step * BATCH * workers:(step + 1) * BATCH * workers])


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_stream_split_gives_the_consecutive_global_batch(workers):
    source = LoaderBatches(Stream(N, shuffle=True), "cpu")
    stream_steps_match(source, workers, range(2), 0, shuffle=True)
    stream_steps_match(source, workers, range(1), 1, shuffle=True)


def test_stream_with_loader_processes():
    with LoaderBatches(Stream(N, shuffle=True), "cpu", data_workers=2) as source:
        stream_steps_match(source, 2, range(2), 0, shuffle=True)  # set_epoch reaches both
        stream_steps_match(source, 3, range(3, 4), 1, shuffle=True)
        parts = [torch.cat([b[1] for b in source.eval_batches(p, 2, 5)]) for p in range(2)]
        assert sorted(torch.cat(parts).tolist()) == list(range(N))


class SelfSplitting(Stream):
    """Gives each loader process its part by get_worker_info, as torch's docs teach."""

    def __iter__(self):
        info = get_worker_info()
        parts, part = (1, 0) if info is None else (info.num_workers, info.id)
        for i in self.order()[part::parts]:
            yield torch.tensor([float(i)]), torch.tensor(i)


def test_a_stream_that_splits_itself_is_still_read_whole():
    with LoaderBatches(SelfSplitting(N, shuffle=True), "cpu", data_workers=2) as source:
        stream_steps_match(source, 2, range(2), 0, shuffle=True)
        parts = [torch.cat([b[1] for b in source.eval_batches(p, 2, 5)]) for p in range(2)]
        assert sorted(torch.cat(parts).tolist()) == list(range(N))


class Sequences(Dataset):
    """Sample i is a sequence of i % 3 + 1 tokens (all equal to i), label i: as many tensors as
    samples, and lengths that differ from the second sample on."""

    def __init__(self, n: int = N):
        self.items = [(torch.full((i % 3 + 1,), i), torch.tensor(i)) for i in range(n)]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int):
        return self.items[i]


def pad(samples):
    xs = torch.nn.utils.rnn.pad_sequence([x for x, _ in samples], batch_first=True,
                                         padding_value=-1)
    return xs, torch.stack([y for _, y in samples])


def test_samples_of_different_lengths_take_the_users_collate_in_every_loader_process():
    got = {}
    for workers in (0, 2):
        with LoaderBatches(Sequences(), "cpu", data_workers=workers, collate=pad) as source:
            got[workers] = list(source.train_batches(0, 1, 2, BATCH, SEED, 0, 3))
    assert_same(got[0], got[2])
    for x, y in got[0]:  # each row: its label's tokens, then the padding
        for row, i in zip(x.tolist(), y.tolist()):
            assert row[:i % 3 + 1] == [i] * (i % 3 + 1) and set(row[i % 3 + 1:]) <= {-1}
    with pytest.raises(DataError, match=r"Sequences: the samples of a batch cannot be stacked "
                                        r"into one \(stack expects.*--collate MODULE:CALLABLE"):
        list(LoaderBatches(Sequences(), "cpu").train_batches(0, 0, 1, BATCH, SEED, 0, 3))


def test_a_dataset_of_more_tensors_than_forkserver_can_send_as_descriptors_loads():
    """forkserver sends a new process at most about 250 file descriptors, one per shared
    tensor: a Dataset of 400 tensors failed with "too many fds" under --data-workers."""
    with LoaderBatches(Sequences(400), "cpu", data_workers=2, collate=pad) as source:
        ys = torch.cat([y for _, y in source.eval_batches(0, 1, 50)])
    assert sorted(ys.tolist()) == list(range(400))


def test_stream_without_len_needs_steps():
    with pytest.raises(ConfigError, match="--max-steps-per-epoch"):
        LoaderBatches(Stream(N, has_len=False), "cpu")
    source = LoaderBatches(Stream(N, has_len=False), "cpu", stream_steps=2)
    assert source.num_samples is None and source.steps_per_epoch(BATCH, 3) == 2
    assert "length unknown" in source.describe()


def test_too_short_stream_is_an_error():
    source = LoaderBatches(Stream(20, has_len=False), "cpu", stream_steps=4)
    # 20 samples, 2 workers: 10 each, so 2 whole batches of 4 and no third.
    got = source.train_batches(0, 1, 2, BATCH, SEED, 0, 4)
    assert len([next(got), next(got)]) == 2
    with pytest.raises(DataError, match=r"worker 1: .* at step 3 of 4 .*same number of steps"):
        next(got)


def test_nested_samples_collate_and_move():
    source = LoaderBatches(Nested(), "cpu")
    (x, y), = list(source.train_batches(0, 0, 1, 6, SEED, 0, 1))
    assert x["image"].shape == (6, 2, 2) and x["extra"][0].shape == (6,)
    assert torch.equal(x["extra"][1][0], -y)
    assert torch.equal(x["image"][:, 0, 0], y.float())
    xs, ys = source.sample()
    assert xs["image"].shape == (2, 2, 2) and ys.tolist() == [0, 1]
    Pair = namedtuple("Pair", "a b")
    moved = to_device({"k": (torch.ones(1), [torch.zeros(2)]), "n": Pair(torch.ones(1), 3)},
                      "meta")
    assert moved["k"][0].device.type == "meta" and moved["k"][1][0].device.type == "meta"
    assert isinstance(moved["n"], Pair) and moved["n"].a.is_meta and moved["n"].b == 3


def test_unpicklable_dataset_names_the_flag():
    class Local(TensorDataset):  # defined in a function: forkserver cannot send it
        pass

    x, y = data()
    source = LoaderBatches(Local(x, y), "cpu", data_workers=2)
    with pytest.raises(ConfigError, match="--data-workers 2.*top level.*--data-workers 0"):
        list(source.train_batches(0, 0, 1, BATCH, SEED, 0, 2))


def test_steps_are_checked_and_samples_must_be_pairs():
    x, y = data()
    source = LoaderBatches(TensorDataset(x, y, y))
    with pytest.raises(DataError, match="pair"):
        source.sample()
    with pytest.raises(ValueError, match="out of range"):
        list(InMemoryBatches(x, y).train_batches(0, 0, 1, BATCH, SEED, 0, N))
    assert InMemoryBatches(x, y).steps_per_epoch(N, 2) == 0  # not one global batch


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("data_workers", [0, 2])
def test_cuda_batches_are_pinned_and_equal(data_workers):
    x, y = data()
    memory = InMemoryBatches(x, y, "cuda")
    with LoaderBatches(TensorDataset(x, y), "cuda", data_workers=data_workers) as loader:
        assert loader.pin_memory
        got = list(loader.train_batches(0, 1, 2, BATCH, SEED, 0, 3))
        assert got[0][0].device.type == "cuda"
        assert_same(got, list(memory.train_batches(0, 1, 2, BATCH, SEED, 0, 3)))
