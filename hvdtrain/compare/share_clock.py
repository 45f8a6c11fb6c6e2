"""The simulator's clock of sync rounds (compare/sim/): how long a round lasts when each
worker computes its share of the global batch, and, for mode ``balanced`` (--balance), how the
shares follow the workers' speed.

A balanced round's arithmetic is sync's: the share-weighted combination of the workers'
gradients is the global batch's gradient (rules/balance.gradient_weight), and the global batch
is the same. Only time differs, so the simulator trains a balanced run with sync's arithmetic and
this clock. The shares start equal and are re-planned at every epoch's end by the one
definition, rules/balance.plan_shares, from each worker's median compute time of the epoch, as
the real run re-plans from its step times (loop/step_times.py: the compute time includes the
straggler's delay, which the step timer counts as compute)."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..rules.balance import FixedCost, equal_shares, plan_shares

if TYPE_CHECKING:
    from .sim.timing import Timing

# (worker, global step, a whole --batch-size step's compute seconds, samples / --batch-size)
# -> the seconds the straggler model makes it wait (StragglerModel.delay's arguments)
Delay = Callable[[int, int, float, float], float]


class ShareClock:
    """Sync rounds on the virtual clock. A worker's step computes its share in
    ``Timing.compute_seconds`` and then waits its straggler delay for that work; a round lasts
    the loop's own time, the slowest worker's step, and the allreduce. With ``balance`` the
    shares are re-planned at each :meth:`epoch_ended`; ``plans`` keeps every epoch's shares.
    ``floor`` and ``damping``: plan_shares' (None: its defaults; the simulator passes the run's,
    rules/balance.balance_settings). ``message_bytes``: the gradient's bytes, which a
    Timing.link prices."""

    def __init__(self, timing: Timing, batch_size: int, workers: int, delay: Delay,
                 balance: bool = False, granularity: int = 1, floor: int | None = None,
                 damping: float | None = None, message_bytes: float = 0.0):
        self.timing, self.batch_size, self.delay = timing, batch_size, delay
        self.exchange_seconds = timing.average_seconds(message_bytes, workers)  # the allreduce
        self.balance, self.granularity = balance, granularity
        self.options = {k: v for k, v in (("floor", floor), ("damping", damping))
                        if v is not None}
        self.global_batch = batch_size * workers
        self.shares = equal_shares(self.global_batch, workers)
        self.plans: list[list[int]] = [list(self.shares)]
        self._compute: list[list[float]] = [[] for _ in range(workers)]
        # as the real run plans (sync/shares.py): the step's fixed part learned from the epochs
        self.fixed_cost = FixedCost(min_move=max(granularity, -(-batch_size // 8)))

    def round_seconds(self, step: int) -> float:
        """The duration of global step ``step``'s round (counted from 0)."""
        busy = []
        full = self.timing.compute_seconds(self.batch_size, self.batch_size)
        for worker, share in enumerate(self.shares):
            compute = self.timing.compute_seconds(share, self.batch_size)
            # a factor stretches the share's samples at a full step's pace per sample (as the
            # real hook does, loop/hooks.py Straggler)
            own = compute + self.delay(worker, step, full, share / self.batch_size)
            self._compute[worker].append(own)
            busy.append(own)
        return self.timing.loop_seconds + max(busy) + self.exchange_seconds

    def epoch_ended(self) -> None:
        """--balance: the next epoch's shares, from this epoch's median compute times."""
        if self.balance and all(self._compute):
            p50 = [statistics.median(seconds) for seconds in self._compute]
            fixed = self.fixed_cost.update(self.shares, p50)
            self.shares = plan_shares(self.global_batch, self.shares, p50,
                                      granularity=self.granularity, fixed=fixed, **self.options)
            self.plans.append(list(self.shares))
        self._compute = [[] for _ in self._compute]
