"""hvdtrain doctor with the real launcher on this machine (issue 44): with a launcher line it
runs mpirun with its probe, reads the ranks' facts back and judges them (fit, exit 0, doctor.json
with the allreduce measured, no probe file left in the run folder); as the job's command under
mpirun, a wrong --expect slot count is one line with its fix and exit 2. The faults between hosts
are tests/multiproc/test_doctor_netns.py's."""

import json
import socket

import pytest

from launch import hvdtrain, mpirun, run

pytestmark = pytest.mark.multiproc
SMALL = ["--sizes", "64KiB,256KiB", "--timeout", "50"]


def test_doctor_on_this_machine_fit_then_a_wrong_slot_count(tmp_path):
    proc = run(hvdtrain("doctor", "--json", str(tmp_path / "fit.json"), "--run-dir",
                        str(tmp_path / "runs"), *SMALL, *mpirun(2)), cwd=tmp_path, timeout=70)
    assert proc.stdout.splitlines()[-1] == "doctor: fit", proc.stdout + proc.stderr
    report = json.loads((tmp_path / "fit.json").read_text())
    assert report["version"] == 1 and report["fit"] is True and report["ranks"] == 2
    assert [h["ranks"] for h in report["hosts"].values()] == [[0, 1]]
    assert report["allreduce"]["ranks"] == 2 and report["allreduce"]["sizes"][-1]["bus_mbit"] > 0
    assert not (tmp_path / "runs").exists()  # made for the test, and removed with its files

    host = socket.gethostname()
    proc = run(mpirun(2, *hvdtrain("doctor", "--expect", f"{host}:3", "--run-dir",
                                   str(tmp_path / "runs"), *SMALL)),
               cwd=tmp_path, timeout=70, check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert (f"doctor: hosts: {host}: 2 rank(s) ran there, --expect asked for 3 -- fix: "
            f"launch 3 rank(s) on {host}") in proc.stdout
    assert "doctor: NOT fit (1 problem)" in proc.stdout
    assert json.loads((tmp_path / "doctor.json").read_text())["problems"][0]["check"] == "hosts"
