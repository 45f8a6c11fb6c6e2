"""Bad input that only a real launch shows (issue 14, item 11): --elastic under plain mpirun.
Issue 24: user data and models that ended in a traceback, a full disk with --tensorboard, and a
fit() script without a main guard."""

import sys

import pytest
from helpers.forked_cli import run_forked
from user_files import CANNOT_TRAIN, write

from launch import hvdtrain, mpirun, run

pytestmark = pytest.mark.multiproc


def test_elastic_under_mpirun_exits_2_and_names_horovodrun(tmp_path):
    # It used to train without elastic's rendezvous, so a lost rank still ended the job.
    proc = run(mpirun(2, *hvdtrain("train", "--elastic", "--run-dir", str(tmp_path / "run"),
                                   "--epochs", "1", "--no-progress")), check=False)
    assert proc.returncode == 2
    assert "--elastic needs horovodrun's elastic mode" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "run").exists()


# --- issue 24: bad input that ended in a traceback ------------------------------------------------
T = ["train", "--no-progress", "--epochs", "1", "--max-steps-per-epoch", "2"]


CANNOT_TRAIN_CASES = {
    ("test_of_another_shape", "linear"): "a batch of the test split fails where one of the "
                                         "training split passes (the test inputs are of shape",
    ("huge_label", "mlp"): "the labels go up to 1099511627776 but only 4 distinct ones occur",
    ("pairs", "frozen"): "the model has nothing to train: all 2 of its parameter tensors are "
                         "frozen",
}


@pytest.fixture(scope="module")
def cannot_train_runs(tmp_path_factory):
    """Each case of CANNOT_TRAIN_CASES as `hvdtrain train ...`, in processes forked from one
    launch (forked_cli.py): {(dataset, model): (its folder, finished process)}."""
    root = tmp_path_factory.mktemp("cannot-train")
    code = write(root / "code.py", CANNOT_TRAIN)
    folders = [root / str(index) for index in range(len(CANNOT_TRAIN_CASES))]
    procs = run_forked([[*T, "--run-dir", str(folder / "run"), "--dataset", f"{code}:{dataset}",
                         "--model", model if model == "mlp" else f"{code}:{model}"]
                        for (dataset, model), folder in zip(CANNOT_TRAIN_CASES, folders)],
                       root / "cases")
    return dict(zip(CANNOT_TRAIN_CASES, zip(folders, procs)))


@pytest.mark.parametrize("dataset, model", list(CANNOT_TRAIN_CASES))
def test_user_data_and_models_that_cannot_train_exit_2(cannot_train_runs, dataset, model):
    tmp_path, proc = cannot_train_runs[dataset, model]
    message = CANNOT_TRAIN_CASES[dataset, model]
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert message in proc.stderr
    if dataset != "test_of_another_shape":  # there the model's own traceback comes first
        assert "Traceback" not in proc.stderr
    assert not (tmp_path / "run" / "checkpoint.pt").exists()


# The files the run writes share one disk, which fills after a given number of writes: the JSONL
# log's through os.write (hvdtrain.run_output), TensorBoard's event file's through its own io.open.
# Counted in writes, not bytes, so that where it fills does not depend on the length of the paths
# in the log's header.
FULL_DISK_COMMAND = """
import errno, os, sys
writes_left = [int(sys.argv[1])]


def take(n):
    if writes_left[0] <= 0:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    writes_left[0] -= 1
    return n


from hvdtrain import run_output
real_write = os.write
run_output.os.write = lambda fd, data: real_write(fd, bytes(data[:take(len(data))]))

from tensorboard.compat.tensorflow_stub.io import gfile
real_open = gfile.io.open


class OnFullDisk:
    def __init__(self, file):
        self.file = file

    def write(self, data):
        n = take(len(data))
        self.file.write(data[:n])
        if n < len(data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.file.close()

    def __getattr__(self, name):
        return getattr(self.file, name)


gfile.io.open = lambda *args, **kwargs: OnFullDisk(real_open(*args, **kwargs))
from hvdtrain.cli import main
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.parametrize("writes", [4, 40])  # the disk fills in epoch 1, or in epoch 2
def test_tensorboard_on_a_full_disk_ends_with_the_message_of_a_run_without_it(tmp_path, writes):
    code = write(tmp_path / "code.py", CANNOT_TRAIN)
    run_dir = tmp_path / "run"
    proc = run([sys.executable, "-c", FULL_DISK_COMMAND, str(writes), *T, "--epochs", "3",
                "--max-steps-per-epoch", "20", "--batch-size", "2", "--log-steps",
                "--tensorboard", "--dataset", f"{code}:pairs", "--model", f"{code}:linear",
                "--run-dir", str(run_dir)], check=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr  # there were two, from TensorBoard's thread
    assert "(No space left on device)" in proc.stderr
    assert proc.stderr.rstrip().splitlines()[-1].startswith("hvdtrain: error: could not write")


UNGUARDED_FIT = """
    import torch
    from torch.utils.data import TensorDataset

    import hvdtrain

    x, y = torch.randn(64, 8), torch.randint(0, 3, (64,))
    hvdtrain.fit(lambda: torch.nn.Linear(8, 3), TensorDataset(x, y), data_workers=2, epochs=1,
                 max_steps_per_epoch=2, progress=False)
