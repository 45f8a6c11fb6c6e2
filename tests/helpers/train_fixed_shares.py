"""Run hvdtrain's --balance sync training with batch shares fixed by the test instead of measured,
so a test can compare it with one process on the same global batches.

Usage: train_fixed_shares.py SHARES [hvdtrain train flags...], SHARES such as 8,24 (one per rank,
adding up to --batch-size x ranks). Every epoch trains with them; the flags must include
--balance.
"""

import sys

from hvdtrain import launch
from hvdtrain.sync.shares import BalancedSync
from hvdtrain.cli import build_parser, config_from_args
from hvdtrain.workload import workload_from_config

SHARES = [int(s) for s in sys.argv[1].split(",")]


class FixedShares(BalancedSync):
    def __init__(self, cfg, runtime):
        super().__init__(cfg, runtime)
        assert len(SHARES) == self.num_workers and sum(SHARES) == self.global_batch, SHARES
        self.shares = list(SHARES)

    def plan(self, times):
        return list(SHARES)


launch._sync_scheme = lambda cfg: FixedShares
cfg = config_from_args(build_parser().parse_args(["train", *sys.argv[2:]]))
assert cfg.sync.balance, "pass --balance"
launch.run(cfg, workload_from_config(cfg))
