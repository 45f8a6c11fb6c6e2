"""TFLOP/s in every epoch line of real 2-worker jobs, sync (Horovod) and async (parameter
server), and MFU with --peak-tflops."""

import pytest

from launch import hvdtrain, mpirun, records, run

pytestmark = pytest.mark.multiproc


@pytest.mark.parametrize("mode, np", [("sync", 2), ("async", 3)])
def test_every_epoch_line_has_tflops_and_mfu(tmp_path, mode, np):
    proc = run(mpirun(np, *hvdtrain("train", "--no-progress", "--mode", mode, "--epochs", "3",
                                    "--peak-tflops", "0.01", "--run-dir", str(tmp_path))),
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
