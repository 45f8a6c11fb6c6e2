"""Each async DiLoCo worker's own inner optimizer state beside the checkpoint
(hvdtrain/loop/own_state.py): worker 1 writes checkpoint.worker-1.pt at the save where worker 0
writes checkpoint.pt, and takes it back on resume only where it belongs to that checkpoint;
otherwise it starts from worker 0's state and says why. Two Checkpointers in one process, worker
1's told what worker 0's decided (as main_decides would tell it), with the real inner optimizer
state of ps/diloco_client.py; tests/multiproc/test_async_diloco_multiproc.py runs it for real."""

from __future__ import annotations

import re

import pytest
import torch

from hvdtrain import checkpoint
from hvdtrain.config import Config
from hvdtrain.loop.checkpointer import Checkpointer
from hvdtrain.loop.resume_source import resume_source
from hvdtrain.ps.diloco_client import InnerOptimizerState
from hvdtrain.scheme import Group, Progress, UpdateScheme

IDENTITY = {"mode": "async", "model": "mlp", "optimizer": "sgd"}
AT_EPOCH_1 = Progress(epoch=1, step=0, global_step=10, workers=2)


class Worker(Group, UpdateScheme):
    """Worker ``index`` of two, its own group. Worker 0 leads and keeps what it broadcasts in
    ``told``; worker 1 takes its answers from there, in order."""

    def __init__(self, index: int, told: list, optimizer: torch.optim.Optimizer):
        self.index, self.told = index, told
        self.own_state = InnerOptimizerState(optimizer)

    @property
    def group(self):
        return self

    def workers(self):
        return self.index, 2

    def sum_across_workers(self, values):
        return list(values)

    def broadcast_object(self, obj):
        if self.index == 0:
            self.told.append(obj)
            return obj
        return self.told.pop(0)

    def state_dict(self):
        return {"model": {"w": torch.zeros(2)}} if self.index == 0 else {}


def inner_optimizer(steps: int = 0) -> torch.optim.Optimizer:
    """SGD with momentum over one parameter, after ``steps`` steps (its momentum buffer)."""
    w = torch.nn.Parameter(torch.zeros(2))
    optimizer = torch.optim.SGD([w], lr=0.1, momentum=0.9)
    for i in range(steps):
        w.grad = torch.tensor([1.0, float(i)])
        optimizer.step()
    return optimizer


def pair(run_dir, told, optimizer, resume=None):
    """(worker 0's checkpointer, worker 1's) for a run in ``run_dir``."""
    cfg = Config()
    cfg.run.run_dir, cfg.run.resume = str(run_dir), resume and str(resume)
    return [Checkpointer(cfg, Worker(i, told, opt), run_dir, lambda: dict(IDENTITY),
                         lambda: {"w": torch.zeros(2)})
            for i, opt in ((0, inner_optimizer()), (1, optimizer))]


def save(run_dir, optimizer, progress=AT_EPOCH_1, worker_progress=None):
    lead, other = pair(run_dir, [], optimizer)
    lead.save(progress)
    return other.save(worker_progress or progress)


def resume(source, run_dir=None):
    """Worker 1's inner optimizer after the pair resumed ``source`` (into ``run_dir``)."""
    told, optimizer = [], inner_optimizer()
    lead, other = pair(run_dir or source, told, optimizer, resume=source)
    lead.restore(2)
    other.restore(2)
    assert not told  # worker 1 heard every answer worker 0 gave
    return other


def momentum(optimizer) -> torch.Tensor:
    return optimizer.state_dict()["state"][0]["momentum_buffer"]


def test_the_file_beside_a_checkpoint_is_named_after_it_and_is_no_checkpoint(tmp_path):
    assert checkpoint.worker_file(tmp_path / "checkpoint.pt", 1) == \
        tmp_path / "checkpoint.worker-1.pt"
    assert checkpoint.worker_file(tmp_path / "best.pt", 3).name == "best.worker-3.pt"
    assert checkpoint.worker_file(tmp_path / "snapshot", 2).name == "snapshot.worker-2"
    assert checkpoint.checkpoint_beside(tmp_path / "checkpoint.worker-12.pt") == \
        tmp_path / "checkpoint.pt"
    assert checkpoint.checkpoint_beside(tmp_path / "checkpoint.pt") is None
    written = save(tmp_path, inner_optimizer(steps=2))
    assert written == tmp_path / "checkpoint.worker-1.pt"
    with pytest.raises(checkpoint.CheckpointError, match="worker 1's own state, kept beside "
                       "the checkpoint .*checkpoint.pt, not a checkpoint"):
        checkpoint.load(written)
    cfg = Config()  # --resume of the worker's file itself names the checkpoint to resume
    cfg.run.resume = str(written)
    with pytest.raises(checkpoint.CheckpointError, match="resume from .*checkpoint.pt$"):
        resume_source(cfg.run, tmp_path, False, Worker(0, [], inner_optimizer()))


def test_each_worker_resumes_its_own_inner_state_and_writes_it_into_a_new_folder(
        tmp_path, capsys):
    saved = inner_optimizer(steps=3)
    save(tmp_path / "a", saved)
    capsys.readouterr()
    other = resume(tmp_path / "a" / "checkpoint.pt", run_dir=tmp_path / "b")
    own = other.scheme.group.own_state
    assert own.loaded
    assert torch.equal(momentum(own.optimizer), momentum(saved))
    assert "starts from the checkpoint's" not in capsys.readouterr().out
    other.save(AT_EPOCH_1)  # --resume A --run-dir B: its next file goes into B
    assert (tmp_path / "b" / "checkpoint.worker-1.pt").is_file()


