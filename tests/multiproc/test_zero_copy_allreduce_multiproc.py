"""hvdtrain's Horovod build reduces a fused CPU allreduce in the tensors' own memory when they
lie back to back as the fusion buffer would hold them
(scripts/setup/horovod-0.28.1-zero-copy-allreduce.patch), and sync training keeps its gradients
that way (hvdtrain/sync/flat_gradients.py). Horovod's timeline, written by rank 0, shows which
collectives copied into the fusion buffer."""

import json
import re
import sys
from pathlib import Path

import pytest

from launch import REPO, horovodrun, hvdtrain, mpirun, run

pytestmark = pytest.mark.multiproc
SCRIPT = REPO / "tests" / "helpers" / "zero_copy_allreduce.py"


def copied_into_fusion_buffer(timeline: Path) -> tuple[set[str], set[str]]:
    """The names of the tensors in the timeline, and those of the ones copied into the fusion
    buffer. (The file is a JSON array that Horovod may leave unclosed, so it is read by
    pattern.)"""
    text = timeline.read_text()
    names = {int(pid): name for pid, name in
             re.findall(r'"pid": (\d+), "args": \{"name": "([^"]+)"', text)}
    copied = {names[int(pid)] for pid in re.findall(
        r'"name": "MEMCPY_IN_FUSION_BUFFER", "ts": \d+, "pid": (\d+)', text)}
    return set(names.values()), copied


@pytest.mark.parametrize("launch", [horovodrun, mpirun], ids=["horovodrun-gloo", "mpirun"])
def test_views_of_one_buffer_are_reduced_where_they_are(tmp_path, launch):
    timeline = tmp_path / "timeline.json"
    proc = run(launch(2, sys.executable, str(SCRIPT)), env={"HOROVOD_TIMELINE": str(timeline)})
    line = next(line for line in proc.stdout.splitlines() if "RESULT " in line)
    # Every group averaged (or summed) right on every rank, including the one where rank 0 used
    # its buffer and rank 1 the fusion buffer: both hold the elements in the same order.
    assert json.loads(line.split("RESULT ", 1)[1]) == {
        "flat": True, "flat_sum": True, "separate": True, "mixed": True}
    names, copied = copied_into_fusion_buffer(timeline)
    def members(group: str) -> set[str]:
        tensors = {f"grouped_allreduce.{group}_{k}of4" for k in range(1, 5)}
        assert tensors <= names, sorted(names)
        return tensors

    assert members("separate") <= copied  # the check can see a copy
    for group in ("flat", "flat_sum", "mixed"):  # rank 0 had views in these three
        assert not members(group) & copied, (group, sorted(copied))


def test_sync_training_allreduces_its_gradients_without_copies(tmp_path):
    timeline = tmp_path / "timeline.json"
    run(horovodrun(2, *hvdtrain(
        "train", "--dataset", "synthetic", "--synthetic-shape", "64", "--synthetic-classes", "4",
        "--hidden", "32,32", "--epochs", "1", "--max-steps-per-epoch", "6", "--no-progress",
        "--checkpoint-every", "0", "--run-dir", str(tmp_path / "run"))),
        env={"HOROVOD_TIMELINE": str(timeline)})
    names, copied = copied_into_fusion_buffer(timeline)
    gradients = {n for n in names if n.startswith("grouped_allreduce.")}
    assert len(gradients) == 6, sorted(names)  # 3 layers, a weight and a bias each: one group
    assert not gradients & copied, sorted(copied)
