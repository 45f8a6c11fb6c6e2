"""Run hvdtrain's sync training under a launcher, then save this rank's final parameters.

Usage: train_and_dump.py OUT_DIR [hvdtrain train flags...]. Writes OUT_DIR/rank<R>.pt, so a test
can compare what every rank ended with.
"""

import sys
from pathlib import Path

import torch

from hvdtrain import launch
from hvdtrain.cli import build_parser, config_from_args
from hvdtrain.workload import workload_from_config

out = Path(sys.argv[1])
cfg = config_from_args(build_parser().parse_args(["train", *sys.argv[2:]]))
trainer = launch.run(cfg, workload_from_config(cfg)).trainer
torch.save(trainer.replica.model.state_dict(), out / f"rank{trainer.runtime.rank}.pt")