@pytest.mark.parametrize("worker_progress, why", [
    (Progress(epoch=0, step=7, global_step=7, workers=2),  # a step checkpoint of its own
     r"belongs to another checkpoint \(written at epoch 0, step 7; the checkpoint is at "
     r"epoch 1, step 0\)"),
    (None, r"no checkpoint.worker-1.pt beside"),
])
def test_a_file_of_another_position_or_none_falls_back_to_worker_0s_with_why(
        tmp_path, capsys, worker_progress, why):
    save(tmp_path, inner_optimizer(steps=3), worker_progress=worker_progress)
    if worker_progress is None:
        (tmp_path / "checkpoint.worker-1.pt").unlink()
    capsys.readouterr()
    other = resume(tmp_path)
    assert not other.scheme.group.own_state.loaded
    assert other.scheme.group.own_state.optimizer.state_dict()["state"] == {}
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1, out
    assert out[0].startswith("hvdtrain: worker 1 starts from the checkpoint's inner optimizer "
                             "state (worker 0's, or a fresh one where it holds none), not its "
                             "own: "), out
    assert re.search(why, out[0]), out


def test_a_file_of_another_run_setup_falls_back(tmp_path, capsys):
    save(tmp_path, inner_optimizer(steps=3))
    state = torch.load(tmp_path / "checkpoint.worker-1.pt", weights_only=True)
    checkpoint.save_atomic({**state, "identity": {**IDENTITY, "model": "cnn"}},
                           tmp_path / "checkpoint.worker-1.pt")
    capsys.readouterr()
    other = resume(tmp_path)
    assert not other.scheme.group.own_state.loaded
    assert "belongs to another checkpoint (written for another run setup)" in \
        capsys.readouterr().out


@pytest.mark.parametrize("garbage", [b"", b"PK\x03\x04 cut short", b"not a checkpoint at all"])
def test_a_corrupt_file_falls_back_with_a_message_and_never_fails_the_resume(
        tmp_path, capsys, garbage):
    save(tmp_path, inner_optimizer(steps=3))
    (tmp_path / "checkpoint.worker-1.pt").write_bytes(garbage)
    capsys.readouterr()
    other = resume(tmp_path)
    assert not other.scheme.group.own_state.loaded
    out = capsys.readouterr().out
    assert "worker 1 starts from the checkpoint's inner optimizer state" in out
    assert "checkpoint.worker-1.pt is unreadable (" in out, out


def test_a_file_that_does_not_fit_the_optimizer_falls_back(tmp_path, capsys):
    save(tmp_path, inner_optimizer(steps=3))
    state = torch.load(tmp_path / "checkpoint.worker-1.pt", weights_only=True)
    state["state"]["inner_optimizer"]["param_groups"].append(
        dict(state["state"]["inner_optimizer"]["param_groups"][0]))  # two groups, not one
    checkpoint.save_atomic(state, tmp_path / "checkpoint.worker-1.pt")
    capsys.readouterr()
    other = resume(tmp_path)
    assert not other.scheme.group.own_state.loaded
    assert "not its own: it does not fit this run (ValueError" in capsys.readouterr().out


def test_a_failed_write_leaves_no_partial_file_and_keeps_the_previous_one(
        tmp_path, capsys, monkeypatch):
    save(tmp_path, inner_optimizer(steps=3))
    before = (tmp_path / "checkpoint.worker-1.pt").read_bytes()

    def full_disk(obj, f):
        f.write(b"PK\x03\x04 half of it")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint.torch, "save", full_disk)
    capsys.readouterr()
    later = Progress(epoch=2, step=0, global_step=20, workers=2)
    _, other = pair(tmp_path, [], inner_optimizer(steps=5))
    assert other.save(later) is None  # a warning, not the job's end
    assert "warning: could not write" in capsys.readouterr().out
    assert (tmp_path / "checkpoint.worker-1.pt").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "checkpoint.pt", "checkpoint.worker-1.previous.pt", "checkpoint.worker-1.pt"]


def test_a_file_written_after_the_leads_last_checkpoint_resumes_from_the_one_it_replaced(
        tmp_path, capsys):
    """The job died after worker 1 wrote its epoch-2 file and before worker 0's epoch-2
    checkpoint landed: the epoch-1 checkpoint resumes with worker 1's epoch-1 state, kept as
    the previous file, not with worker 0's."""
    at_epoch_1 = inner_optimizer(steps=3)
    save(tmp_path, at_epoch_1)
    _, other = pair(tmp_path, [], inner_optimizer(steps=6))
    other.save(Progress(epoch=2, step=0, global_step=20, workers=2))
    capsys.readouterr()
    resumed = resume(tmp_path).scheme.group.own_state
    assert resumed.loaded, capsys.readouterr().out
    assert torch.equal(momentum(resumed.optimizer), momentum(at_epoch_1))
    assert not torch.equal(momentum(at_epoch_1), momentum(inner_optimizer(steps=6)))
