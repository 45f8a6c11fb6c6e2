"""FLOPs per sample and the epoch lines' tflops and mfu (loop/flops.py)."""

from __future__ import annotations

import pytest
import torch

from hvdtrain.config import Config, ConfigError
from hvdtrain.loop import flops
from hvdtrain.run_output import read_jsonl
from test_trainer import make_trainer


def test_an_mlp_counts_two_flops_per_multiply_add_forward_and_twice_that_backward():
    sizes = [12, 32, 16, 3]
    model = torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    batch = 5
    x, y = torch.randn(batch, 12), torch.randint(0, 3, (batch,))
    products = [a * b for a, b in zip(sizes, sizes[1:])]
    forward = 2 * sum(products)
    # backward: the weight gradients of every layer, the input gradients of all but the first
    # (the data needs none): 2 x forward, less the first layer's input gradient
    backward = 2 * forward - 2 * products[0]
    assert flops.count_flops(model, torch.nn.functional.cross_entropy, x, y) == \
        batch * (forward + backward)
    assert all(p.grad is not None for p in model.parameters())


def test_the_count_leaves_the_runs_gradients_alone(tmp_path):
    trainer = make_trainer(tmp_path)  # Linear(12, 16), ReLU, Linear(16, 2)
    per_sample, why = flops.flops_per_sample(trainer.replica, trainer.workload.train.sample())
    assert per_sample == 6 * (12 * 16 + 16 * 2) - 2 * 12 * 16 and why == ""
    assert all(p.grad is None for p in trainer.replica.model.parameters())


@pytest.mark.parametrize("name, precision, peak", [
    ("NVIDIA H100 80GB HBM3", "bf16", 989.0), ("NVIDIA H100 PCIe", "bf16", 756.0),
    ("NVIDIA H200", "32", 67.0), ("NVIDIA A100-SXM4-80GB", "fp16", 312.0),
    ("NVIDIA A10G", "32", 31.2), ("NVIDIA L40S", "bf16", 362.0), ("NVIDIA L4", "bf16", 121.0),
    ("Tesla V100-SXM2-16GB", "bf16", None), ("Tesla V100-SXM2-16GB", "fp16", 125.0),
    ("Some Future GPU", "bf16", None)])
def test_the_peak_table_is_matched_by_device_name(name, precision, peak):
    assert flops.peak_for(name, precision) == peak


def test_a_cpu_has_no_peak_unless_given():
    cpu = torch.device("cpu")
    assert flops.device_peak(0.0, cpu, "32") is None
    assert flops.device_peak(2.5, cpu, "32") == 2.5


def test_mfu_is_the_achieved_rate_over_the_peak_of_every_device():
    header = {"flops_per_sample": 3e9, "peak_tflops": 10.0, "devices": 2}
    assert flops.epoch_throughput(header, 2000.0) == {"tflops": 6.0, "mfu": 0.3}
    assert flops.epoch_throughput({**header, "peak_tflops": None}, 2000.0) == {"tflops": 6.0}
    assert flops.epoch_throughput({**header, "flops_per_sample": None}, 2000.0) == {}


def test_every_epoch_line_has_tflops_and_with_a_peak_mfu(tmp_path, capsys):
    make_trainer(tmp_path, epochs=3, peak_tflops=0.001).fit()
    lines = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if r["type"] == "epoch"]
    header = read_jsonl(tmp_path / "metrics.jsonl")[0]
    assert header["flops_per_sample"] > 0 and header["peak_tflops"] == 0.001
    assert len(lines) == 3
    for line in lines:
        expected = header["flops_per_sample"] * line["samples_per_sec"] / 1e12
        assert line["tflops"] == pytest.approx(expected, rel=1e-3)
        assert line["mfu"] == pytest.approx(line["tflops"] / 0.001, rel=1e-3)
    assert "TFLOP/s" in capsys.readouterr().out


def test_a_model_the_counter_cannot_count_trains_without_tflops(tmp_path, monkeypatch, capsys):
    def refuse(*args):
        raise RuntimeError("no formula for aten::mystery")

    monkeypatch.setattr(flops, "count_flops", refuse)
    trainer = make_trainer(tmp_path, epochs=2)
    trainer.fit()
    out = capsys.readouterr().out
    assert out.count("FLOPs per sample unknown (RuntimeError: no formula for aten::mystery)") == 1
    lines = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if r["type"] == "epoch"]
    assert len(lines) == 2 and all("tflops" not in r and "mfu" not in r for r in lines)
    assert trainer.history[-1].throughput == {}


def test_a_negative_peak_is_refused():
    with pytest.raises(ConfigError, match="--peak-tflops: invalid value -1"):
        Config.from_overrides({"peak_tflops": -1.0}).validate()


def test_the_count_leaves_the_random_stream_alone(tmp_path):
    trainer = make_trainer(tmp_path)
    trainer.replica.model = torch.nn.Sequential(torch.nn.Dropout(0.5), *trainer.replica.model)
    torch.manual_seed(3)
    expected = torch.rand(4)
    torch.manual_seed(3)
    assert flops.flops_per_sample(trainer.replica, trainer.workload.train.sample())[0] > 0
    assert torch.equal(torch.rand(4), expected)


def test_stages_that_share_a_device_count_it_once_in_the_peak():
    """--stages 2 on one CPU (cpu,cpu) counted two devices and halved the MFU."""
    from types import SimpleNamespace

    from hvdtrain.pipeline import PipelineReplica
    from hvdtrain.config import PipelineConfig

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    replica = PipelineReplica(model, ["cpu", "cpu"], PipelineConfig(stages=2))
    cfg = Config.from_overrides({"peak_tflops": 1.0}).validate()
    sample = SimpleNamespace(train=SimpleNamespace(sample=lambda: (torch.randn(2, 4), None)))
    header = flops.throughput_header(cfg, sample, replica, 3, announce=False)
    assert header["devices"] == 3  # 3 workers of one CPU each
