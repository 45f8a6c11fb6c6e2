"""Two ranks whose collectives diverge: rank 1 reduces a tensor that rank 0 never submits.
With hvdtrain's stall check (--stall-timeout-s) this must end in an error, not a hang."""

import sys
import time

import torch

from hvdtrain.config import Config
from hvdtrain.runtime import start_horovod

cfg = Config.from_overrides({"stall_timeout_s": float(sys.argv[1])}).validate()
start_horovod(cfg.run, cfg.sync)
import horovod.torch as hvd  # noqa: E402

hvd.allreduce(torch.ones(1), name="everyone")
if hvd.rank() == 1:
    hvd.allreduce(torch.ones(1), name="only.rank.1")  # rank 0 never joins this one
    print("rank 1: the diverged allreduce returned", flush=True)
else:
    time.sleep(120)  # rank 0 has wandered off (a bug, a stuck data loader...)
