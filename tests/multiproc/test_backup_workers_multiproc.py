"""--bsp --backup-workers b (Chen et al. 2016): real mpirun jobs whose rounds close at N-b
gradients. The round logic itself, schedule by schedule, is in tests/unit/test_backup_workers.py."""

import math
import os
import signal
import subprocess
import time

import pytest
import torch

from hvdtrain import checkpoint
from launch import (BSP_REFERENCE, final_model, hvdtrain, launcher_env, mpirun, pid_of_rank,
                    records, run)

pytestmark = pytest.mark.multiproc
QUIET = ["--no-progress", "--seed", "1"]
BACKUP = ["--mode", "async", "--bsp", "--backup-workers", "1"]


def servers(run_dir):
    return records(run_dir, "scheme")[0]["servers"]


def total_steps(run_dir, epochs):
    return records(run_dir, "header")[0]["steps_per_epoch"] * epochs


def test_a_straggler_is_left_out_of_the_rounds_and_nothing_stale_is_applied(tmp_path):
    # 2 workers + 1 server; the last worker takes 3 times as long per step.
    run(mpirun(3, *hvdtrain("train", *QUIET, *BACKUP, "--straggler", "3x", "--epochs", "2",
                            "--run-dir", str(tmp_path))))
    steps = total_steps(tmp_path, 2)  # per worker
    (stats,) = servers(tmp_path)
    assert stats["pushes_applied"] == 2 * steps  # every push reached the server
    # N-b = 1: every round closed on the first gradient, which plain --bsp never does.
    assert set(stats["gradients_per_round"]) == {"1"}, stats["gradients_per_round"]
    assert stats["dropped_gradients"] > 0  # the pushes that lost their round
    assert stats["updates"] + stats["dropped_gradients"] == 2 * steps  # applied or dropped
    assert stats["gradients_applied"] == stats["updates"]  # one gradient per round of N-b = 1
    # Plain --bsp makes one update per step of a worker; here the rounds left the slow worker
    # behind, so there are more.
    assert stats["updates"] > steps, (stats["updates"], steps)
    assert stats["staleness_histogram"] == {"0": stats["updates"]}  # nothing stale applied
    model = final_model(tmp_path)
    assert all(torch.isfinite(v).all() for v in model.values())
    epochs = records(tmp_path, "epoch")
    assert epochs[-1]["train_loss"] < epochs[0]["train_loss"]
    assert epochs[-1]["test_loss"] < math.log(10)  # below a uniform guess over 10 classes


def test_the_straggler_takes_the_jobs_batches_and_trains_none_alone_at_the_end(tmp_path):
    # 3 workers + 1 server, the last one 3x slower. With a fixed share it still held most of
    # its batches when the fast workers finished and trained them alone, in dozens of rounds
    # of one gradient at lr x (N-b) (issue 25); from server 0's plan all run out together.
    run(mpirun(4, *hvdtrain("train", *QUIET, *BACKUP, "--straggler", "3x", "--epochs", "2",
                            "--run-dir", str(tmp_path))))
    (stats,) = servers(tmp_path)
    assert stats["gradients_per_round"].get("1", 0) <= 1, stats["gradients_per_round"]
    assert stats["batches_left"] == 0, stats["batches_per_worker"]


def test_zero_backup_workers_is_plain_bsp(tmp_path, bsp_one_server):
    # Plain --bsp is conftest's bsp_one_server run (BSP_REFERENCE, shared with
    # test_async_multiproc); the same flags with --backup-workers 0 must end on its weights.
    run(mpirun(3, *hvdtrain("train", *BSP_REFERENCE, "--backup-workers", "0",
                            "--run-dir", str(tmp_path / "b0"))))
    plain, zero = final_model(bsp_one_server), final_model(tmp_path / "b0")
    assert all(torch.equal(plain[k], zero[k]) for k in plain)
    (stats,) = servers(tmp_path / "b0")
    rounds = total_steps(tmp_path / "b0", 2)  # one round of both workers' gradients a step
    assert stats["dropped_gradients"] == 0 and stats["gradients_per_round"] == {"2": rounds}


