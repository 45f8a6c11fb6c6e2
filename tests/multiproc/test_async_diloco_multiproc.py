"""Asynchronous DiLoCo (--mode async --local-steps H): a real mpirun job of 2 workers and a
server, with a timeout. tests/unit/test_async_diloco.py checks the outer step's arithmetic and
the worker's rounds in one process."""

import pytest
import torch

from hvdtrain.ps import shard_file
from launch import hvdtrain, mpirun, records, run

pytestmark = pytest.mark.multiproc
ADILOCO = ["--mode", "async", "--local-steps", "8", "--outer-lr", "0.7",
           "--outer-momentum", "0.9", "--no-progress", "--seed", "1"]


def test_digits_reaches_95_percent_and_a_resumed_run_applies_every_round_once(tmp_path):
    """The issue's command line (20 epochs, the default), stopped after epoch 10 and resumed:
    every batch of the plan is completed once, by a push that the server applied, and the
    resumed run's server continues the checkpoint's outer step (version and momentum)."""
    run_dir = tmp_path / "run"
    run(mpirun(3, *hvdtrain("train", *ADILOCO, "--epochs", "10", "--run-dir", str(run_dir))),
        timeout=150)
    halfway = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    server = halfway["server_state"]
    outer = shard_file.read_all(run_dir)["vectors"]  # beside the checkpoint, in its own file
    assert outer["momentum_buffer"].abs().max() > 0  # the outer momentum is saved
    assert "inner_optimizer" in halfway
    resumed = run(mpirun(3, *hvdtrain("train", *ADILOCO, "--epochs", "20", "--resume",
                                      str(run_dir), "--run-dir", str(run_dir))), timeout=150)
    assert "fresh optimizer state" not in resumed.stdout + resumed.stderr
    epochs = records(run_dir, "epoch")
    assert epochs[-1]["epoch"] == 20, epochs[-1]
    # It reaches 0.95 (as a time to target counts it). Async runs vary with the interleaving of
    # the pushes: the last epoch ended at 0.936 to 0.967 in the runs measured (docs/async.md).
    assert max(e["test_acc"] for e in epochs) >= 0.95, [e["test_acc"] for e in epochs]
    assert epochs[-1]["test_acc"] >= 0.9, epochs[-1]
    first, second = records(run_dir, "scheme")
    # 1437 samples / 32 per batch / 2 parts: 22 steps of 2 batches per epoch, 10 epochs a run
    for part in (first, second):
        assert part["batches_completed"] == 440 and part["batches_left"] == 0, part
        assert part["pushes_applied"] == part["pushes_made_by_workers"], part
    # Rounds of 8 batches, plus the early ones where worker 0 evaluates (once an epoch) and
    # where a worker ends (a round each): as many outer rounds as an uninterrupted run, up to
    # the one early round per worker that the interruption adds.
    rounds = first["pushes_applied"] + second["pushes_applied"]
    assert 880 // 8 <= rounds <= 880 // 8 + 20 + 2 * 2, rounds
    final = torch.load(run_dir / "checkpoint.pt", weights_only=False)["server_state"]
    assert final["version"] == server["version"] + second["pushes_applied"]


def test_under_bsp_a_resumed_run_applies_exactly_the_uninterrupted_runs_outer_rounds(tmp_path):
    """With --bsp a round pairs every worker's push, so the rounds are the job's, not the
    interleaving's: 4 epochs straight and 2 + 2 (stopped after epoch 2, resumed) apply the same
    12 rounds (3 an epoch: 8, 8 and the epoch's last 6 steps, cut where worker 0 evaluates) and
    end with the same weights. Before every worker ended its round where worker 0 does, worker
    0 made one round more than worker 1, and its last push waited for ever for a round worker
    1 never joined (the 4-epoch run hung). The inner SGD has its default momentum: worker 1
    saves its own inner optimizer state beside the checkpoint (checkpoint.worker-1.pt) and
    resumes from it. Before, every worker resumed with worker 0's, and the weights differed.
    The messages carry bf16 (--wire-dtype, no shared window): at the checkpoint worker 1 held
    its round's rounded reply, and a resume that started it from the float32 master ended
    0.003 away."""
    flags = ["--mode", "async", "--bsp", "--local-steps", "8", "--outer-lr", "0.7",
             "--outer-momentum", "0.9", "--no-progress", "--seed", "1", "--wire-dtype", "bf16",
             "--no-shared-memory"]
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    run(mpirun(3, *hvdtrain("train", *flags, "--epochs", "4", "--run-dir", str(straight))),
        timeout=120)
    run(mpirun(3, *hvdtrain("train", *flags, "--epochs", "2", "--run-dir", str(stopped))),
        timeout=120)
    own = torch.load(stopped / "checkpoint.worker-1.pt", weights_only=True)
    assert (own["own_state_of_worker"], own["epoch"], own["step"]) == (1, 2, 0)
    assert own["state"]["inner_optimizer"]["state"]  # its momentum buffers
    resumed = run(mpirun(3, *hvdtrain("train", *flags, "--epochs", "4", "--resume",
                                      str(stopped), "--run-dir", str(stopped))), timeout=120)
    assert "starts from the checkpoint's" not in resumed.stdout + resumed.stderr
    a = torch.load(straight / "checkpoint.pt", weights_only=False)
    b = torch.load(stopped / "checkpoint.pt", weights_only=False)
    assert a["server_state"]["version"] == b["server_state"]["version"] == 12
    assert [e["outer_rounds"] for e in records(straight, "epoch")] == [3] * 4
    for name in a["model"]:
        assert torch.equal(a["model"][name], b["model"][name]), name
