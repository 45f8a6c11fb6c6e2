"""--eval-pauses-workers: while worker 0 evaluates, the servers hold the other workers' replies,
so no one trains during an evaluation (as in sync mode) and a time to target read on worker 0's
training clock counts no free steps."""

import pytest

from launch import REPO, hvdtrain, mpirun, records, run

pytestmark = pytest.mark.multiproc
SLOW_EVAL = str(REPO / "tests" / "helpers" / "user" / "slow_eval_model.py") + ":build"
# Worker 0 evaluates after every 2nd of its steps, and an evaluation (one batch of 200 ms) lasts
# many of worker 1's steps: free, worker 1 takes most of its 80 steps during the first ones.
FLAGS = ["--mode", "async", "--model", SLOW_EVAL, "--epochs", "1", "--eval-every-steps", "2",
         "--batch-size", "8", "--max-steps-per-epoch", "80", "--no-progress",
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
    # paused, its one push in flight is all that can come between, besides the steps worker 1
    # may take while worker 0 starts (it sends the servers the first parameters): up to 12
    # were seen on a loaded machine.
    assert max(staleness(free)) >= 18, (staleness(free), staleness(paused))
    assert max(staleness(paused)) <= 14, (staleness(free), staleness(paused))
    evals = records(paused, "eval")
    assert len(evals) >= 30 and all(0 <= e["test_acc"] <= 1 for e in evals)


def test_each_worker_sleeps_the_time_it_computed_during_an_evaluation(tmp_path):
    # Worker 1 sleeps 200 ms after each step (a straggler's step is its sleep too); worker 0
    # evaluates for 200 ms after each of its steps. Worker 1 thus computes through most of each
    # evaluation, and server 0 charges it that time, which it sleeps: the debts are most of the
    # evaluations' time, and never more.
    run(mpirun(3, *hvdtrain("train", *FLAGS, "--eval-pauses-workers", "--straggler", "200ms",
                            "--max-steps-per-epoch", "12", "--eval-every-steps", "1",
                            "--run-dir", str(tmp_path))))
    evals = records(tmp_path, "eval")
    paused = evals[-1]["wall_seconds"] - evals[-1]["train_seconds"]  # all but the last one
    debt = records(tmp_path, "scheme")[0]["servers"][0]["eval_pause_debt_seconds"]
    assert 0.4 * paused <= debt <= paused + 0.3, (debt, paused, len(evals))
