"""A worker's running sums over the epoch under way (and over an evaluation): the loss and what
it weighs (replica.BatchStats.loss_weight), the samples and each metric's sum and count, in the
layout that adds up across workers (``as_vector``), and the means of such a sum (``means``).
The run log (run_log.py) and the evaluator (evaluator.py) keep one each."""

from __future__ import annotations

import time
from typing import Any

import torch

from ..replica import BatchStats


class EpochTotals:
    """This worker's running sums over the epoch under way."""

    def __init__(self, metric_names: list[str]):
        self.names = metric_names
        self.loss = 0.0
        self.count = 0
        self.loss_weight: float | torch.Tensor = 0.0
        self.metrics = {name: [0.0, 0.0] for name in metric_names}
        self.started = time.perf_counter()
        self.steps = 0

    def add(self, loss_sum: float, stats: BatchStats) -> None:
        self.loss += loss_sum
        self.count += stats.count
        self.loss_weight = _added(self.loss_weight, stats.loss_weight)
        self.steps += 1
        for name, (s, c) in stats.metrics.items():
            sums = self.metrics[name]
            sums[0], sums[1] = _added(sums[0], s), _added(sums[1], c)

    def running(self) -> dict[str, float]:
        out = {"loss": self.loss / max(float(self.loss_weight), 1)}
        for name, (s, c) in self.metrics.items():
            if c:
                out[name] = float(s) / float(c)
        return out

    def as_vector(self, seconds: float) -> list[float]:
        """[loss sum, samples, samples/s, loss weight, then each metric's sum and count]: adds
        across workers."""
        rate = self.count / seconds if seconds > 0 else 0.0
        return [self.loss, float(self.count), rate, float(self.loss_weight),
                *[float(v) for name in self.names for v in self.metrics[name]]]


def _added(total: float | torch.Tensor, value: Any) -> float | torch.Tensor:
    """``total`` + ``value``, a metric's running sum. A tensor on a GPU stays there, added to
    the sum on the GPU: reading it (float()) would wait for the GPU, a second wait each step
    beside the loss's own read, where a hand-written loop waits once. It is read where the
    epoch's figures are (as_vector, running). Integer counts stay exact integers; a 16-bit
    float sum would lose digits, so floats add up in float32 at least."""
    if not (isinstance(value, torch.Tensor) and value.device.type != "cpu"):
        return total + float(value)
    value = value.detach()
    if value.is_floating_point() and value.dtype.itemsize < 4:
        value = value.float()
    return value.clone() if isinstance(total, float) and total == 0.0 else total + value


def means(vector: list[float], names: list[str]) -> tuple[float, dict[str, float | None]]:
    """(mean loss, each metric's mean or None) from a summed vector of as_vector's layout."""
    metrics = {}
    for i, name in enumerate(names):
        s, c = vector[4 + 2 * i], vector[5 + 2 * i]
        metrics[name] = s / c if c else None
    return vector[0] / max(vector[3], 1), metrics
