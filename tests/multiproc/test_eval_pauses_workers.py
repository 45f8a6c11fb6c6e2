"""--eval-pauses-workers: while worker 0 evaluates, the servers hold the other workers' replies,
so no one trains during an evaluation (as in sync mode) and a time to target read on worker 0's
training clock counts no free steps."""

import pytest

from launch import REPO, hvdtrain, mpirun, records, run

pytestmark = pytest.mark.multiproc
SLOW_EVAL = str(REPO / "tests" / "helpers" / "user" / "slow_eval_model.py") + ":build"
# Worker 0 evaluates after each of its steps, and an evaluation (8 batches of 50 ms) lasts many
# of worker 1's steps.
FLAGS = ["--mode", "async", "--model", SLOW_EVAL, "--epochs", "1", "--eval-every-steps", "1",
         "--max-steps-per-epoch", "12", "--no-progress", "--checkpoint-every", "0"]


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
    # pushes many times during each evaluation, so they arrive many updates stale; paused, its
    # one push in flight is all that can come between.
    assert max(staleness(free)) >= 4, staleness(free)
    assert max(staleness(paused)) <= 2, staleness(paused)
    evals = records(paused, "eval")
    assert len(evals) >= 10 and all(0 <= e["test_acc"] <= 1 for e in evals)
