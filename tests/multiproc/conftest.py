"""Multi-process tests start real mpirun / horovodrun jobs (or the hvdtrain command as a
subprocess). Without Open MPI each of them fails with the fix in its message; the unit tests in
tests/unit still run.

Runs that several test files need alike are session fixtures here: each runs once, at its first
use (in whichever file pytest reaches first), into a folder of its own; tests read it, and copy
it before they change anything in it. A launch costs seconds of start-up on every rank."""

import shutil
import sys

import pytest

from launch import BSP_REFERENCE, HELPER, SYNC_REFERENCE, hvdtrain, launcher_env, mpirun, run


@pytest.fixture(autouse=True)
def _launchers_present():
    # The PATH the launched jobs get (the venv's bin first), so the check sees what they see.
    if shutil.which("mpirun", path=launcher_env()["PATH"]) is None:
        pytest.fail("mpirun not found: run `make setup` (it installs Open MPI)", pytrace=False)


@pytest.fixture(scope="session")
def sync_reference(tmp_path_factory):
    """2-rank sync training under mpirun with SYNC_REFERENCE's flags, through
    tests/helpers/train_and_dump.py: a folder with rank0.pt and rank1.pt (each rank's final
    parameters) and run/ (the run folder, its checkpoint after epoch 2). It is
    test_sync_multiproc's identical-ranks case under mpirun and the first half of its resume,
    the sync run that test_async_multiproc's BSP must reproduce, and test_multihost's one-host
    reference."""
    folder = tmp_path_factory.mktemp("sync-reference")
    run(mpirun(2, sys.executable, HELPER, str(folder), *SYNC_REFERENCE,
               "--run-dir", str(folder / "run")))
    return folder


@pytest.fixture(scope="session")
def bsp_one_server(tmp_path_factory):
    """BSP_REFERENCE under mpirun -np 3 (2 workers, 1 server): its run folder. What sync
    training and two servers must reproduce (test_async_multiproc), and plain --bsp, which
    --backup-workers 0 must equal (test_backup_workers_multiproc)."""
    run_dir = tmp_path_factory.mktemp("bsp-one")
    run(mpirun(3, *hvdtrain("train", *BSP_REFERENCE, "--run-dir", str(run_dir))))
    return run_dir
