"""Each parameter server writes its shard beside the lead's checkpoint (hvdtrain/ps/shard_file.py)
and reads it back on resume, so that a checkpoint moves no model across the network. Real
servers on the fake communicator of tests/fake_ps.py: the lead's SAVE gets an ACK and a few
words back, never the model; a resume with another number of servers assembles each shard from
the files that cover it; a missing or foreign file falls back to the checkpoint's model with
fresh optimizer state, and says so. tests/multiproc/test_async_diloco_multiproc.py and
test_async_multiproc.py resume real jobs from these files."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fake_ps import Job
from hvdtrain import checkpoint
from hvdtrain.config import Config
from hvdtrain.loop import own_state
from hvdtrain.loop.resume_source import resume_source
from hvdtrain.ps import shard_file
from hvdtrain.ps.protocol import WANT_PARAMS, Kind, Tag, make_header
from hvdtrain.scheme import Group, UpdateScheme

TOTAL = 10
POSITION = own_state.checkpoint_position({"mode": "async", "model": "mlp"}, 2, 0)


class Lead(Group, UpdateScheme):
    """Worker 0 of one, its own group: what resume_source asks of a scheme."""

    group = property(lambda self: self)

    def workers(self):
        return 0, 1

    def broadcast_object(self, obj):
        return obj


def momentum_sgd() -> Config:
    cfg = Config()
    cfg.optim.momentum, cfg.ps.bsp = 0.9, False
    return cfg


def trained_job(monkeypatch, servers: int) -> Job:
    """Two workers' pushes through ``servers`` real servers (momentum SGD: a vector each)."""
    job = Job(monkeypatch, 2, 0, servers=servers, total=TOTAL, cfg=momentum_sgd())
    rng = np.random.default_rng(3)
    for clock, worker in enumerate([0, 1, 1, 0], start=1):
        job.segments[worker][:] = rng.standard_normal(TOTAL).astype(np.float32)
        header = make_header(Kind.PUSH, clock=clock, lr=0.1, flags=WANT_PARAMS, worker=worker)
        for rank in job.topology.server_ranks():
            job.handle(rank, worker, header)
    return job


def save(job: Job, path) -> dict:
    """Worker 0's SAVE to every server, as ServerLink does it: the place, then the header. The
    checkpoint's server state, after checking what each server sent back."""
    place = (str(path), POSITION)
    metas = []
    for rank in job.topology.server_ranks():
        job.post(0, rank, Tag.INFO, place)
        job.sent.clear()
        job.handle(rank, 0, make_header(Kind.SAVE, clock=4, worker=0))
        assert [(dest, tag) for dest, tag, _ in job.sent] == [(0, Tag.ACK), (0, Tag.INFO)]
        metas.append(job.sent[1][2])
    assert metas[0]["version"] == 4 and "vectors" not in metas[0]
    state = {"shards": [meta["shard"] for meta in metas], "version": metas[0]["version"]}
    checkpoint.save_atomic({**POSITION, "model": {}, "server_state": state}, path)
    return state


def whole(job: Job) -> tuple[np.ndarray, np.ndarray]:
    """(the parameters, the momentum) of every server's shard, end to end."""
    return (np.concatenate([job.params(i) for i in range(len(job.servers))]),
            np.concatenate([s.shard.optimizer.vectors["momentum_buffer"].numpy()
                            for s in job.servers]))


@pytest.mark.parametrize("saved_by, resumed_by", [(2, 2), (2, 3), (3, 1)])
def test_each_server_writes_its_shard_and_a_resume_with_any_number_of_servers_reads_it(
        monkeypatch, tmp_path, saved_by, resumed_by):
    job = trained_job(monkeypatch, saved_by)
    state = save(job, tmp_path / "checkpoint.pt")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt"] + [
        f"checkpoint.server-{i}.pt" for i in range(saved_by)]
    params, momentum = whole(job)
    assert np.abs(momentum).max() > 0
    resumed = Job(monkeypatch, 2, 0, servers=resumed_by, total=TOTAL, cfg=momentum_sgd())
    for index, server in enumerate(resumed.servers):
        assert shard_file.restore(server.shard, index, {
            **state, "place": (str(tmp_path / "checkpoint.pt"), POSITION)})
    got_params, got_momentum = whole(resumed)
    assert np.array_equal(got_params, params) and np.array_equal(got_momentum, momentum)
    found = shard_file.read_all(tmp_path)
    assert np.array_equal(found["vectors"]["momentum_buffer"].numpy(), momentum)


