"""--async-checkpoint in one process: the copy is a snapshot, writes go in order, a write error
reaches the training thread, and a run with background writes leaves the same checkpoints (and
resumes alike) as one that writes them at once, even when the disk is slow."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from hvdtrain import checkpoint
from hvdtrain.loop import TrainingError
from hvdtrain.loop.checkpoint_writer import CheckpointWriter, cpu_copy
from test_trainer import make_trainer


def test_the_copy_is_a_snapshot_that_keeps_shared_tensors_shared():
    weight = torch.ones(3)
    state = {"model": {"w": weight, "tied": weight}, "optimizer": {"state": {0: {
        "momentum_buffer": torch.zeros(2), "step": torch.tensor(5.0)}}, "param_groups": [
        {"lr": 0.1, "params": [0]}]}, "epoch": 2}
    copy = cpu_copy(state)
    weight.add_(1)
    state["optimizer"]["state"][0]["momentum_buffer"].fill_(7)
    assert copy["model"]["w"].tolist() == [1.0, 1.0, 1.0]
    assert copy["model"]["tied"] is copy["model"]["w"]
    assert copy["optimizer"]["state"][0]["momentum_buffer"].tolist() == [0.0, 0.0]
    assert copy["optimizer"]["param_groups"] == [{"lr": 0.1, "params": [0]}]
    assert copy["epoch"] == 2


def test_a_second_save_waits_for_the_first_write_and_writes_go_in_order():
    writer, written, release = CheckpointWriter(), [], threading.Event()

    def slow(copy):
        release.wait(5)
        written.append(copy["n"])

    writer.submit({"n": 1}, slow)
    assert writer.in_flight
    threading.Timer(0.3, release.set).start()
    started = time.perf_counter()
    writer.submit({"n": 2}, lambda copy: written.append(copy["n"]))
    assert time.perf_counter() - started >= 0.25  # it waited for the first write
    writer.wait()
    assert written == [1, 2] and not writer.in_flight


def test_a_write_error_is_raised_once_in_the_training_thread():
    writer = CheckpointWriter()

    def fail(copy):
        raise TrainingError("could not write the epoch 1 checkpoint to x (No space left)")

    writer.submit({}, fail)
    with pytest.raises(TrainingError, match="could not write the epoch 1 checkpoint"):
        writer.submit({}, lambda copy: None)  # the next save raises it
    writer.submit({}, fail)
    with pytest.raises(TrainingError):
        writer.wait()  # ...or the end of the run
    writer.wait()  # raised once: not again


def _slow_disk(monkeypatch, seconds):
    """save_atomic that takes ``seconds`` longer, so that training runs on during the write."""
    real = checkpoint.save_atomic

    def slow(state, path):
        time.sleep(seconds)
        return real(state, path)

    monkeypatch.setattr(checkpoint, "save_atomic", slow)


def _tensors(path):
    state = checkpoint.load(path)
    return state, {k: v.clone() for k, v in state["model"].items()}


def test_background_writes_leave_the_checkpoints_a_synchronous_run_writes(tmp_path, monkeypatch):
    make_trainer(tmp_path / "sync", epochs=2, checkpoint_steps=3).fit()
    _slow_disk(monkeypatch, 0.05)
    trainer = make_trainer(tmp_path / "async", epochs=2, checkpoint_steps=3,
                           async_checkpoint=True, keep_best="test_acc")
    trainer.fit()
    assert not trainer.checkpointer.writer.in_flight
    sync, sync_model = _tensors(tmp_path / "sync")
    background, model = _tensors(tmp_path / "async")
    assert (background["epoch"], background["global_step"]) == (sync["epoch"],
                                                                sync["global_step"])
    for name, tensor in sync_model.items():
        assert torch.equal(model[name], tensor), name
    assert checkpoint.load(tmp_path / "async" / "best.pt")["epoch"] >= 1
    assert not list((tmp_path / "async").glob(".*.tmp*"))


def test_a_step_checkpoint_written_in_the_background_resumes_exactly(tmp_path, monkeypatch):
    # Interrupted mid-epoch right after a step checkpoint, then resumed: the same weights as an
    # uninterrupted run. The write is slow, so the steps after the save run during it.
    from test_trainer import CrashAt

    make_trainer(tmp_path / "whole", epochs=2).fit()
    _slow_disk(monkeypatch, 0.1)
    with pytest.raises(KeyboardInterrupt):
        make_trainer(tmp_path / "cut", [CrashAt(8)], epochs=2, checkpoint_steps=4,
                     async_checkpoint=True).fit()
    state = checkpoint.load(tmp_path / "cut")  # the process waited for it on the way out
    assert (state["epoch"], state["step"]) == (0, 4)
    make_trainer(tmp_path / "cut", epochs=2, resume=str(tmp_path / "cut"),
                 async_checkpoint=True).fit()
    _, whole = _tensors(tmp_path / "whole")
    _, resumed = _tensors(tmp_path / "cut")
    for name, tensor in whole.items():
        assert torch.allclose(resumed[name], tensor, atol=1e-6), name


def test_a_failed_background_write_stops_training_with_what_is_intact(tmp_path, monkeypatch):
    real, calls = checkpoint.save_atomic, []

    def full_after_one(state, path):
        calls.append(path)
        if len(calls) > 1:
            raise checkpoint.CheckpointWriteError("No space left on device")
        return real(state, path)

    monkeypatch.setattr(checkpoint, "save_atomic", full_after_one)
    trainer = make_trainer(tmp_path, epochs=3, async_checkpoint=True)
    with pytest.raises(TrainingError, match=r"could not write the epoch 2 checkpoint .*No space "
                                            r"left on device.*previous checkpoint .* is intact"):
        trainer.fit()
    assert checkpoint.load(tmp_path)["epoch"] == 1


def test_the_background_copy_keeps_a_state_dicts_module_versions():
    from hvdtrain.loop.checkpoint_writer import StateCopy

    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3))
    state = model.state_dict()
    copy = StateCopy()({"model": state})
    assert copy["model"]._metadata == state._metadata
    assert all(copy["model"][k] is not v and torch.equal(copy["model"][k], v)
               for k, v in state.items())
