"""Multi-process tests start real mpirun / horovodrun jobs (or the hvdtrain command as a
subprocess). Without Open MPI each of them fails with the fix in its message; the unit tests in
tests/unit still run."""

import shutil

import pytest

from launch import launcher_env


@pytest.fixture(autouse=True)
def _launchers_present():
    # The PATH the launched jobs get (the venv's bin first), so the check sees what they see.
    if shutil.which("mpirun", path=launcher_env()["PATH"]) is None:
        pytest.fail("mpirun not found: run `make setup` (it installs Open MPI)", pytrace=False)