"""


def test_a_fit_script_without_a_main_guard_and_loader_processes_is_refused(tmp_path):
    # Each loader process imported the script again and ran fit() once more: stray run folders,
    # then a traceback.
    script = write(tmp_path / "train.py", UNGUARDED_FIT)
    proc = run([sys.executable, str(script)], cwd=tmp_path, check=False)
    assert proc.returncode == 1
    assert (f"ConfigError: data_workers=2: {script} calls fit() at line 8 without an `if "
            '__name__ == "__main__":` guard') in proc.stderr, proc.stderr[-3000:]
    assert "or pass data_workers=0" in proc.stderr
    assert not (tmp_path / "runs").exists()
    guarded = write(tmp_path / "guarded.py", UNGUARDED_FIT.replace(
        "\n    hvdtrain.fit(", '\n    if __name__ == "__main__":\n        hvdtrain.fit(').replace(
        "\n                 max_steps", "\n                     max_steps"))
    run([sys.executable, str(guarded)], cwd=tmp_path)
    assert len(list((tmp_path / "runs").iterdir())) == 1


def test_an_exception_in_the_users_forward_says_which_checkpoint_is_intact(tmp_path):
    code = write(tmp_path / "code.py", CANNOT_TRAIN)
    run_dir = tmp_path / "run"
    proc = run(hvdtrain(*T, "--epochs", "3", "--run-dir", str(run_dir), "--dataset",
                        f"{code}:pairs", "--model", f"{code}:FailsOnceCheckpointed"),
               check=False, env={"FAIL_AFTER": str(run_dir / "checkpoint.pt")})
    assert proc.returncode == 1
    assert "RuntimeError: the user's forward() failed" in proc.stderr  # its traceback stays
    assert proc.stderr.rstrip().splitlines()[-1] == (
        f"hvdtrain: error: training stopped by RuntimeError (traceback above); the last "
        f"checkpoint {run_dir / 'checkpoint.pt'} is intact; fix the cause and continue with "
        f"--resume {run_dir}")


# --- issue 41: under mpirun's recovery settings a refused job exits 0 -----------------------------
RECOVERY = ["--mca", "orte_enable_recovery", "1", "--mca", "orte_abort_on_non_zero_status", "0"]


@pytest.mark.parametrize("mode, np, refused, message", [
    ("sync", 2, ["--epochs", "0"], "--epochs: invalid value 0"),
    ("async", 3, ["--timeout-s", "30", "--max-restarts", "1", "--lr", "-1"],
     "--lr: invalid value -1"),
    # refused by the workers' model check, after MPI started: every rank now raises it (it had
    # aborted the job, and fit() could not catch it)
    ("async", 3, ["--model", "WIDE_MODEL"], "mat1 and mat2 shapes cannot be multiplied"),
])
def test_the_recovery_launch_line_fails_a_refused_job(tmp_path, mode, np, refused, message):
    # mpirun under these settings exits 0 whatever its ranks return: each rank printed its exit-2
    # message and the job looked like a success to a scheduler. Every rank now stops mpirun
    # (fail_launcher), which exits 1; `hvdtrain run` gives the ranks' own code, 2.
    wide = write(tmp_path / "wide.py", "import torch\n"
                                       "def build():\n    return torch.nn.Linear(65, 10)\n")
    refused = [f"{wide}:build" if flag == "WIDE_MODEL" else flag for flag in refused]
    command = mpirun(np, *RECOVERY, *hvdtrain("train", "--mode", mode, "--run-dir",
                                              str(tmp_path / "run"), *refused))
    proc = run(command, check=False, timeout=120)
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-3000:])
    assert message in proc.stderr
    assert "MPI_ABORT" not in proc.stderr
    if mode == "sync" or "--model" in refused:
        wrapped = run(hvdtrain("run", *command), check=False, timeout=120)
        assert wrapped.returncode == 2, (wrapped.returncode, wrapped.stderr[-3000:])
        assert "hvdtrain run: exit 2, the ranks' own code" in wrapped.stderr
    assert not (tmp_path / "run").exists()
