"""Tier 1: the model registry, checkpoint files, and the learning-rate schedule."""

import pytest
import torch

from hvdtrain import checkpoint
from hvdtrain.config import ConfigError, ModelConfig, OptimConfig
from hvdtrain.models import MODELS, build_model, count_parameters
from hvdtrain.optim import learning_rate


@pytest.mark.parametrize("name, shape", [("mlp", (1, 8, 8)), ("mlp", (64,)), ("cnn", (1, 8, 8)),
                                         ("cnn", (3, 28, 28))])
def test_models_infer_sizes_from_the_data(name, shape):
    model = build_model(name, shape, 7, ModelConfig())
    assert isinstance(model, torch.nn.Sequential)
    assert model(torch.zeros(5, *shape)).shape == (5, 7)


def test_registry_and_errors():
    assert {"mlp", "cnn"} <= set(MODELS)
    with pytest.raises(ConfigError, match="unknown model 'resnet'"):
        build_model("resnet", (64,), 10, ModelConfig())
    with pytest.raises(ConfigError, match="needs image samples"):
        build_model("cnn", (64,), 10, ModelConfig())
    # The benchmark's model: an MLP of about 2M parameters.
    big = build_model("mlp", (1024,), 10, ModelConfig(hidden=(1024, 1024)))
    assert 2_000_000 < count_parameters(big) < 2_200_000


def test_checkpoint_round_trip(tmp_path):
    model = build_model("mlp", (64,), 10, ModelConfig())
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(4, 64)).sum().backward()
    opt.step()
    path = checkpoint.save_atomic({"model": model.state_dict(), "optimizer": opt.state_dict(),
                                   "identity": {"model": "mlp"}, "epoch": 3},
                                  tmp_path / checkpoint.CHECKPOINT_NAME)
    state = checkpoint.load(tmp_path)  # a run folder works as well as a file
    assert state["epoch"] == 3
    for key, value in model.state_dict().items():
        assert torch.equal(state["model"][key], value)
    restored = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    restored.load_state_dict(state["optimizer"])
    assert torch.equal(restored.state_dict()["state"][0]["momentum_buffer"],
                       opt.state_dict()["state"][0]["momentum_buffer"])
    assert path == tmp_path / checkpoint.CHECKPOINT_NAME
    assert [p.name for p in tmp_path.iterdir()] == [checkpoint.CHECKPOINT_NAME]  # no temp files


def test_on_cpu_leaves_cpu_state_as_it_is_and_keeps_module_versions():
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3))
    state = model.state_dict()
    moved = checkpoint.on_cpu({"model": state, "epochs": [1, (2, "x")], "n": 3})
    assert all(moved["model"][k] is v for k, v in state.items())  # no copies of CPU tensors
    assert moved["model"]._metadata == state._metadata  # BatchNorm's version survives
    assert moved["epochs"] == [1, (2, "x")] and moved["n"] == 3


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_gpu_state_is_saved_with_cpu_tensors(tmp_path):
    """A plain torch.load (no map_location) reads a checkpoint written from a GPU model on any
    machine; tied weights stay one tensor."""
    model = torch.nn.Linear(4, 4).cuda()
    state = {"model": model.state_dict(), "tied": [model.weight, model.weight]}
    checkpoint.save_atomic(state, tmp_path / "c.pt")
    loaded = torch.load(tmp_path / "c.pt", weights_only=True)
    assert loaded["model"]["weight"].device.type == "cpu"
    assert torch.equal(loaded["model"]["weight"], model.weight.detach().cpu())
    assert loaded["tied"][0] is loaded["tied"][1]


