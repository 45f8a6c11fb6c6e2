"""Run hvdtrain's sync training under a launcher, then save this rank's final parameters.

Usage: train_and_dump.py OUT_DIR [hvdtrain train flags...]. Writes OUT_DIR/rank<R>.pt, so a test
can compare what every rank ended with.
"""

import sys
from pathlib import Path

import torch

from hvdtrain.cli import build_parser, config_from_args, prepare_sync

out = Path(sys.argv[1])
cfg = config_from_args(build_parser().parse_args(["train", *sys.argv[2:]]))
trainer = prepare_sync(cfg)
trainer.fit()
torch.save(trainer.replica.model.state_dict(), out / f"rank{trainer.runtime.rank}.pt")
