"""--eval-pauses-workers: while worker 0 evaluates, the servers hold the other workers' replies,
so no one trains during an evaluation (as in sync mode) and a time to target read on worker 0's
training clock counts no free steps."""

import pytest

from launch import REPO, hvdtrain, mpirun, records, run

pytestmark = pytest.mark.multiproc
SLOW_EVAL = str(REPO / "tests" / "helpers" / "user" / "slow_eval_model.py") + ":build"
# Worker 0 evaluates after every 2nd of its steps, and an evaluation (one batch of 200 ms) lasts
# many of worker 1's steps: free, worker 1 takes most of its 40 steps during the first ones.
FLAGS = ["--mode", "async", "--model", SLOW_EVAL, "--epochs", "1", "--eval-every-steps", "2",
         "--batch-size", "16", "--max-steps-per-epoch", "40", "--no-progress",
         "--checkpoint-every", "0"]


def staleness(run_dir) -> dict[int, int]:
    scheme = records(run_dir, "scheme")[0]
    return {int(k): v for k, v in scheme["staleness_histogram"].items()}


@pytest.mark.parametrize("extra", [[], ["--num-servers", "2"]], ids=["1-server", "2-servers"])
def test_no_worker_trains_while_worker_0_evaluates(tmp_path, extra):
    free, paused = tmp_path / "free", tmp_path / "paused"
    run(mpirun(3 + len(extra) // 2, *hvdtrain("train", *FLAGS, *extra, "--run-dir", str(free))))
    run(mpirun(3 + len(extra) // 2, *hvdtrain("train", *FLAGS, *extra, "--eval-pauses-workers",
                                              "--run-dir", str(paused))))
    # Worker 0's gradients are computed on the parameters it pulled to evaluate. Free, worker 1
    # pushes many times during an evaluation, so one of them arrives tens of updates stale;
    # paused, its one push in flight is all that can come between, besides the few steps worker
    # 1 may take while worker 0 starts (it sends the servers the first parameters).
    assert max(staleness(free)) >= 15, (staleness(free), staleness(paused))
    assert max(staleness(paused)) <= 8, (staleness(free), staleness(paused))
    evals = records(paused, "eval")
    assert len(evals) >= 15 and all(0 <= e["test_acc"] <= 1 for e in evals)


def test_the_evaluation_clock_starts_once_the_others_wait_so_waiting_is_training_time(tmp_path):
    # Worker 1 sleeps 200 ms after each step; worker 0 evaluates after each of its steps. The
    # pause takes effect once worker 1 has pushed (its step under way is finished), and worker
    # 0's wait for that lands on its training clock, as a sync rank's wait for a straggler
    # does: about one sleep per evaluation. If the clock started at once, worker 1's sleep
    # would pass inside worker 0's evaluations, and worker 0's training time would hold only
    # its own few-millisecond steps.
    run(mpirun(3, *hvdtrain("train", "--mode", "async", "--eval-pauses-workers", "--epochs", "1",
                            "--eval-every-steps", "1", "--max-steps-per-epoch", "12",
                            "--straggler", "200ms", "--no-progress", "--checkpoint-every", "0",
                            "--run-dir", str(tmp_path))))
    evals = records(tmp_path, "eval")
    assert len(evals) >= 10
    assert evals[-1]["train_seconds"] >= 0.5 * 0.2 * (len(evals) - 1), evals[-1]
