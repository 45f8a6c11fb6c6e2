"""--balance against equal shares, A/B inside one job: epochs alternate between equal shares
(odd epochs: plain sync's batches, weights 1) and the balanced shares planned from the latest
epoch's step times (even epochs), in the same processes, so that a burst of load from other jobs
on a shared machine hits adjacent epochs alike. Run under mpirun with hvdtrain train flags
(include --balance); scripts/bench_balance.py --within-job reads the epoch lines.

Each epoch line gets ``ab``: "plain" or "balanced", what that epoch trained with. The balanced
shares are re-planned from the balanced epochs' step times only (and the first epoch's), as a
--balance run re-plans from its own epochs, with the same damping and floor.
"""

import sys

from hvdtrain import launch
from hvdtrain.sync.shares import BalancedSync
from hvdtrain.cli import build_parser, config_from_args
from hvdtrain.rules.balance import equal_shares
from hvdtrain.workload import workload_from_config


class Alternating(BalancedSync):
    def __init__(self, cfg, runtime):
        super().__init__(cfg, runtime)
        self.equal = equal_shares(self.global_batch, self.num_workers)

    def step_times_measured(self, times, epoch):  # epoch counts from 1; odd ones are plain
        trained = list(self.shares)
        if epoch == 1 or epoch % 2 == 0:
            self.balanced = self.plan(times)
        self.shares = self.balanced if epoch % 2 == 1 else list(self.equal)
        return {"batch_shares": trained, "ab": "balanced" if epoch % 2 == 0 else "plain"}


launch._sync_scheme = lambda cfg: Alternating
cfg = config_from_args(build_parser().parse_args(["train", *sys.argv[1:]]))
assert cfg.sync.balance, "pass --balance"
launch.run(cfg, workload_from_config(cfg))
