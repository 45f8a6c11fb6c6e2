"""``hvdtrain compare --from-run`` against a real run (issue 26): a small 2-worker sync run with a
3x straggler on digits, then the answer from its log. Every mode gets a prediction, the fit names
worker 1 as the slow one, and for the run's own mode (sync) the prediction overlaps the run's
real time to the same target, on the training clock (the fit and the replay are unit-tested in
tests/unit/test_from_run.py)."""

import json

import pytest

from hvdtrain.rules.registry import FAMILIES, modes
from launch import hvdtrain, mpirun, run

pytestmark = pytest.mark.multiproc

# Above what 5 epochs reach, so the target is the run's best accuracy (--from-run caps it), which
# comes late in the run: the real time then spans the same epochs the fit reads. An early target
# (0.9 at epoch 3) was reached before a burst of load from other jobs slowed the later epochs
# 8x; the fit, which reads every epoch, predicted 1.23 s (one run: 0.49-2.36) for a real 0.48 s.
TARGET = 0.99


@pytest.mark.multiproc
def test_from_run_predicts_every_mode_and_its_own_runs_time(tmp_path):
    run_dir = tmp_path / "run"
    run(mpirun(2, *hvdtrain("train", "--epochs", "5", "--straggler", "3x", "--run-dir",
                            str(run_dir), "--no-progress")), timeout=120)
    answers = tmp_path / "answers"
    proc = run(hvdtrain("compare", "--from-run", str(run_dir), "--out", str(answers),
                        "--seeds", "4", "--target", str(TARGET)), timeout=240)
    [folder] = (answers / "from-run").iterdir()
    answer = json.loads((folder / "from_run.json").read_text())
    names = [p["mode"] for p in answer["predictions"]]
    assert names == [m.name for m in modes(list(FAMILIES), [2], [1], [4])]  # one a family
    for name in names:
        assert f"| {name}" in proc.stdout, name
    assert "recommendation: " in proc.stdout
    fast, slow = answer["fit"]["workers"]
    # About 3; on a loaded 2-core host worker 1's own compute is slower too (6x seen in CI)
    assert fast["factor"] == 1 and slow["factor"] >= 2, answer["fit"]
    [own] = [p for p in answer["predictions"] if p["own"]]
    assert own["mode"] == "sync" and answer["own_mode"] == "sync"
    real = answer["real_time_to_target"]
    assert real is not None, proc.stdout
    # The single-run range is where 95% of the replayed runs fall, so one real run lands
    # outside it 1 time in 20 by construction (CI saw 0.785 s against 0.796-1.081). A test
    # that runs on every push allows 15% on either side; a prediction off by more fails.
    low, high = 0.85 * min(own["ci_low"], own["run_low"]), 1.15 * max(own["ci_high"],
                                                                      own["run_high"])
    assert low <= real <= high, (
        f"real {real:.3f} s, predicted {own['mean']} ({own['ci_low']}-{own['ci_high']}), "
        f"single runs {own['run_low']}-{own['run_high']}:\n{proc.stdout}")
    assert not list(run_dir.glob("from_run*"))  # nothing written into the run's folder
