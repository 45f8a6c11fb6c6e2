"""TFLOP/s in every epoch line of real 2-worker jobs, sync (Horovod) and async (parameter
server), and MFU with --peak-tflops.

The same jobs keep the best evaluation (--keep-best test_acc): best.pt must hold the epoch of
the best test accuracy in metrics.jsonl. That check of test_best_multiproc.py's shares these
launches instead of starting its own (one 3-epoch job of each mode for both)."""

import pytest

from hvdtrain import checkpoint
from launch import hvdtrain, mpirun, records, run

pytestmark = pytest.mark.multiproc
# Lock-step in async mode, as test_best_multiproc.py's jobs run (its early stopping needs it).
MODES = {"sync": (2, []),
         "async": (3, ["--mode", "async", "--staleness", "0", "--timeout-s", "30"])}


@pytest.mark.parametrize("mode", MODES)
def test_every_epoch_line_has_tflops_and_mfu_and_best_pt_holds_the_best_test_accuracy(
        tmp_path, mode):
    np, flags = MODES[mode]
    proc = run(mpirun(np, *hvdtrain("train", "--no-progress", "--seed", "1", *flags,
                                    "--epochs", "3", "--peak-tflops", "0.01",
                                    "--keep-best", "test_acc", "--run-dir", str(tmp_path))),
               env={"HVDTRAIN_NO_FLOP_COUNT": ""})  # count, as every run outside the tests does
    header = records(tmp_path, "header")[0]
    assert header["flops_per_sample"] > 0 and header["devices"] == 2, header
    epochs = records(tmp_path, "epoch")
    assert len(epochs) == 3
    for line in epochs:
        # all workers' samples per second: the devices' rate together
        assert line["tflops"] == pytest.approx(
            header["flops_per_sample"] * line["samples_per_sec"] / 1e12, rel=1e-3)
        assert line["mfu"] == pytest.approx(line["tflops"] / (0.01 * 2), rel=1e-3)
    assert "TFLOP/s (MFU" in proc.stdout and "on average over the epochs" in proc.stdout

    best_line = max(epochs, key=lambda r: r["test_acc"])  # the first of equals, like the tracker
    best = checkpoint.load(tmp_path / "best.pt")
    assert (best["epoch"], best["best"]["value"]) == (best_line["epoch"], best_line["test_acc"])
