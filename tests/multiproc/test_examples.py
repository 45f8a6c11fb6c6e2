"""Tier 2: the scripts in examples/ run as a user runs them, at a tiny size: sync under
``horovodrun -np 2 --gloo``, async under ``mpirun -np 3`` (2 workers + 1 server), each launch
with a timeout. They must learn, not just exit 0."""

import math
import sys

import pytest

from hvdtrain.run_output import read_jsonl
from launch import REPO, horovodrun, mpirun, run

pytestmark = pytest.mark.multiproc
EXAMPLES = REPO / "examples"
TIMEOUT = 180  # a tiny run takes well under a minute; this only catches a hang


def launch(mode: str, script: str, *args: str) -> list[str]:
    command = [sys.executable, str(EXAMPLES / script), "--mode", mode, *args]
    return horovodrun(2, *command) if mode == "sync" else mpirun(3, *command)


def epoch_lines(run_dir) -> list[dict]:
    return [r for r in read_jsonl(run_dir / "metrics.jsonl") if r["type"] == "epoch"]


def printed_once(stdout: str, prefix: str) -> str:
    """The one line the script prints from rank 0 (horovodrun puts '[0]<stdout>:' before it)."""
    lines = [line for line in stdout.splitlines() if prefix in line]
    assert len(lines) == 1, f"expected one {prefix!r} line, got {lines}\n{stdout[-3000:]}"
    return lines[0].split(prefix, 1)[1]


@pytest.mark.parametrize("mode, extra", [("sync", ["--data-workers", "1"]), ("async", [])],
                         ids=["sync-data-workers", "async"])
def test_image_folder_resnet_learns_digits_from_png_files(tmp_path, mode, extra):
    data, run_dir = tmp_path / "digits", tmp_path / "run"
    proc = run(launch(mode, "image_folder_resnet.py", "--data-dir", str(data),
                      "--run-dir", str(run_dir), "--epochs", "3",
                      "--max-steps-per-epoch", "12", *extra), timeout=TIMEOUT)
    # Every rank raced to write the folder; one copy won whole, the others left nothing behind.
    assert sorted(p.name for p in data.iterdir()) == [str(d) for d in range(10)]
    assert sum(1 for _ in data.rglob("*.png")) == 1797
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    epochs = epoch_lines(run_dir)
    assert [e["epoch"] for e in epochs] == [1, 2, 3]
    assert epochs[-1]["train_loss"] < 0.8 * epochs[0]["train_loss"], epochs
    # Chance is 0.1; 36 steps of a freshly initialised network get well past it.
    assert epochs[-1]["test_acc"] >= 0.6, epochs[-1]
    assert f"test_acc={epochs[-1]['test_acc']:.4f}" in printed_once(proc.stdout, "final:")


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_char_lm_loss_drops_and_its_own_metric_is_logged(tmp_path, mode):
    run_dir = tmp_path / "run"
    proc = run(launch(mode, "char_lm.py", "--run-dir", str(run_dir), "--epochs", "3",
                      "--max-steps-per-epoch", "10"), timeout=TIMEOUT)
    epochs = epoch_lines(run_dir)
    assert [e["epoch"] for e in epochs] == [1, 2, 3]
    first, last = epochs[0], epochs[-1]
    # The first epoch's mean starts near ln(vocabulary) ~ 3.8 nats; three epochs cut it clearly.
    assert last["train_loss"] < first["train_loss"] - 0.4, epochs
    assert last["test_loss"] < first["test_loss"], epochs
    for key in ("train_char_acc", "test_char_acc"):
        assert all(0.0 <= e[key] <= 1.0 for e in epochs), (key, epochs)
    assert "train_acc" not in last  # the built-in accuracy does not apply to (N, T, V) logits
    assert last["train_char_acc"] > first["train_char_acc"] and last["test_char_acc"] > 0.15
    final = printed_once(proc.stdout, "final:")
    assert f"perplexity={math.exp(last['test_loss']):.2f}" in final
    assert printed_once(proc.stdout, "sample:").strip().startswith("'It was the ")
