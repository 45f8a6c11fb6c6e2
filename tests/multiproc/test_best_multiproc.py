"""--keep-best and --early-stop-patience under real launches: sync with 2 ranks, async with 2
workers and a server. best.pt holds the best evaluation in metrics.jsonl, early stopping stops
every worker at the same epoch and exits 0, and a resumed run keeps its best and its patience.
That best.pt holds the best test accuracy (--keep-best test_acc, sync and async) is checked on
test_throughput_multiproc.py's 3-epoch jobs, which keep it: one launch for both checks."""

import pytest

from hvdtrain import checkpoint
from launch import hvdtrain, mpirun, records, run

pytestmark = pytest.mark.multiproc
QUIET = ["--no-progress", "--seed", "1"]
# Lock-step in async mode: a worker that stopped at another step than the others would leave
# them waiting for its push, which --timeout-s turns into an error instead of a hang.
MODES = {"sync": (2, []), "async": (3, ["--mode", "async", "--staleness", "0", "--timeout-s", "30"])}


def patience_runs_out(values: list[float], patience: int) -> tuple[int | None, int]:
    """Early stopping by hand over the logged evaluations, minimising: (the epoch after which
    patience runs out, or None; the best epoch by then)."""
    best, best_epoch, since = None, 0, 0
    for epoch, value in enumerate(values, start=1):
        if best is None or value < best:
            best, best_epoch, since = value, epoch, 0
        else:
            since += 1
        if since >= patience:
            return epoch, best_epoch
    return None, best_epoch


@pytest.mark.parametrize("mode", MODES)
def test_early_stopping_stops_every_worker_and_a_resume_keeps_counting(tmp_path, mode):
    np, flags = MODES[mode]
    # min:test_acc: accuracy mostly rises after the first epoch, so an early epoch stays the best
    # and patience 2 stops the run well before epoch 10. (Async batches go to whoever asks, so
    # its accuracies differ from run to run: the stops are derived from the logged ones.)
    train = [*QUIET, *flags, "--epochs", "10", "--keep-best", "min:test_acc",
             "--run-dir", str(tmp_path)]
    proc = run(mpirun(np, *hvdtrain("train", *train, "--early-stop-patience", "2")))
    accs = [r["test_acc"] for r in records(tmp_path, "epoch")]
    stop, best_epoch = patience_runs_out(accs, 2)
    assert stop is not None and stop < 10, accs
    assert f"stopped early after epoch {stop}: test_acc has not improved in 2 evaluations" in \
        proc.stdout
    assert [r["epoch"] for r in records(tmp_path, "epoch")] == list(range(1, stop + 1))
    assert "test_acc has not improved" in records(tmp_path, "stop")[0]["reason"]
    best = checkpoint.load(tmp_path / "best.pt")
    assert (best["epoch"], best["best"]["value"]) == (best_epoch, min(accs))
    assert checkpoint.load(tmp_path)["epoch"] == stop
    if mode == "async":
        assert records(tmp_path, "scheme")  # the servers shut down and reported
    best_bytes = (tmp_path / "best.pt").read_bytes()

    # With patience 4 the resumed run has two evaluations left; one that forgot its record would
    # take epoch stop + 1 as its best, overwrite best.pt, and train on four more epochs.
    proc = run(mpirun(np, *hvdtrain("train", *train, "--early-stop-patience", "4",
                                    "--auto-resume")))
    accs = [r["test_acc"] for r in records(tmp_path, "epoch")]
    resumed_stop, resumed_best = patience_runs_out(accs, 4)
    assert resumed_stop is not None and resumed_stop > stop, accs
    assert f"stopped early after epoch {resumed_stop}" in proc.stdout
    assert [r["epoch"] for r in records(tmp_path, "epoch")] == list(range(1, resumed_stop + 1))
    if resumed_best == best_epoch:  # no better evaluation after the resume: best.pt untouched
        assert (tmp_path / "best.pt").read_bytes() == best_bytes
    assert checkpoint.load(tmp_path / "best.pt")["epoch"] == resumed_best
    assert checkpoint.load(tmp_path)["best"]["evaluations_since"] == resumed_stop - resumed_best
