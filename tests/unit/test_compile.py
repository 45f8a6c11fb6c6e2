"""Tier 1 for --compile (compile.py, pipeline.compile_replica): a compiled replica computes what
the plain one does, its checkpoints keep their keys, and a compiler failure is told apart from a
bug in the model. torch.compile takes seconds per graph on a CPU, so one compiled replica and one
compiled pipeline, built once for this module, serve several tests; the models are tiny."""

from pathlib import Path

import pytest
import torch
import torch._inductor.config as inductor_config
import torch.nn as nn
from torch._dynamo.utils import counters

from hvdtrain import compile as compiling
from hvdtrain.config import Config, ConfigError, ModelConfig
from hvdtrain.layout import Layout
from hvdtrain.models import build_model
from hvdtrain.pipeline import PipelineReplica, build_replica, compile_replica
from hvdtrain.replica import Objective, Replica
from hvdtrain.runtime import Runtime

CPU = torch.device("cpu")
SHAPE, CLASSES = (12,), 5


def _replica(compiled: bool, **options) -> Replica:
    # threads=1: build_replica would otherwise share this process's cores among pipeline stages,
    # for every test that runs after this one.
    cfg = Config.from_overrides({"compile": compiled, "hidden": "16,8", "threads": 1,
                                 **options}).validate()
    torch.manual_seed(0)
    model = build_model("mlp", SHAPE, CLASSES, cfg.model)
    layout = Layout.build(cfg, 1, 0, 1, gpu_count=0)
    return build_replica(model, cfg, Runtime(0, 1, 0, 1, CPU, "none"), layout,
                         Objective.classification())


def _batch(n: int = 16):
    generator = torch.Generator().manual_seed(1)
    return torch.randn(n, *SHAPE, generator=generator), torch.randint(0, CLASSES, (n,),
                                                                       generator=generator)


def _run_both(**options):
    """A plain and a compiled replica of the same weights, after one forward_backward each."""
    x, y = _batch()
    graphs_before = counters["stats"]["unique_graphs"]
    plain, compiled = _replica(False, **options), _replica(True, **options)
    a = plain.forward_backward(x, y, grad_scale=0.5)
    b = compiled.forward_backward(x, y, grad_scale=0.5)
    return plain, compiled, a, b, counters["stats"]["unique_graphs"] - graphs_before


@pytest.fixture(scope="module")
def single():
    return _run_both()


@pytest.fixture(scope="module")
def pipeline():
    return _run_both(stages=2, devices="cpu,cpu", micro_batches=2)


def _assert_same_step(plain, compiled, a, b):
    assert abs(a.loss_sum.item() - b.loss_sum.item()) < 1e-5 * a.count
    assert a.count == b.count and a.metrics["acc"][0].item() == b.metrics["acc"][0].item()
    for (name, p), q in zip(plain.model.named_parameters(), compiled.model.parameters()):
        assert p.grad is not None and q.grad is not None, name
        assert (p.grad - q.grad).abs().max().item() < 1e-5, name


def test_a_compiled_replica_matches_the_plain_one(single):
    plain, compiled, a, b, graphs = single
    assert isinstance(compiled.run_model, compiling.CompiledModule)
    assert plain.run_model is plain.model
    assert graphs >= 1, "torch.compile never compiled a graph: the forward ran uncompiled"
    _assert_same_step(plain, compiled, a, b)


def test_checkpoint_keys_do_not_change_with_compile(single):
    plain, compiled, *_ = single
    assert type(compiled.model) is type(plain.model)  # the plain module, not dynamo's wrapper
    assert list(compiled.model.state_dict()) == list(plain.model.state_dict())
    assert not any("_orig_mod" in key for key in compiled.model.state_dict())
    # Weights trained through the compiled call load into a model built without --compile.
    fresh = _replica(False)
    fresh.model.load_state_dict(compiled.model.state_dict())