def test_a_missing_or_foreign_shard_file_falls_back_to_the_checkpoints_model_and_says_why(
        monkeypatch, tmp_path, capsys):
    state = save(trained_job(monkeypatch, 2), tmp_path / "checkpoint.pt")
    (tmp_path / "checkpoint.server-1.pt").unlink()
    later = {**POSITION, "epoch": 3}
    place = {**state, "place": (str(tmp_path / "checkpoint.pt"), POSITION)}
    resumed = Job(monkeypatch, 2, 0, servers=2, total=TOTAL, cfg=momentum_sgd())
    sent = resumed.params(1)  # as INIT brought them
    capsys.readouterr()
    assert shard_file.restore(resumed.servers[0].shard, 0, place)
    assert not shard_file.restore(resumed.servers[1].shard, 1, place)
    assert not shard_file.restore(resumed.servers[0].shard, 0, {
        **state, "place": (str(tmp_path / "checkpoint.pt"), later)})
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0] == ("hvdtrain: parameter server 1 starts from the checkpoint's model, with "
                      "fresh optimizer state, not its own shard: no checkpoint.server-1.pt "
                      f"beside {tmp_path / 'checkpoint.pt'}"), out
    assert "belongs to another checkpoint (written at epoch 2, step 0; the checkpoint is at " \
           "epoch 3, step 0)" in out[1], out
    assert np.array_equal(resumed.params(1), sent)
    assert not resumed.servers[1].shard.optimizer.vectors["momentum_buffer"].any()


def test_a_shard_file_is_no_checkpoint(monkeypatch, tmp_path):
    save(trained_job(monkeypatch, 1), tmp_path / "checkpoint.pt")
    with pytest.raises(checkpoint.CheckpointError, match="server 0's own state, kept beside "
                       "the checkpoint .*checkpoint.pt, not a checkpoint; resume from"):
        checkpoint.load(tmp_path / "checkpoint.server-0.pt")
    assert checkpoint.checkpoint_beside(tmp_path / "best.server-2.pt") == tmp_path / "best.pt"
    cfg = Config()  # --resume of the shard itself names the checkpoint to resume
    cfg.run.resume = str(tmp_path / "checkpoint.server-0.pt")
    with pytest.raises(checkpoint.CheckpointError, match="checkpoint.server-0.pt is a parameter "
                       "server's shard, kept beside the checkpoint .*; resume from "):
        resume_source(cfg.run, tmp_path, False, Lead())


def test_a_failed_shard_write_warns_and_keeps_the_previous_file(monkeypatch, tmp_path, capsys):
    job = trained_job(monkeypatch, 1)
    save(job, tmp_path / "checkpoint.pt")
    before = (tmp_path / "checkpoint.server-0.pt").read_bytes()

    def full_disk(obj, f):
        f.write(b"PK\x03\x04 half of it")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint.torch, "save", full_disk)
    job.post(0, job.topology.server_ranks()[0], Tag.INFO, (str(tmp_path / "checkpoint.pt"),
                                                          {**POSITION, "epoch": 3}))
    job.handle(job.topology.server_ranks()[0], 0, make_header(Kind.SAVE, clock=4, worker=0))
    assert "warning: could not write" in capsys.readouterr().out
    assert (tmp_path / "checkpoint.server-0.pt").read_bytes() == before
    assert not [p for p in tmp_path.iterdir() if ".tmp" in p.name]
