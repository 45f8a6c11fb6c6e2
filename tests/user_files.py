"""Writing a user's source file for a test, and a Config of options as fit() takes them."""

from __future__ import annotations

import textwrap
from pathlib import Path


def config(**options):
    """A checked Config of these options, as fit() builds one."""
    from hvdtrain.config import Config

    return Config.from_overrides(options).validate()


def write(path: Path, source: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source))
    return path


# User code whose data or model cannot train (issue 24): each name is one way it fails.
CANNOT_TRAIN = """
import os

import torch
from torch.utils.data import Dataset


def xy(n=64, features=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, features, generator=g), torch.randint(0, 3, (n,), generator=g)


def pairs():
    x, y = xy()
    return (x[:48], y[:48]), (x[48:], y[48:])


def test_of_another_shape():
    return xy(), xy(16, features=5)


def huge_label():
    x, y = xy()
    y[0] = 2**40
    return (x, y), None


def empty_test():
    x, y = xy()
    return (x, y), (x[:0], y[:0])


def one_pair():
    return xy()


class Ragged(Dataset):
    def __len__(self):
        return 40

    def __getitem__(self, i):
        return torch.randn(3 + i % 2), i % 3


def ragged():
    return Ragged(), None


class NoLen(Dataset):
    def __getitem__(self, i):
        return torch.randn(8), i % 3


def no_len():
    return NoLen(), None


def linear(input_shape, num_classes):
    return torch.nn.Linear(input_shape[0], num_classes)


def fixed():
    return torch.nn.Linear(8, 3)


def frozen():
    model = torch.nn.Linear(8, 3)
    return model.requires_grad_(False)


class Listed(torch.nn.Module):  # layers in a plain list are not registered
    def __init__(self):
        super().__init__()
        self.layers = [torch.nn.Linear(8, 3)]

    def forward(self, x):
        return self.layers[0](x)


class FailsOnceCheckpointed(torch.nn.Module):  # once the file FAIL_AFTER names exists
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 3)

    def forward(self, x):
        if os.path.exists(os.environ.get("FAIL_AFTER", "")):
            raise RuntimeError("the user's forward() failed")
        return self.linear(x)
"""
