"""hvdtrain's training step against a hand-written Horovod loop, A/B inside one job.

Separate launches on a shared 2-core machine differ by +-20% from one minute to the next, which
hides a 3% difference. Here both run in the same processes, with the same Horovod context and
settings (hvdtrain's), the same data and the same model shape, alternating in blocks of 50 steps:
slow drift of the machine hits both alike. Run under horovodrun or mpirun.
"""

import json
import statistics
import sys
import tempfile

import torch

import horovod.torch as hvd
from common import plain_horovod_block
from hvdtrain import launch
from hvdtrain.cli import build_parser, config_from_args
from hvdtrain.models import build_model
from hvdtrain.scheme import Progress
from hvdtrain.sync.horovod import gradient_groups
from hvdtrain.workload import workload_from_config

ROUNDS, STEPS, BATCH = int(sys.argv[1]), 50, 64
with tempfile.TemporaryDirectory() as run_dir:
    cfg = config_from_args(build_parser().parse_args([
        "train", "--dataset", "synthetic", "--synthetic-shape", "1024",
        "--synthetic-samples", "16384", "--hidden", "1024,1024", "--batch-size", str(BATCH),
        "--epochs", str(ROUNDS + 1), "--max-steps-per-epoch", str(STEPS), "--lr", "0.01",
        "--eval-every", "1000", "--no-progress", "--run-dir", run_dir]))
    workload = workload_from_config(cfg)
    torch.manual_seed(cfg.run.seed)
    trainer = launch.prepare_sync(cfg, workload, workload.build_model())  # hvd.init, settings
    trainer.scheme.attach(trainer.replica)
    trainer.scheme.start(None, resuming=False)

    def hvdtrain_epoch(epoch: int) -> float:
        trainer.progress = Progress(epoch=epoch, workers=hvd.size())
        trainer._train_epoch()
        return trainer.history[-1].samples_per_sec

    # The plain loop, as in Horovod's pytorch_mnist example, on a second copy of the model,
    # with the trainer's gradient grouping.
    plain_block = plain_horovod_block(hvd, build_model("mlp", (1024,), 10, cfg.model),
                                      workload.train.x, workload.train.y, BATCH, STEPS, "plain",
                                      gradient_groups(trainer.scheme.runtime))

    hvdtrain_epoch(0)  # warm up both
    plain_block()
    ratios = []
    for r in range(ROUNDS):
        if r % 2:  # alternate which goes first
            theirs = plain_block()
            ours = hvdtrain_epoch(r + 1)
        else:
            ours = hvdtrain_epoch(r + 1)
            theirs = plain_block()
        ratios.append(ours / theirs)
    if hvd.rank() == 0:
        print("AB " + json.dumps({"world_size": hvd.size(), "ratios": ratios,
                                  "median": statistics.median(ratios)}), flush=True)
