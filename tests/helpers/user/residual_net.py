"""A user's own model for --model tests/helpers/user/residual_net.py:build: a small residual CNN
with BatchNorm and dropout, written as a plain nn.Module (not an nn.Sequential, no ``.layers``)."""

from __future__ import annotations

import torch
import torch.nn as nn


class ResidualBlock(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(x + self.bn2(self.conv2(out)))  # the skip connection


class ResidualNet(nn.Module):
    """stem -> residual block -> global average pool -> dropout -> linear."""

    def __init__(self, in_channels: int, num_classes: int, width: int = 32, dropout: float = 0.1):
        super().__init__()
        self.stem = nn.Conv2d(in_channels, width, 3, padding=1, bias=False)
        self.stem_bn = nn.BatchNorm2d(width)
        self.block = ResidualBlock(width)
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.stem_bn(self.stem(x)))
        x = self.block(x)
        return self.head(self.dropout(x.mean(dim=(2, 3))))


def build(input_shape, num_classes, width=32):
    """hvdtrain offers input_shape (C, H, W) and num_classes because this signature names them."""
    return ResidualNet(input_shape[0], num_classes, width=width)


def not_a_model(input_shape, num_classes):
    """A broken factory: returns a dict instead of an nn.Module."""
    return {"input_shape": input_shape, "num_classes": num_classes}


def regressor(input_shape, hidden=16):
    """(N, F) -> (N, 1): for the regression dataset with --loss mse."""
    return nn.Sequential(nn.Linear(input_shape[0], hidden), nn.Tanh(), nn.Linear(hidden, 1))


NOT_CALLABLE = 42


class WrongFlatten(nn.Module):
    """A user's bug in forward: the flattened size is wrong for 8x8 inputs."""

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(65, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x.view(-1, 65))


def broken_forward():
    return WrongFlatten()
