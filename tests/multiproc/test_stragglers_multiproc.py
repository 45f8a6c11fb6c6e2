"""A random straggler in a real sync run: the workers sleep the model's seeded draws (the model
itself is unit-tested in tests/unit/test_stragglers.py)."""

import pytest

from hvdtrain.stragglers import parse_straggler
from hvdtrain.run_output import read_jsonl
from launch import hvdtrain, mpirun, run

pytestmark = pytest.mark.multiproc


def _epoch_seconds(run_dir, straggler, steps, seed, epochs=1):
    """Each epoch's training time (epoch_seconds: its evaluation left out) of one sync run."""
    run(mpirun(2, *hvdtrain("train", "--straggler", straggler, "--epochs", str(epochs),
                            "--max-steps-per-epoch", str(steps), "--seed", str(seed),
                            "--no-progress", "--run-dir", str(run_dir))))
    return [r["epoch_seconds"] for r in read_jsonl(run_dir / "metrics.jsonl")
            if r["type"] == "epoch"]


def test_exponential_delays_slow_a_sync_run_by_their_draws(tmp_path):
    steps, seed = 20, 3
    [slowed] = _epoch_seconds(tmp_path / "exp", "exp:20ms", steps, seed)
    # The steps alone take about as long as the sleeps on a busy 2-core machine, so the extra
    # time is measured against the same steps without a straggler. Load only ever adds time,
    # and one stalled run took 0.64 s for what takes 0.03 s on a quiet machine (CI at 0525fef),
    # so the baseline is the fastest of three epochs of the same 20 steps: of one run, which
    # spares the launches of two more.
    plain_epochs = _epoch_seconds(tmp_path / "none", "none", steps, seed, epochs=3)
    assert len(plain_epochs) == 3, plain_epochs
    plain = min(plain_epochs)
    model = parse_straggler("exp:20ms")
    draws = [[model.delay(w, 2, s, 0.0, seed) for w in (0, 1)] for s in range(steps)]
    # Each sync step waits for the slower worker's sleep after the step before; worker 1's last
    # sleep may fall outside worker 0's epoch time, so it is left out.
    expected = sum(max(pair) for pair in draws[:-1])
    assert expected > 0.3  # about 1.5 x 20 ms x 19 steps
    assert slowed >= 0.9 * expected, (slowed, expected)  # a sleep is never shorter than asked
    assert slowed - plain >= 0.5 * expected, (slowed, plain, expected)  # loose: load varies
