"""--tensorboard in async mode: worker 0 alone writes the event files, and they end with the
parameter server's staleness histogram."""

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from hvdtrain.run_output import read_jsonl
from launch import hvdtrain, mpirun, run

pytestmark = pytest.mark.multiproc


def test_async_run_writes_the_staleness_histogram_and_the_epochs(tmp_path):
    run(mpirun(3, *hvdtrain("train", "--mode", "async", "--tensorboard", "--epochs", "2",
                            "--no-progress", "--seed", "1", "--run-dir", str(tmp_path))))
    assert len(list(tmp_path.glob("events.out.tfevents.*"))) == 1  # only worker 0 writes
    log = read_jsonl(tmp_path / "metrics.jsonl")
    epochs = [r for r in log if r["type"] == "epoch"]
    [scheme] = [r for r in log if r["type"] == "scheme"]
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    test_acc = {e.step: e.value for e in acc.Scalars("test/acc")}
    assert test_acc == {r["step"]: pytest.approx(r["test_acc"], rel=1e-6) for r in epochs}
    [event] = acc.Histograms("scheme/staleness_histogram")
    histogram = event.histogram_value
    counts = {int(k): v for k, v in scheme["staleness_histogram"].items()}
    assert event.step == epochs[-1]["step"]
    assert histogram.num == sum(counts.values()) == scheme["pushes_applied"]
    assert (histogram.min, histogram.max) == (min(counts), max(counts))
    assert [c for c in histogram.bucket if c] == [counts[k] for k in sorted(counts)]