def test_failed_write_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / checkpoint.CHECKPOINT_NAME
    checkpoint.save_atomic({"epoch": 1}, path)

    def full_disk(obj, f):
        f.write(b"partial bytes")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(checkpoint.CheckpointWriteError, match="No space left"):
        checkpoint.save_atomic({"epoch": 2}, path)
    monkeypatch.undo()
    assert checkpoint.load(path)["epoch"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [checkpoint.CHECKPOINT_NAME]


def test_bad_checkpoints_are_reported(tmp_path):
    with pytest.raises(checkpoint.CheckpointError, match="no checkpoint at"):
        checkpoint.load(tmp_path / "missing.pt")
    path = checkpoint.save_atomic({"model": {"w": torch.ones(1000)}}, tmp_path / "c.pt")
    path.write_bytes(path.read_bytes()[:300])
    with pytest.raises(checkpoint.CheckpointError, match="not a readable checkpoint") as e:
        checkpoint.load(path)
    # --auto-resume finds the file again in its folder: the way out is to move it, said so
    assert f"move this file aside (mv {path} {path}.unreadable)" in str(e.value)
    log = tmp_path / "metrics.jsonl"  # another file of the run: named, not to be moved aside
    log.write_text('{"type": "header"}\n')
    with pytest.raises(checkpoint.CheckpointError, match=r"is not a checkpoint but a \.jsonl "
                       r"file; pass its run folder .* or the checkpoint\.pt in it"):
        checkpoint.load(log)
    torch.save({"weights": torch.ones(2)}, tmp_path / "other.pt")
    with pytest.raises(checkpoint.CheckpointError, match="not an hvdtrain checkpoint of this "
                       r"version \(format none, expected 1\); it was not written by hvdtrain"):
        checkpoint.load(tmp_path / "other.pt")
    torch.save({"format_version": checkpoint.FORMAT_VERSION + 1}, tmp_path / "newer.pt")
    with pytest.raises(checkpoint.CheckpointError, match="a newer hvdtrain wrote it"):
        checkpoint.load(tmp_path / "newer.pt")
    state = {"identity": {"model": "cnn", "num_classes": 10}}
    with pytest.raises(checkpoint.CheckpointError, match="model: checkpoint has 'cnn', this run has 'mlp'"):
        checkpoint.check_compatible(state, {"model": "mlp", "num_classes": 10}, path)


def test_learning_rate_warmup_scaling_and_cosine():
    cfg = OptimConfig(lr=0.1, warmup_epochs=2, lr_scaling="linear")
    lr = lambda step, c=cfg: learning_rate(step, total_steps=100, steps_per_epoch=10, cfg=c,
                                           lr_scale=4)
    assert lr(0) == pytest.approx(0.1)  # warmup starts at one worker's rate
    assert lr(10) == pytest.approx(0.25)  # halfway to 0.4
    assert lr(20) == pytest.approx(0.4) and lr(99) == pytest.approx(0.4)
    cosine = OptimConfig(lr=0.1, warmup_epochs=0, lr_schedule="cosine")
    assert lr(0, cosine) == pytest.approx(0.4)
    assert lr(50, cosine) == pytest.approx(0.2)
    assert lr(100, cosine) == pytest.approx(0.0, abs=1e-12)
    unscaled = OptimConfig(lr=0.1, warmup_epochs=1, lr_scaling="none")
    assert lr(0, unscaled) == pytest.approx(0.1) and lr(50, unscaled) == pytest.approx(0.1)


def test_a_checkpoint_of_another_model_names_the_first_tensor_that_differs():
    import torch.nn as nn

    saved = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 3)).state_dict()
    checkpoint.check_model_state(saved, nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 3))
                                 .state_dict(), "ckpt")  # the same model passes
    with pytest.raises(checkpoint.CheckpointError, match=r"1.weight: checkpoint has shape "
                       r"\(3, 8\), this run's model \(5, 8\)"):
        checkpoint.check_model_state(saved, nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 5))
                                     .state_dict(), "ckpt")
    renamed = {"body." + k: v for k, v in saved.items()}
    with pytest.raises(checkpoint.CheckpointError, match="this run's model has 'body.0.weight', "
                       "which the checkpoint lacks"):
        checkpoint.check_model_state(saved, renamed, "ckpt")


def test_diloco_s_gain_divides_the_rate_whatever_the_scaling():
    """--lr-scaling none dropped the gain with the workers' N: DiLoCo's inner rate ran at 7
    times the one meant (0.05 where linear gave 0.1 / 7)."""
    from hvdtrain.optim import LrScale

    cfg = OptimConfig(lr=0.05, warmup_epochs=0)
    scale = LrScale(2, 7.0)
    assert learning_rate(5, 100, 10, cfg, scale) == pytest.approx(0.1 / 7)
    cfg.lr_scaling = "none"
    assert learning_rate(5, 100, 10, cfg, scale) == pytest.approx(0.05 / 7)
    assert learning_rate(5, 100, 10, cfg, 2.0) == pytest.approx(0.05)  # plain sync: no gain
