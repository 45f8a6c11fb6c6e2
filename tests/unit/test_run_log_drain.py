"""RunLog.drain after a stop: step and epoch lines whose sums across workers never complete (an
async worker that stopped earlier never adds its share) are left out, but the evaluations held
behind them are written: a run stopped at its target keeps the evaluation that reached it. The
lines whose sums every worker posted are waited for, the others not at all."""

from __future__ import annotations

import json

from hvdtrain.loop.run_log import RunLog
from hvdtrain.scheme import Group, PendingSum

from fake_group import OwnGroup


class NeverSummed(OwnGroup, Group):
    """A scheme whose sums across workers never arrive, as after another worker stopped."""

    def sum_later(self, values):
        return PendingSum(None)

    def workers(self):
        return 0, 2

    def sums_posted_everywhere(self, posted):
        return 0  # the other worker stopped before its first epoch's sums


class SlowSums(OwnGroup, Group):
    """Sums that complete only when waited for; the other worker posted only the first."""

    def __init__(self):
        self.waited = []

    def workers(self):
        return 0, 2

    def sum_later(self, values):
        scheme = self

        class Slow(PendingSum):
            def ready(self):
                return False

            def wait(self):
                scheme.waited.append(values)
                return [2 * v for v in values]
        return Slow()

    def sums_posted_everywhere(self, posted):
        assert posted == 2
        return 1


def test_drain_writes_the_held_evaluations_and_leaves_out_the_unsummed_lines(tmp_path, capsys):
    log = RunLog(epochs=3, scheme=NeverSummed(), metric_names=["acc"], is_main=True,
                 progress_bar=False, log_steps=False)
    log.open(tmp_path, append=False, header={})
    log.evaluation(0, 4, (1.5, {"acc": 0.5}), wall_seconds=0.2, train_seconds=0.1)  # written now
    log.end_epoch(0, 8, 0.1, 2, None, 0.4, {})  # waits for the other worker's epoch sums
    log.evaluation(1, 12, (0.5, {"acc": 0.96}), wall_seconds=0.7, train_seconds=0.5)  # held
    # an epoch whose own evaluation reached the target, its line held too
    log.end_epoch(1, 16, 0.1, 2, (0.4, {"acc": 0.97}), 0.9, {"train_seconds": 0.6})
    log.drain()
    log.close()
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    evals = [(r["step"], r["test_acc"], r["train_seconds"]) for r in lines if r["type"] == "eval"]
    assert evals == [(4, 0.5, 0.1), (12, 0.96, 0.5), (16, 0.97, 0.6)]
    assert [r["wall_seconds"] for r in lines if r["type"] == "eval"][-1] == 0.9
    assert not [r for r in lines if r["type"] == "epoch"]
    assert "2 step or epoch line(s) left out of the log" in capsys.readouterr().out


def test_drain_waits_for_the_sums_every_worker_posted_and_no_others(tmp_path, capsys):
    scheme = SlowSums()
    log = RunLog(epochs=3, scheme=scheme, metric_names=["acc"], is_main=True,
                 progress_bar=False, log_steps=False)
    log.open(tmp_path, append=False, header={})
    log.end_epoch(0, 8, 0.1, 2, (1.0, {"acc": 0.7}), 0.4, {"train_seconds": 0.3})
    log.end_epoch(1, 16, 0.1, 2, (0.4, {"acc": 0.97}), 0.9, {"train_seconds": 0.6})
    log.drain()
    log.close()
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["type"], r["step"]) for r in lines if r["type"] in ("epoch", "eval")] == [
        ("epoch", 8), ("eval", 16)]
    assert len(scheme.waited) == 1  # the second epoch's sum is never waited for
    assert "1 step or epoch line(s) left out of the log" in capsys.readouterr().out


class OneWorker(OwnGroup, Group):
    def workers(self):
        return 0, 1

    def sum_later(self, values):
        return PendingSum(values)


def test_an_evaluation_inside_an_epoch_is_left_out_of_its_samples_per_second(tmp_path):
    """The epoch line's samples/s (and so its TFLOP/s) counts training time only: an
    evaluation timed on the training clock inside the epoch is taken out of the epoch's time."""
    import time

    import torch

    from hvdtrain.loop.clock import TrainingClock
    from hvdtrain.replica import BatchStats

    clock = TrainingClock()
    clock.start()
    log = RunLog(epochs=1, scheme=OneWorker(), metric_names=[], is_main=True,
                 progress_bar=False, log_steps=False, clock=clock)
    log.open(tmp_path, append=False, header={})
    log.start_epoch(0, 1)
    log.step(0, 1, 0.1, 0.5, BatchStats(torch.tensor(16.0), 32))
    clock.timed(lambda: time.sleep(0.5))  # an evaluation of half a second
    log.end_epoch(0, 1, 0.1, 1, None, 0.6, {})
    log.close()
    epoch = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()
             if json.loads(line)["type"] == "epoch"][0]
    assert epoch["epoch_seconds"] < 0.25, epoch
    assert epoch["samples_per_sec"] > 32 / 0.25, epoch
