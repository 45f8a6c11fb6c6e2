"""Bad input that only a real launch shows (issue 14, item 11): --elastic under plain mpirun."""

import pytest

from launch import hvdtrain, mpirun, run

pytestmark = pytest.mark.multiproc


def test_elastic_under_mpirun_exits_2_and_names_horovodrun(tmp_path):
    # It used to train without elastic's rendezvous, so a lost rank still ended the job.
    proc = run(mpirun(2, *hvdtrain("train", "--elastic", "--run-dir", str(tmp_path / "run"),
                                   "--epochs", "1", "--no-progress")), check=False)
    assert proc.returncode == 2
    assert "--elastic needs horovodrun's elastic mode" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "run").exists()