def test_two_servers_close_the_same_rounds(tmp_path):
    # Server 0 decides each round for both shards; over messages (no shared memory) the
    # follower also takes late gradients off the wire.
    run(mpirun(4, *hvdtrain("train", *QUIET, *BACKUP, "--straggler", "3x", "--epochs", "1",
                            "--num-servers", "2", "--no-shared-memory",
                            "--run-dir", str(tmp_path))))
    first, second = servers(tmp_path)
    for key in ("updates", "dropped_gradients", "gradients_per_round", "staleness_histogram",
                "pushes_applied"):
        assert first[key] == second[key], (key, first[key], second[key])
    assert set(first["gradients_per_round"]) == {"1"}
    assert first["updates"] + first["dropped_gradients"] == 2 * total_steps(tmp_path, 1)
    assert all(torch.isfinite(v).all() for v in final_model(tmp_path).values())


def test_a_stop_signal_on_the_straggler_stops_everyone_and_the_resumed_run_finishes(tmp_path):
    # The straggler's pushes are mostly late, so its stop request usually travels in a dropped
    # push; the fast worker may already be waiting at the end of training (idle). Either way the
    # job must stop with a checkpoint (exit 75), not hang, and a resume must finish.
    run_dir = tmp_path / "run"
    # Backup workers take the job's batches (issue 25), so the fast worker trains most of them
    # and the run is short: enough epochs that the signal comes well before the end.
    command = mpirun(3, *hvdtrain("train", *QUIET, *BACKUP, "--epochs", "100", "--batch-size",
                                  "16", "--straggler", "30ms", "--run-dir", str(run_dir),
                                  "--auto-resume"))
    job = subprocess.Popen(command, env=launcher_env(), stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not (run_dir / "metrics.jsonl").exists():
            assert job.poll() is None, f"the job ended before the signal: {job.communicate()}"
            assert time.monotonic() < deadline, "no log after 120 s"
            time.sleep(0.05)
        time.sleep(1.0)  # 100 epochs take about 10 s (CI: 6 epochs took 0.6 s)
        pid = pid_of_rank(run_dir, "OMPI_COMM_WORLD_RANK", 1)
        assert pid is not None
        os.kill(pid, signal.SIGUSR1)
        out, err = job.communicate(timeout=120)  # a hang fails here
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    assert job.returncode == 75, out + err
    assert "Traceback" not in err and "stopped by" in out, out + err
    run(command)
    assert checkpoint.load(run_dir)["epoch"] == 100
    (stats,) = servers(run_dir)
    assert set(map(int, stats["staleness_histogram"])) <= {0}


def test_bad_backup_workers_exit_2_with_the_fix(tmp_path):
    proc = run(hvdtrain("train", "--mode", "async", "--backup-workers", "1"), check=False)
    assert proc.returncode == 2 and "add --bsp, or drop" in proc.stderr, proc.stderr
    proc = run(hvdtrain("train", "--backup-workers", "1"), check=False)  # sync mode
    assert proc.returncode == 2 and "add --mode async --bsp" in proc.stderr, proc.stderr
    proc = run(hvdtrain("train", "--bsp", "--backup-workers", "1"), check=False)
    assert proc.returncode == 2 and "--bsp: an option of the parameter server" in proc.stderr
    # 2 workers + 1 server: at most 1 backup worker.
    proc = run(mpirun(3, *hvdtrain("train", *BACKUP[:-1], "2", "--epochs", "1", "--no-progress",
                                   "--run-dir", str(tmp_path))), check=False)
    assert proc.returncode == 2, proc.stderr
    assert "--backup-workers: invalid value 2; this job has 2 worker(s)" in proc.stderr
