"""A new lead mid-run (async, after the lead's loss: loop/lead.py). It continues the run's log
without repeating the epoch lines the lost lead wrote, holds the run folder's lock, and keeps
--keep-best's record from best.pt, so that a worse model does not replace the best one."""

from __future__ import annotations

import json

import torch

from hvdtrain import checkpoint
from hvdtrain.config import Config
from hvdtrain.loop.best import BestTracker
from hvdtrain.loop.checkpointer import Checkpointer
from hvdtrain.loop.run_log import RunLog, last_logged_epoch
from hvdtrain.run_lock import LOCK_NAME, FolderLock
from hvdtrain.scheme import Group, UpdateScheme

from fake_group import OwnGroup


class OneWorker(OwnGroup, Group, UpdateScheme):
    def __init__(self, lead=False):
        self.lead = lead

    def workers(self):
        return 1, 1

    def leads(self):
        return self.lead

    def sum_across_workers(self, values):
        return values

    def state_dict(self):
        return {"model": {"w": torch.zeros(2)}}


def _lines(folder, kind):
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()
            if json.loads(line)["type"] == kind]


def test_the_new_lead_continues_the_log_without_repeating_the_lost_leads_epochs(tmp_path):
    lost = RunLog(epochs=4, scheme=OneWorker(), metric_names=["acc"], is_main=True,
                  progress_bar=False, log_steps=False)
    lost.open(tmp_path, append=False, header={"model": "m"})
    for epoch in range(2):
        lost.end_epoch(epoch, 10 * (epoch + 1), 0.1, 2, None, 0.5, {})
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"type": "epoch", "epo')  # a line cut short counts for nothing
    assert last_logged_epoch(tmp_path / "metrics.jsonl") == 2
    assert last_logged_epoch(tmp_path / "absent.jsonl") == 0
    resumed = tmp_path / "resumed.jsonl"  # logged to epoch 9, resumed from epoch 5's checkpoint
    resumed.write_text("".join(json.dumps(r) + "\n" for r in [
        {"type": "header"}, *({"type": "epoch", "epoch": e} for e in range(1, 10)),
        {"type": "header"}, *({"type": "epoch", "epoch": e} for e in (6, 7))]))
    assert last_logged_epoch(resumed) == 7

    new = RunLog(epochs=4, scheme=OneWorker(), metric_names=["acc"], is_main=False,
                 progress_bar=False, log_steps=False)
    new.open(tmp_path, append=True, header={"model": "m"})  # not the lead yet: no files
    for epoch in range(3):  # epoch 3's line: done here, while the lost lead never wrote it
        new.end_epoch(epoch, 10 * (epoch + 1), 0.1, 2, None, 0.5, {})
    new.take_over(tmp_path, lost=[0])
    new.end_epoch(3, 40, 0.1, 2, None, 0.5, {"workers_lost": [0]})
    new.close()
    assert [e["epoch"] for e in _lines(tmp_path, "epoch")] == [1, 2, 3, 4]
    # epoch 3's sums were the survivors' too: its line says so (it was computed before the
    # loss was known, and lacked it), and the lost lead's own lines do not
    assert [e.get("workers_lost") for e in _lines(tmp_path, "epoch")] == [None, None, [0], [0]]
    assert len(_lines(tmp_path, "header")) == 1
    assert [r.epoch for r in new.history] == [1, 2, 3, 4]  # its own record is whole


def _checkpointer(tmp_path, scheme):
    cfg = Config()
    cfg.run.run_dir = str(tmp_path)
    return Checkpointer(cfg, scheme, tmp_path, lambda: {}, lambda: {})


def test_the_new_lead_takes_the_folder_lock_once_the_lost_lead_lets_go(tmp_path):
    holder = FolderLock(tmp_path)
    holder.acquire()  # the lost lead, frozen rather than dead: it still holds the lock
    scheme = OneWorker(lead=True)
    new = _checkpointer(tmp_path, scheme)
    new.take_over()
    assert new.lock is None
    holder.release()  # its process is gone
    new.save(checkpoint_progress())
    assert new.lock is not None
    try:
        FolderLock(tmp_path).acquire()
        raise AssertionError("another job took the folder from the new lead")
    except Exception as e:  # FolderInUse
        assert "in use" in str(e)
    new.release()
    assert (tmp_path / LOCK_NAME).read_text() == ""


def checkpoint_progress():
    from hvdtrain.scheme import Progress
    return Progress(epoch=1, step=0, global_step=10, workers=2)


def test_the_new_lead_keeps_the_best_record_of_best_pt(tmp_path):
    cfg = Config()
    cfg.run.keep_best = "max:test_acc"
    scheme = OneWorker(lead=True)
    ckpt = _checkpointer(tmp_path, scheme)
    lost = BestTracker(cfg.run, scheme, ckpt, ["acc"], has_test_split=True)
    lost.evaluated((0.2, {"acc": 0.9}), checkpoint_progress())  # writes best.pt
    assert checkpoint.load(tmp_path / "best.pt")["best"]["value"] == 0.9

    new_ckpt = _checkpointer(tmp_path, scheme)
    new = BestTracker(cfg.run, scheme, new_ckpt, ["acc"], has_test_split=True)
    new.take_over()
    assert new.best == 0.9
    before = (tmp_path / "best.pt").stat().st_mtime_ns
    new.evaluated((0.3, {"acc": 0.8}), checkpoint_progress())  # worse: best.pt stays
    assert (tmp_path / "best.pt").stat().st_mtime_ns == before