def test_every_pipeline_stage_is_compiled_and_matches_the_plain_pipeline(pipeline):
    plain, compiled, a, b, graphs = pipeline
    assert isinstance(compiled, PipelineReplica) and len(compiled.run_stages) == 2
    for k, (stage, run) in enumerate(zip(compiled.stages, compiled.run_stages)):
        assert isinstance(run, compiling.CompiledModule) and run.module is stage
        assert run.name == f"pipeline stage {k + 1}"
        assert isinstance(stage, nn.Sequential)
    assert graphs >= 2, f"{graphs} graph(s) compiled for 2 stages"
    _assert_same_step(plain, compiled, a, b)
    assert list(compiled.model.state_dict()) == list(plain.model.state_dict())


# --- failures -----------------------------------------------------------------------------------
def _exploding_compile(module, *args, **kwargs):
    def call(*a, **k):
        raise RuntimeError("backend exploded\nsecond line of a long report")
    return call


def test_a_compiler_failure_names_the_flag_and_the_module(monkeypatch):
    monkeypatch.setattr(compiling.torch, "compile", _exploding_compile)
    torch.manual_seed(0)
    replica = compile_replica(Replica(build_model("mlp", SHAPE, CLASSES, ModelConfig(hidden=(8,))),
                                      CPU))
    x, y = _batch(4)
    with pytest.raises(ConfigError) as caught:
        replica.forward_backward(x, y, 1.0)
    message = str(caught.value)
    assert message.startswith("--compile: ") and "drop --compile" in message
    assert "could not compile Sequential (RuntimeError: backend exploded)" in message
    assert "second line" not in message  # one line of the compiler's report, not all of it
    assert isinstance(caught.value.__cause__, RuntimeError)  # the full report stays reachable


class WrongWidth(nn.Module):
    """Fails with or without compiling: its own bug."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 3)

    def forward(self, x):
        return self.linear(x.view(len(x), 5))


def test_a_model_that_fails_uncompiled_raises_its_own_error():
    model = WrongWidth()
    with pytest.raises(RuntimeError) as caught:
        compiling.compile_module(model, "WrongWidth")(torch.randn(2, 4))
    # The error eager PyTorch raises, pointing at the model's line, not dynamo's fake-tensor
    # report of it (a TorchRuntimeError) and not a ConfigError that blames --compile.
    assert type(caught.value) is RuntimeError, type(caught.value)
    assert "shape '[2, 5]' is invalid for input of size 8" in str(caught.value)
    assert caught.traceback[-1].name == "forward"
    assert Path(caught.traceback[-1].path) == Path(__file__)


def test_a_model_bug_is_not_blamed_on_compile_when_the_compiler_fails_too(monkeypatch):
    monkeypatch.setattr(compiling.torch, "compile", _exploding_compile)

    class Raises(nn.Module):
        def forward(self, x):
            raise ValueError("model bug")

    with pytest.raises(ValueError, match="model bug"):
        compiling.compile_module(Raises(), "Raises")(torch.randn(2, 4))


def test_a_failure_compiling_the_backward_graph_gets_the_same_message(monkeypatch, tmp_path):
    # A Linear's forward is one library call, with no generated C++; its backward sums the bias
    # gradient in a generated kernel. With no C++ compiler, only the backward graph fails, which
    # AOTAutograd would compile at the first backward pass, outside the wrapper.
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))  # no cached kernel to reuse
    torch.manual_seed(0)
    model = nn.Linear(7, 3)
    with inductor_config.patch({"cpp.cxx": (None, str(tmp_path / "no-such-g++"))}), \
            pytest.raises(ConfigError, match=r"--compile: torch.compile could not compile Linear "
                                             r"\(\w+Error: InvalidCxxCompiler"):
        out = compiling.compile_module(model, "Linear")(torch.randn(5, 7))
        out.sum().backward()  # reached only if the forward call did not compile the backward
    assert all(p.grad is None for p in model.parameters()), "a backward pass ran"
