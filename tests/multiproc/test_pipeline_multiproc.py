"""Tier 3 for the layer-split pipeline: hybrid (data-parallel x pipelined) mpirun jobs, and the
command's error for impossible stage devices (the split itself is unit-tested in
tests/unit/test_pipeline.py)."""

import pytest
import torch

from launch import hvdtrain, mpirun, run

pytestmark = pytest.mark.multiproc


# --- hybrid parallelism: real mpirun jobs, each with a timeout --------------------------------
HYBRID = ["--no-progress", "--seed", "1", "--stages", "2", "--devices", "cpu,cpu",
          "--micro-batches", "4"]


def _records(run_dir, kind):
    from hvdtrain.run_output import read_jsonl
    return [r for r in read_jsonl(run_dir / "metrics.jsonl") if r["type"] == kind]


@pytest.mark.multiproc
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_hybrid_run_trains_digits_to_95_percent(tmp_path, mode):
    # mpirun -np 2: two data-parallel replicas (sync), or one server and one worker (async);
    # every replica is split into two CPU stages.
    run(mpirun(2, *hvdtrain("train", *HYBRID, "--mode", mode, "--epochs", "15",
                            "--run-dir", str(tmp_path))))
    epochs = _records(tmp_path, "epoch")
    assert epochs[-1]["test_acc"] >= 0.95, epochs[-1]
    pipe = epochs[-1]["pipeline"]
    assert pipe["stages"] == 2 and pipe["layers"] == [[0, 3], [3, 6]]
    assert 0 < pipe["bubble_fraction"] < 1 and pipe["gpipe_bubble_formula"] == 0.2


# The unsplit sync run that the split runs below must reproduce.
UNSPLIT = ["--no-progress", "--seed", "1", "--epochs", "1", "--momentum", "0.9"]


@pytest.fixture(scope="module")
def unsplit_model(tmp_path_factory):
    """The final model of one unsplit 2-rank sync run, shared by both split-versus-unsplit
    tests (one launch instead of one each)."""
    run_dir = tmp_path_factory.mktemp("plain")
    run(mpirun(2, *hvdtrain("train", *UNSPLIT, "--run-dir", str(run_dir))))
    return torch.load(run_dir / "checkpoint.pt", weights_only=True)["model"]


@pytest.mark.multiproc
def test_hybrid_sync_matches_unsplit_sync(tmp_path, unsplit_model):
    """Horovod must allreduce once per step, after all M micro-batches' backward passes."""
    run(mpirun(2, *hvdtrain("train", *HYBRID[3:], *UNSPLIT, "--schedule", "1f1b",
                            "--run-dir", str(tmp_path / "split"))))
    plain = unsplit_model
    split = torch.load(tmp_path / "split" / "checkpoint.pt", weights_only=True)["model"]
    for name in plain:
        assert (plain[name] - split[name]).abs().max().item() < 1e-5, name


@pytest.mark.skipif(torch.cuda.is_available(), reason="the message is about a host without GPUs")
def test_impossible_stage_devices_exit_2_with_the_arithmetic():
    proc = run(hvdtrain("train", "--stages", "2", "--devices", "cuda", "--epochs", "1"),
               check=False)
    assert proc.returncode == 2
    assert "2 stages need cuda:0, but this host has 0 GPU(s)" in proc.stderr


@pytest.mark.multiproc
def test_stages_without_parameters_train_under_sync_like_the_unsplit_model(tmp_path,
                                                                          unsplit_model):
    """--stages 4 cuts the MLP (Flatten, Linear, ReLU, Linear, ReLU, Linear) into stages of which
    some hold no parameters; Horovod still averages every gradient once per step."""
    run(mpirun(2, *hvdtrain("train", *UNSPLIT, "--stages", "4", "--devices", "cpu,cpu,cpu,cpu",
                            "--micro-batches", "2", "--run-dir", str(tmp_path / "split"))))
    pipe = _records(tmp_path / "split", "epoch")[-1]["pipeline"]
    assert len(pipe["layers"]) == 4 and [0, 1] in pipe["layers"], pipe["layers"]  # Flatten alone
    plain = unsplit_model
    split = torch.load(tmp_path / "split" / "checkpoint.pt", weights_only=True)["model"]
    for name in plain:
        assert (plain[name] - split[name]).abs().max().item() < 1e-5, name
