"""--stop-at under real launches: sync with 2 ranks, async with 2 workers and a server (fully
asynchronous and --bsp). The evaluation that reaches the target stops every worker within a
step or two, with a checkpoint, a stop line stamped like the eval lines, and exit code 0; a run
that never reaches it trains all its epochs (checked, sync and async, on
test_eval_steps.py's step-evaluation runs, which set such a target: one launch for both)."""

import pytest

from hvdtrain import checkpoint
from hvdtrain.run_output import read_jsonl
from launch import hvdtrain, mpirun, records, run

pytestmark = pytest.mark.multiproc
QUIET = ["--no-progress", "--eval-every-steps", "4"]
MODES = {"sync": (2, []), "async": (3, ["--mode", "async"]),
         "bsp": (3, ["--mode", "async", "--bsp"])}
TARGET = 0.9


def first_evaluation_reaching(run_dir, value):
    """The first eval or epoch line whose test accuracy reaches ``value``, in the log's order."""
    return next(r for r in read_jsonl(run_dir / "metrics.jsonl")
                if r["type"] in ("eval", "epoch") and r["test_acc"] >= value)


@pytest.mark.parametrize("mode", MODES)
def test_the_evaluation_that_reaches_the_target_stops_every_worker(tmp_path, mode):
    np, flags = MODES[mode]
    proc = run(mpirun(np, *hvdtrain("train", *QUIET, *flags, "--epochs", "20", "--stop-at",
                                    f"test_acc>={TARGET}", "--run-dir", str(tmp_path))))
    assert "Traceback" not in proc.stderr
    [stop] = records(tmp_path, "stop")
    reached = first_evaluation_reaching(tmp_path, TARGET)
    assert stop["reason"] == (f"reached the target: test_acc {reached['test_acc']:.6g} >= "
                              f"{TARGET:g} at step {reached['step']}")
    assert stop["target"] == f"test_acc>={TARGET}"
    # The stop agreement takes a step or two: the next push, or the vote read one step later.
    # Async steps are the job's (ps/dispatch.py): the other worker's batches meanwhile count.
    assert 0 <= stop["step"] - reached["step"] <= (3 if mode == "sync" else 8), (stop, reached)
    # (an epoch line rounds its train_seconds to 1 ms, the stop line to 0.1 ms)
    assert reached["train_seconds"] - 1e-3 <= stop["train_seconds"] < reached["train_seconds"] + 2
    assert stop["train_seconds"] <= stop["wall_seconds"]
    steps_per_epoch = records(tmp_path, "header")[0]["steps_per_epoch"]
    assert stop["step"] < 10 * steps_per_epoch  # of 20 epochs; digits gets there in about 3
    assert stop["epoch"] == (stop["step"] - 1) // steps_per_epoch + 1
    assert f"hvdtrain: reached the target test_acc>={TARGET}" in proc.stdout
    assert "done: reached the target (test_acc" in proc.stdout  # not the last epoch line's
    saved = checkpoint.load(tmp_path)  # the weights the run stopped with
    assert saved["global_step"] == stop["step"]
    assert all(t.isfinite().all() for t in saved["model"].values())
    if mode != "sync":
        assert records(tmp_path, "scheme")  # the servers shut down and reported


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_an_epoch_evaluation_that_reaches_the_target_stops_before_another_epoch(tmp_path, mode):
    np, flags = MODES[mode]
    run(mpirun(np, *hvdtrain("train", "--no-progress", *flags, "--epochs", "20", "--stop-at",
                             "test_acc>=0.85", "--run-dir", str(tmp_path))))
    [stop] = records(tmp_path, "stop")
    reached = first_evaluation_reaching(tmp_path, 0.85)
    assert reached["type"] == "epoch" and f"at step {reached['step']}" in stop["reason"]
    assert records(tmp_path, "epoch")[-1] == reached  # no epoch after it
    # sync: every rank judged it and stops at once; async: worker 0 alone judged it, and the
    # first steps of the next epoch carry the stop to the others. Async steps are the job's
    # (ps/dispatch.py): the batches the other worker trained while worker 0 evaluated count.
    steps_after = [0] if mode == "sync" else range(1, 9)
    assert stop["step"] - reached["step"] in steps_after, (stop, reached)
    assert checkpoint.load(tmp_path)["global_step"] == stop["step"]
