"""An epoch's running sums (loop/epoch_totals.py) and the progress bar that shows them
(run_output.py ProgressBar): on a GPU, a metric's sum stays on the GPU and is read where the
figures are shown, not at every step, so that a step waits for the GPU once (its loss), as a
hand-written loop does. A "meta" tensor stands in for a GPU's: it has a device other than the
CPU, and reading its value raises."""

from __future__ import annotations

import io

import pytest
import torch

from hvdtrain.loop.epoch_totals import EpochTotals
from hvdtrain.replica import BatchStats
from hvdtrain.run_output import ProgressBar


def stats(correct, count=4, device="cpu"):
    return BatchStats(torch.tensor(1.0), count,
                      {"acc": (torch.tensor(correct, device=device), count)})


def test_a_device_metric_is_added_on_its_device_without_being_read():
    totals = EpochTotals(["acc"])
    for _ in range(3):
        totals.add(1.0, stats(2, device="meta"))  # float() of a meta tensor would raise
    total, count = totals.metrics["acc"]
    assert isinstance(total, torch.Tensor) and total.device.type == "meta"
    assert total.dtype == torch.int64 and count == 12  # a count stays an exact integer
    with pytest.raises((RuntimeError, NotImplementedError)):
        totals.as_vector(1.0)  # read here, at the epoch's end


def test_cpu_metrics_add_as_floats_and_read_the_same():
    totals = EpochTotals(["acc"])
    for correct in (1, 3, 4):
        totals.add(0.5 * 4, stats(correct))
    assert totals.metrics["acc"] == [8.0, 12.0]
    assert totals.as_vector(2.0) == [6.0, 12.0, 6.0, 12.0, 8.0, 12.0]
    assert totals.running() == {"loss": 0.5, "acc": pytest.approx(8 / 12)}


def test_a_token_loss_over_workers_is_the_mean_over_every_scored_token():
    """Padded sequences of unequal lengths on two workers: the test loss is the mean over all
    their scored tokens, as one worker scoring both gives, not the mean of the two workers'
    means (a 2-worker run reported 3.06 where 1 worker reported 1.52)."""
    from hvdtrain.losses import IGNORE_INDEX, token_cross_entropy
    from hvdtrain.loop.epoch_totals import means
    from hvdtrain.replica import Objective

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 6, 5, generator=g)
    target = torch.randint(0, 5, (4, 6), generator=g)
    target[2:, 1:] = IGNORE_INDEX  # the second worker's sequences are one token long
    objective = Objective(token_cross_entropy)
    whole = token_cross_entropy(logits, target).item()

    def worker_vector(rows):
        totals = EpochTotals([])
        _, batch = objective.score(logits[rows], target[rows])
        totals.add(batch.loss_sum.item(), batch)
        return totals.as_vector(1.0)

    summed = [a + b for a, b in zip(worker_vector(slice(0, 2)), worker_vector(slice(2, 4)))]
    assert means(summed, [])[0] == pytest.approx(whole)
    _, both = objective.score(logits, target)
    assert both.count == 4 and int(both.loss_weight) == 14 and both.mean_loss() == \
        pytest.approx(whole)
    _, plain = Objective(torch.nn.functional.mse_loss).score(torch.ones(3, 2), torch.zeros(3, 2))
    assert plain.loss_weight == 3  # a loss that declares no weight is weighed by its samples


def test_a_16_bit_float_metric_adds_up_in_float32():
    totals = EpochTotals(["err"])
    half = BatchStats(torch.tensor(1.0), 1, {"err": (torch.tensor(0.1, dtype=torch.bfloat16,
                                                                   device="meta"), 1)})
    totals.add(1.0, half)
    assert totals.metrics["err"][0].dtype == torch.float32


def test_the_bar_reads_the_figures_only_when_it_shows_them():
    asked = []

    def figures():
        asked.append(1)
        return {"loss": 0.25}

    stream = io.StringIO()  # a pipe: one line at the epoch's end
    bar = ProgressBar(enabled=True, stream=stream)
    bar.start_epoch(1, 2, 3)
    for _ in range(3):
        bar.update(0.002, figures)
    assert asked == []
    bar.end_epoch()
    assert asked == [1] and "3/3 [" in stream.getvalue() and "2ms/step - loss: 0.2500" in \
        stream.getvalue()


def test_a_terminals_bar_reads_them_at_most_every_refresh_and_at_the_end(monkeypatch):
    from hvdtrain import run_output

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    now = [100.0]
    monkeypatch.setattr(run_output.time, "perf_counter", lambda: now[0])
    asked = []
    bar = ProgressBar(enabled=True, stream=Terminal())
    bar.start_epoch(1, 1, 10)
    for _ in range(10):
        now[0] += run_output.REFRESH_S / 4
        bar.update(0.001, lambda: asked.append(1) or {"acc": 0.5})
    assert 2 <= len(asked) <= 4  # the first step, then about every fourth
    bar.end_epoch()
    assert "acc: 0.5000" in bar.stream.getvalue()
