"""Tier 3 for --compile: mpirun jobs that train with torch.compile, against the same jobs without
it, and the command's one-line error when the compiler fails (the wrapper itself is unit-tested
in tests/unit/test_compile.py)."""

import pytest
import torch

from hvdtrain.run_output import read_jsonl
from launch import hvdtrain, mpirun, run

pytestmark = pytest.mark.multiproc
FLAGS = ["--epochs", "2", "--no-progress", "--log-steps", "--seed", "3"]
COMPILING = 480  # seconds: two ranks compile at once on a small shared machine


def _records(run_dir, kind):
    return [r for r in read_jsonl(run_dir / "metrics.jsonl") if r["type"] == kind]


def test_compiled_sync_training_matches_eager_and_resumes_without_compile(tmp_path):
    eager, compiled = tmp_path / "eager", tmp_path / "compiled"
    run(mpirun(2, *hvdtrain("train", *FLAGS, "--run-dir", str(eager))))
    proc = run(mpirun(2, *hvdtrain("train", *FLAGS, "--compile", "--run-dir", str(compiled))),
               timeout=COMPILING)
    assert "done: test accuracy" in proc.stdout
    a, b = _records(eager, "step"), _records(compiled, "step")
    first = [(x["loss"], y["loss"]) for x, y in zip(a, b) if x["epoch"] == 1]
    assert len(a) == len(b) and len(first) > 10
    # Inductor may order a sum differently from eager: rounding, measured 1.2e-7 here.
    worst = max(abs(x - y) for x, y in first)
    assert worst < 1e-4, f"first-epoch step losses differ by up to {worst}"
    end_a, end_b = _records(eager, "epoch")[-1], _records(compiled, "epoch")[-1]
    assert abs(end_a["test_acc"] - end_b["test_acc"]) <= 0.01, (end_a, end_b)

    plain = torch.load(eager / "checkpoint.pt", weights_only=True)["model"]
    state = torch.load(compiled / "checkpoint.pt", weights_only=True)["model"]
    assert list(state) == list(plain)  # no torch.compile prefix (_orig_mod.) in the keys
    # The compiled run's checkpoint continues in a run without --compile.
    proc = run(mpirun(2, *hvdtrain("train", *FLAGS[2:], "--epochs", "3",
                                   "--resume", str(compiled))))
    assert "done: test accuracy" in proc.stdout
    assert [r["resumed_from_epoch"] for r in _records(compiled, "header")] == [0, 2]
    epochs = _records(compiled, "epoch")
    assert [r["epoch"] for r in epochs] == [1, 2, 3]
    assert epochs[2]["train_loss"] < epochs[1]["train_loss"]


def test_a_compiler_failure_exits_2_with_one_line_naming_the_flag(tmp_path):
    # A real compiler failure: Inductor builds its CPU kernels with the C++ compiler that CXX
    # names (read when torch._inductor.config is imported). An empty cache folder, so that no
    # kernel compiled by an earlier run is reused.
    env = {"CXX": str(tmp_path / "no-such-g++"),
           "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    proc = run(mpirun(2, *hvdtrain("train", *FLAGS, "--compile",
                                   "--run-dir", str(tmp_path / "run"))),
               check=False, env=env, timeout=COMPILING)
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("hvdtrain: error:")]
    assert len(errors) == 1, proc.stderr[-3000:]  # rank 0 alone reports it
    assert errors[0].startswith("hvdtrain: error: --compile: torch.compile could not compile "
                                "Sequential (InductorError: InvalidCxxCompiler"), errors[0]
    assert errors[0].endswith("drop --compile")
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
