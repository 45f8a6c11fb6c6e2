"""--keep-best and --early-stop-patience under real launches: sync with 2 ranks, async with 2
workers and a server. best.pt holds the best evaluation in metrics.jsonl, early stopping stops
every worker at the same epoch and exits 0, and a resumed run keeps its best and its patience."""

import pytest

from hvdtrain import checkpoint
from launch import hvdtrain, mpirun, records, run

pytestmark = pytest.mark.multiproc
QUIET = ["--no-progress", "--seed", "1"]
# Lock-step in async mode: a worker that stopped at another step than the others would leave
# them waiting for its push, which --timeout-s turns into an error instead of a hang.
MODES = {"sync": (2, []), "async": (3, ["--mode", "async", "--staleness", "0", "--timeout-s", "30"])}


@pytest.mark.parametrize("mode", MODES)
def test_best_pt_holds_the_best_test_accuracy(tmp_path, mode):
    np, flags = MODES[mode]
    run(mpirun(np, *hvdtrain("train", *QUIET, *flags, "--epochs", "3", "--keep-best",
                             "test_acc", "--run-dir", str(tmp_path))))
    epochs = records(tmp_path, "epoch")
    best_line = max(epochs, key=lambda r: r["test_acc"])  # the first of equals, like the tracker
    best = checkpoint.load(tmp_path / "best.pt")
    assert (best["epoch"], best["best"]["value"]) == (best_line["epoch"], best_line["test_acc"])


@pytest.mark.parametrize("mode", MODES)
def test_early_stopping_stops_every_worker_and_a_resume_keeps_counting(tmp_path, mode):
    np, flags = MODES[mode]
    # min:test_acc: accuracy only rises after the first epoch, so the first stays the best and
    # patience 2 stops the run after epoch 3 of 10.
    train = [*QUIET, *flags, "--epochs", "10", "--keep-best", "min:test_acc",
             "--run-dir", str(tmp_path)]
    proc = run(mpirun(np, *hvdtrain("train", *train, "--early-stop-patience", "2")))
    assert "stopped early after epoch 3: test_acc has not improved in 2 evaluations" in proc.stdout
    assert [r["epoch"] for r in records(tmp_path, "epoch")] == [1, 2, 3]
    assert "test_acc has not improved" in records(tmp_path, "stop")[0]["reason"]
    worst = min(records(tmp_path, "epoch"), key=lambda r: r["test_acc"])
    best = checkpoint.load(tmp_path / "best.pt")
    assert (best["epoch"], best["best"]["value"]) == (worst["epoch"], worst["test_acc"]) == \
        (1, records(tmp_path, "epoch")[0]["test_acc"])
    assert checkpoint.load(tmp_path)["epoch"] == 3
    if mode == "async":
        assert records(tmp_path, "scheme")  # the servers shut down and reported
    best_bytes = (tmp_path / "best.pt").read_bytes()

    # With patience 4 the resumed run has two evaluations left; one that forgot its record would
    # take epoch 4 as its best, overwrite best.pt, and train on to epoch 8.
    proc = run(mpirun(np, *hvdtrain("train", *train, "--early-stop-patience", "4",
                                    "--auto-resume")))
    assert "stopped early after epoch 5" in proc.stdout
    assert [r["epoch"] for r in records(tmp_path, "epoch")] == [1, 2, 3, 4, 5]
    assert (tmp_path / "best.pt").read_bytes() == best_bytes
    assert checkpoint.load(tmp_path)["best"]["evaluations_since"] == 4
