"""Local SGD (--mode sync --local-steps H): real mpirun jobs, each with a timeout, checked against
an independent single-process computation of the same algorithm."""

import copy
import shutil
import sys

import pytest
import torch
import torch.nn.functional as F

from hvdtrain.cli import build_parser, config_from_args
from hvdtrain.workload import workload_from_config
from launch import REPO, final_model, hvdtrain, mpirun, ranks_agree_with_checkpoint, records, run

pytestmark = pytest.mark.multiproc
HELPER = str(REPO / "tests" / "helpers" / "train_and_dump.py")
WORKERS = 2
# Plain SGD at a constant rate, so the simulation below needs no optimizer of hvdtrain's. Epoch 1
# is neither evaluated nor checkpointed: its closing average must happen anyway (epoch_done).
PLAIN_SGD = ["--optimizer", "sgd", "--momentum", "0", "--lr", "0.05", "--warmup-epochs", "0",
             "--epochs", "2", "--seed", "3", "--no-progress", "--eval-every", "2",
             "--checkpoint-every", "0"]


def simulate_local_sgd(flags: list[str], local_steps: int) -> dict[str, torch.Tensor]:
    """Local SGD written out by hand in one process: each simulated worker takes ``local_steps``
    SGD steps on its own shard of the epoch's batches, then the workers' parameters are averaged;
    an epoch's last, shorter round is averaged at the epoch's end."""
    cfg = config_from_args(build_parser().parse_args(["train", *flags]))
    workload = workload_from_config(cfg)
    torch.manual_seed(cfg.run.seed)  # as every rank does before it builds its replica
    model = workload.build_model()
    workload.bind(torch.device("cpu"), cfg)
    run_cfg, source = cfg.run, workload.train
    steps = source.steps_per_epoch(run_cfg.batch_size, WORKERS)
    lr = cfg.optim.lr * WORKERS  # linear scaling by the number of workers, no warmup
    replicas = [copy.deepcopy(model) for _ in range(WORKERS)]
    for epoch in range(run_cfg.epochs):
        shards = [list(source.train_batches(epoch, w, WORKERS, run_cfg.batch_size, run_cfg.seed,
                                            0, steps)) for w in range(WORKERS)]
        for start in range(0, steps, local_steps):
            for replica, shard in zip(replicas, shards):
                for x, y in shard[start:start + local_steps]:
                    replica.zero_grad()
                    F.cross_entropy(replica(x), y).backward()
                    with torch.no_grad():
                        for p in replica.parameters():
                            p -= lr * p.grad
            with torch.no_grad():
                for tensors in zip(*(r.parameters() for r in replicas)):
                    mean = sum(tensors) / WORKERS
                    for t in tensors:
                        t.copy_(mean)
    return {k: v.detach().clone() for k, v in replicas[0].state_dict().items()}


