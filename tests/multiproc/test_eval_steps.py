"""--eval-every-steps: evaluations inside the epochs, stamped with the wall time and with the
training time (evaluations excluded), in sync and async mode.

That a plain run logs no step evaluation is checked on test_step_times_multiproc.py's run
without a straggler (a default-evaluation sync job), which spares a launch of its own here."""

import pytest

from hvdtrain import checkpoint
from hvdtrain.run_output import read_jsonl
from launch import hvdtrain, mpirun, records, run

pytestmark = pytest.mark.multiproc

QUIET = ["--no-progress", "--checkpoint-every", "0", "--epochs", "2"]


@pytest.mark.parametrize("mode,processes", [("sync", 2), ("async", 3)])
def test_step_evaluations_are_logged_in_order_and_a_target_never_reached_stops_nothing(
        tmp_path, mode, processes):
    # --stop-at with a target no evaluation reaches: the same job is
    # test_stop_at_target_multiproc.py's run that must train all its epochs without a stop,
    # so that check shares this launch instead of starting its own.
    proc = run(mpirun(processes, *hvdtrain("train", "--mode", mode, "--eval-every-steps", "5",
                                           *QUIET, "--stop-at", "test_acc>=0.9999",
                                           "--run-dir", str(tmp_path))))
    assert [r["epoch"] for r in records(tmp_path, "epoch")] == [1, 2]
    assert records(tmp_path, "stop") == [] and "reached the target" not in proc.stdout
    assert checkpoint.load(tmp_path)["epoch"] == 2  # --checkpoint-every 0: the one at the end
    evals, epochs = records(tmp_path, "eval"), records(tmp_path, "epoch")
    steps_per_epoch = epochs[0]["step"]
    assert steps_per_epoch == 22  # digits: 1437 training samples, 2 workers of batch 32
    # Every 5th global step, except where an epoch's own evaluation follows (none here). Async
    # steps are the job's (ps/dispatch.py): worker 0 evaluates at the first step it trains at
    # or past each multiple, which the other worker's batches may have taken.
    due = list(range(5, 2 * steps_per_epoch, 5))
    steps = [e["step"] for e in evals]
    if mode == "sync":
        assert steps == due
    else:
        assert len(steps) == len(due) and all(d <= s < d + 5 for d, s in zip(due, steps)), steps
    assert [e["epoch"] for e in evals] == [1 if s <= steps_per_epoch else 2 for s in steps]
    # The log is in order: an epoch's line comes after its step evaluations.
    kinds = [r["type"] for r in read_jsonl(tmp_path / "metrics.jsonl")
             if r["type"] in ("eval", "epoch")]
    assert kinds == ["eval"] * 4 + ["epoch"] + ["eval"] * 4 + ["epoch"]
    stamps = [(r["wall_seconds"], r["train_seconds"]) for r in evals + [epochs[-1]]]
    assert all(0 < t <= w for w, t in stamps), stamps
    assert [w for w, _ in stamps] == sorted(w for w, _ in stamps)
    # Each evaluation's duration is kept out of the training time: the gap only grows.
    gaps = [w - t for w, t in stamps]
    assert gaps[0] == pytest.approx(0, abs=1e-3) and gaps[-1] > gaps[0], gaps
    assert all(b >= a - 2e-3 for a, b in zip(gaps, gaps[1:])), gaps  # rounded to 1 ms
    assert all(0 <= e["test_acc"] <= 1 and e["test_loss"] > 0 for e in evals)
    assert evals[-1]["test_acc"] > evals[0]["test_acc"]  # it is training that is evaluated


def test_waiting_for_a_straggler_at_an_evaluation_is_training_time(tmp_path):
    # The last rank sleeps 100 ms after each step. With an evaluation after every step, rank 0
    # reaches each evaluation first: the wait for the straggler must land on the training
    # clock (as it would at the next step's allreduce without an evaluation), not inside the
    # evaluation, whose duration the training clock leaves out.
    run(mpirun(2, *hvdtrain("train", "--straggler", "100ms", "--eval-every-steps", "1",
                            "--batch-size", "128", *QUIET, "--epochs", "1",
                            "--run-dir", str(tmp_path))))
    steps = records(tmp_path, "epoch")[0]["step"]
    assert steps == 5  # digits: 1437 training samples, 2 workers of batch 128
    last = records(tmp_path, "eval")[-1]
    assert last["step"] == steps - 1
    # every step but the last before this evaluation waited 100 ms for the straggler
    assert last["train_seconds"] >= 0.9 * 0.1 * (steps - 1), last
