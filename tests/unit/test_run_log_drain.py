"""RunLog.drain after a stop: step and epoch lines whose sums across workers never complete (an
async worker that stopped earlier never adds its share) are left out, but the evaluations held
behind them are written: a run stopped at its target keeps the evaluation that reached it."""

from __future__ import annotations

import json

from hvdtrain.loop.run_log import RunLog
from hvdtrain.scheme import PendingSum, UpdateScheme


class NeverSummed(UpdateScheme):
    """A scheme whose sums across workers never arrive, as after another worker stopped."""

    def sum_later(self, values):
        return PendingSum(None)


def test_drain_writes_the_held_evaluations_and_leaves_out_the_unsummed_lines(tmp_path, capsys):
    log = RunLog(epochs=3, scheme=NeverSummed(), metric_names=["acc"], is_main=True,
                 progress_bar=False, log_steps=False)
    log.open(tmp_path / "metrics.jsonl", append=False, header={})
    log.evaluation(0, 4, (1.5, {"acc": 0.5}), wall_seconds=0.2, train_seconds=0.1)  # written now
    log.end_epoch(0, 8, 0.1, 2, None, 0.4, {})  # waits for the other worker's epoch sums
    log.evaluation(1, 12, (0.5, {"acc": 0.96}), wall_seconds=0.7, train_seconds=0.5)  # held
    # an epoch whose own evaluation reached the target, its line held too
    log.end_epoch(1, 16, 0.1, 2, (0.4, {"acc": 0.97}), 0.9, {"train_seconds": 0.6})
    log.drain(0.05)
    log.close()
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    evals = [(r["step"], r["test_acc"], r["train_seconds"]) for r in lines if r["type"] == "eval"]
    assert evals == [(4, 0.5, 0.1), (12, 0.96, 0.5), (16, 0.97, 0.6)]
    assert [r["wall_seconds"] for r in lines if r["type"] == "eval"][-1] == 0.9
    assert not [r for r in lines if r["type"] == "epoch"]
    assert "2 step or epoch line(s) left out of the log" in capsys.readouterr().out