def worst_difference(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


def test_ranks_agree_and_match_an_independent_local_sgd(tmp_path):
    flags = [*PLAIN_SGD, "--local-steps", "4"]
    run(mpirun(WORKERS, sys.executable, HELPER, str(tmp_path), *flags,
               "--run-dir", str(tmp_path / "run")))
    rank0 = ranks_agree_with_checkpoint(tmp_path, tmp_path / "run")

    expected = simulate_local_sgd(flags, local_steps=4)
    every_step = simulate_local_sgd(flags, local_steps=1)
    assert worst_difference(rank0, expected) < 1e-6
    # The comparison can tell H apart: averaging every step ends somewhere else.
    assert worst_difference(expected, every_step) > 1e-3

    # 22 steps per epoch (1437 samples / 2 workers / 32): rounds after steps 4, 8, ..., 20 and
    # one for the last 2 steps at the epoch's end.
    epochs = records(tmp_path / "run", "epoch")
    steps = epochs[0]["step"]
    rounds = -(-steps // 4)
    assert steps % 4 and [e["averaging_rounds"] for e in epochs] == [rounds, rounds]
    [scheme] = records(tmp_path / "run", "scheme")
    assert (scheme["local_steps"], scheme["averaging_rounds"]) == (4, 2 * rounds)


def test_averaging_every_step_equals_the_distributed_optimizer(tmp_path):
    """The lr reasoning of HorovodSync.lr_scale: with plain SGD at the same scaled rate,
    averaging the parameters after every step (the simulation with H = 1) is the averaged-gradient
    step of --local-steps 1 (the DistributedOptimizer path), which logs nothing of local SGD."""
    expected = simulate_local_sgd(PLAIN_SGD, local_steps=1)
    run(mpirun(WORKERS, *hvdtrain("train", *PLAIN_SGD, "--run-dir", str(tmp_path))))
    assert worst_difference(final_model(tmp_path), expected) < 1e-6
    assert records(tmp_path, "scheme") == []
    assert all("averaging_rounds" not in e for e in records(tmp_path, "epoch"))


@pytest.mark.parametrize("extra", [
    ["--clip-grad-norm", "0.3"],  # through replica.update: each rank clips its own gradient
    ["--backward-passes-per-step", "2", "--optimizer", "adam", "--lr", "0.002"],
])
def test_options_that_compose_keep_the_ranks_identical(tmp_path, extra):
    run(mpirun(WORKERS, sys.executable, HELPER, str(tmp_path), "--epochs", "2", "--no-progress",
               "--local-steps", "3", *extra, "--run-dir", str(tmp_path / "run")))
    rank0 = torch.load(tmp_path / "rank0.pt", weights_only=True)
    rank1 = torch.load(tmp_path / "rank1.pt", weights_only=True)
    for name, tensor in rank0.items():
        assert torch.equal(tensor, rank1[name]), f"{name} differs between ranks"
    epochs = records(tmp_path / "run", "epoch")
    assert epochs[-1]["train_loss"] < epochs[0]["train_loss"]
    if "--clip-grad-norm" in extra:
        assert all(e["clipped_fraction"] > 0 for e in epochs), epochs


RESUMED = ["--no-progress", "--seed", "5"]  # with a scheme's flags, the resume tests' runs


@pytest.fixture(scope="module")
def two_epochs_of_h4(tmp_path_factory):
    """2 epochs of local SGD with H = 4, a checkpoint and an evaluation after each: the run
    that the epoch-checkpoint test resumes (a copy) and the one the run resumed from inside a
    round must end on."""
    run_dir = tmp_path_factory.mktemp("h4") / "run"
    run(mpirun(WORKERS, *hvdtrain("train", *RESUMED, "--local-steps", "4", "--epochs", "2",
                                  "--run-dir", str(run_dir))))
    return run_dir


def test_resume_from_an_epoch_checkpoint_continues_exactly(tmp_path, two_epochs_of_h4):
    """SGD with momentum: the momentum buffers stay local within an epoch and are averaged at
    its end, so the checkpoint holds what every rank continues with. The straight run writes no
    checkpoint before the end and evaluates only at the end: its epochs must still end on the
    same averages as the run that stops after epoch 2."""
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    flags = [*RESUMED, "--local-steps", "4"]
    run(mpirun(WORKERS, *hvdtrain("train", *flags, "--epochs", "4", "--checkpoint-every", "0",
                                  "--eval-every", "4", "--run-dir", str(straight))))
    shutil.copytree(two_epochs_of_h4, stopped)  # the run that stops after epoch 2
    run(mpirun(WORKERS, *hvdtrain("train", *flags, "--epochs", "4", "--resume", str(stopped))))
    a, b = final_model(straight), final_model(stopped)
    for name in a:
        assert torch.equal(a[name], b[name]), f"{name} differs after resume"
    assert [e["epoch"] for e in records(stopped, "epoch")] == [1, 2, 3, 4]


@pytest.mark.parametrize("scheme", [["--local-steps", "4"],
                                    ["--local-steps", "8", "--outer-lr", "0.7",
                                     "--outer-momentum", "0.9"]], ids=["local-sgd", "diloco"])
def test_resume_from_a_checkpoint_inside_a_round_continues_exactly(tmp_path, scheme,
                                                                   two_epochs_of_h4):
    """A step checkpoint inside a round (step 6 of rounds of 4 or 8) ends no round: it holds
    each rank's own state and the steps into the round. The run that fails at step 9 and is
    resumed from it ends with the weights of the run that never stopped (they were 0.62 apart
    when the checkpoint ended the round early). With H = 4 that run is the module's."""
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    flags = [*RESUMED, "--epochs", "2", *scheme]
    if scheme == ["--local-steps", "4"]:
        straight = two_epochs_of_h4  # these very flags
    else:
        run(mpirun(WORKERS, *hvdtrain("train", *flags, "--run-dir", str(straight))))
    failed = run(mpirun(WORKERS, *hvdtrain("train", *flags, "--run-dir", str(stopped),
                                           "--checkpoint-steps", "6", "--inject-faults",
                                           "exception:rank=0,step=9")), check=False)
    assert failed.returncode != 0
    inside = torch.load(stopped / "checkpoint.pt", weights_only=True)
    assert (inside["global_step"], inside["local_round"]["steps"]) == (6, 6 % int(scheme[1]))
    assert len(inside["local_round"]["ranks"]) == WORKERS
    run(mpirun(WORKERS, *hvdtrain("train", *flags, "--run-dir", str(stopped),
                                  "--checkpoint-steps", "6", "--auto-resume",
                                  "--inject-faults", "exception:rank=0,step=9")))
    a, b = final_model(straight), final_model(stopped)
    for name in a:
        assert torch.equal(a[name], b[name]), f"{name} differs after resume"


def test_digits_trains_to_90_percent_with_4_local_steps(tmp_path):
    run(mpirun(WORKERS, *hvdtrain("train", "--dataset", "digits", "--epochs", "10",
                                  "--local-steps", "4", "--no-progress",
                                  "--run-dir", str(tmp_path))))
    epochs = records(tmp_path, "epoch")
    assert epochs[-1]["test_acc"] >= 0.9, epochs[-1]
    assert all(e["averaging_rounds"] == 6 for e in epochs)  # 22 steps per epoch: 5 + 1


def test_a_refused_async_local_steps_combination_exits_2_under_mpirun(tmp_path):
    # --mode async --local-steps H is asynchronous DiLoCo; --pull-every has no meaning there
    proc = run(mpirun(WORKERS, *hvdtrain("train", "--mode", "async", "--local-steps", "4",
                                         "--pull-every", "2", "--run-dir", str(tmp_path))),
               check=False)
    assert proc.returncode == 2
    assert proc.stderr.count("--pull-every: invalid value 2; with --local-steps 4 every push") == 1
    assert not (tmp_path / "metrics.jsonl").exists()
