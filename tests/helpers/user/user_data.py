"""A user's own dataset factories for --dataset tests/helpers/user/user_data.py:NAME. Each returns
(train, test). Classes sit at module level: with --data-workers the loader processes receive the
datasets pickled (forkserver)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info


def digits_arrays():
    """Exactly what the built-in --dataset digits holds: images/16 as float32 (N, 1, 8, 8), split
    by train_test_split(test_size=0.2, random_state=0, stratify=y)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    bunch = load_digits()
    x = (bunch.images / 16.0).astype(np.float32)[:, None, :, :]
    y = bunch.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, random_state=0,
                                                        stratify=y)
    return (torch.from_numpy(x_train), torch.from_numpy(y_train),
            torch.from_numpy(x_test), torch.from_numpy(y_test))


class DigitsDataset(Dataset):
    """Map-style: one (image, label) pair per index. No input_shape/num_classes attributes, so
    hvdtrain learns the shape from the first sample."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor):
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int):
        return self.x[index], self.y[index]


class TaggedDigits(DigitsDataset):
    """The same, telling its number of classes as an attribute."""

    num_classes = 10


class DigitsStream(IterableDataset):
    """An IterableDataset over the digits: the same stream in every process."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor):
        self.x, self.y = x, y
        self.input_shape = tuple(x.shape[1:])
        self.num_classes = 10

    def __iter__(self):
        for i in range(len(self.x)):
            yield self.x[i], self.y[i]


class SizedDigitsStream(DigitsStream):
    def __len__(self) -> int:
        return len(self.x)


class RecordingDigits(TaggedDigits):
    """Leaves a file <folder>/<tag>-<pid>-<loader|main>-<parent pid> for each process that reads
    a sample, so a test can count the DataLoader processes that did the reading, see who started
    them, and check they ended."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, folder: str, tag: str):
        super().__init__(x, y)
        self.folder, self.tag = folder, tag
        self.recorded_pid = None  # each process has its own copy of the dataset

    def __getitem__(self, index: int):
        if self.recorded_pid != os.getpid():
            self.recorded_pid = os.getpid()
            kind = "main" if get_worker_info() is None else "loader"
            (Path(self.folder) / f"{self.tag}-{os.getpid()}-{kind}-{os.getppid()}").touch()
        return super().__getitem__(index)


def digits():
    """(train, test) as map-style Datasets over the built-in digits split, with a num_classes
    attribute (which the built-in models need)."""
    x_train, y_train, x_test, y_test = digits_arrays()
    return TaggedDigits(x_train, y_train), TaggedDigits(x_test, y_test)


def digits_recording(folder):
    x_train, y_train, x_test, y_test = digits_arrays()
    return (RecordingDigits(x_train, y_train, folder, "train"),
            RecordingDigits(x_test, y_test, folder, "test"))


def digits_stream(sized=False):
    """(train, test) as IterableDatasets; without __len__ unless sized."""
    x_train, y_train, x_test, y_test = digits_arrays()
    kind = SizedDigitsStream if sized else DigitsStream
    return kind(x_train, y_train), SizedDigitsStream(x_test, y_test)


def regression(samples=1024, features=8, noise=0.05, seed=0):
    """y = x @ w + noise, float targets of shape (N, 1), as tensor pairs."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, features, generator=g)
    w = torch.randn(features, 1, generator=g)
    y = x @ w + noise * torch.randn(samples, 1, generator=g)
    cut = samples * 3 // 4
    return (x[:cut], y[:cut]), (x[cut:], y[cut:])


def single_dataset():
    """A broken factory: returns one dataset, not the pair (train, test)."""
    return digits()[0]


def triple():
    """A broken factory: returns (x, y, z) for the training data."""
    x_train, y_train, _, _ = digits_arrays()
    return (x_train, y_train, y_train), None
