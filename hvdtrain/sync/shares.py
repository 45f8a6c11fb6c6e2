"""``--balance``: sync training whose workers take unequal shares of each global batch, in
proportion to their measured speed, so that a persistently slow worker (an older GPU, a busy
node) trains fewer samples per step instead of holding every step up.

What stays as in plain sync: the global batch (--batch-size x workers) and, at every step, the
samples in it (the epoch plan cuts the same global batch into the shares, data/builtin.py
share_batches), and the update: each worker's mean-loss gradient is weighted by its share
(rules/balance.py gradient_weight), so the average is the global batch's mean-loss
gradient, as one process computes it. What changes: at each epoch's end the shares of the next
epoch are re-planned from the epoch's step times (loop/step_times.py) by the rule in
rules/balance.py plan_shares, the one definition the simulator uses too.

Every rank plans the same shares from the same figures (see step_times_measured). The shares
go into the checkpoint; a resumed run continues with them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..config import Config, ConfigError
from ..replica import batch_length
from ..rules.balance import (FixedCost, balance_settings, equal_shares, gradient_weight,
                             plan_shares)
from ..runtime import Runtime
from ..scheme import Batches
from .horovod import HorovodSync

if TYPE_CHECKING:
    from ..loop.step_times import RankStepTimes


class BalancedSync(HorovodSync):
    """Horovod sync with batch shares that follow measured speed (see the module's docstring).

    A share is a multiple of --backward-passes-per-step (each pass gets an equal slice) and at
    least --balance-floor of the equal share, and at least one sample per pipeline
    micro-batch of each pass, so that every rank makes the same number of backward passes
    (Horovod allreduces after a fixed count of them)."""

    def __init__(self, cfg: Config, runtime: Runtime):
        super().__init__(cfg, runtime)
        self.num_workers = self.port.size
        if self.num_workers < 2:
            raise ConfigError("--balance moves samples between workers, and this run has one "
                              "process: start 2 or more (horovodrun -np 2 / mpirun -np 2), or "
                              "drop --balance")
        self.global_batch = cfg.run.batch_size * self.num_workers
        self.granularity = self.accumulation
        self.floor, self.damping = balance_settings(cfg)
        self.shares = equal_shares(self.global_batch, self.num_workers)
        # a share move smaller than an eighth of --batch-size measures noise more than a slope
        self.fixed_cost = FixedCost(min_move=max(self.granularity, -(-cfg.run.batch_size // 8)))
        self.batches = SharedBatches(self)

    def attach(self, replica) -> None:
        super().attach(replica)
        self.floor, _ = balance_settings(self.cfg, replica.model)  # now that the model is known

    def gradient_scale(self, y: Any) -> float:
        """This rank's share of the global batch, as a weight: the k backward passes over equal
        slices of the share each add 1/k of it times their mean-loss gradient, which Horovod's
        average turns into the global batch's mean-loss gradient."""
        return gradient_weight(batch_length(y), self.global_batch, self.num_workers)

    def step_times_measured(self, times: RankStepTimes, epoch: int) -> dict | None:
        """The next epoch's shares from this epoch's step times, planned by every rank on its
        own: no message. Every rank plans the same shares, because it plans from the same bits
        by the same arithmetic: the table is the epoch line's sum across workers, in which each
        figure has one worker's value and zeros from the others (x + 0.0 is x exactly, in any
        order of addition), and plan_shares is plain float arithmetic on it. (A broadcast from
        rank 0 cost about 9 ms an epoch on a busy 2-core machine, a tenth of a digits epoch.)
        The epoch line gets the shares the epoch trained with and those of the next."""
        trained = list(self.shares)
        self.shares = self.plan(times)
        return {"batch_shares": trained, "next_batch_shares": list(self.shares)}

    def plan(self, times: RankStepTimes) -> list[int]:
        """The shares for the measured samples per step and median compute time per step of
        every worker, less the step's fixed part (rules/balance.py FixedCost); the current ones
        where a worker measured no step (a resume at an epoch's end)."""
        if times.num_workers != self.num_workers or min(times.steps) < 1:
            return list(self.shares)
        per_step = [s / n for s, n in zip(times.samples, times.steps)]
        fixed = self.fixed_cost.update(per_step, times.compute_p50)
        return plan_shares(self.global_batch, per_step, times.compute_p50, self.floor,
                           self.granularity, self.damping, fixed)

    # --- checkpoints -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "batch_shares": list(self.shares)}

    def start(self, state: dict[str, Any] | None, resuming: bool) -> None:
        """As sync's start; on resume every rank takes the checkpoint's shares (rank 0 read
        them), unless they do not fit this run (another world size or batch size, or a
        checkpoint without --balance): then equal shares, as a new run starts."""
        super().start(state, resuming)
        if not resuming:
            return
        saved = self.group.broadcast_object(state.get("batch_shares") if state is not None
                                            else None)
        if saved is not None and self._fits(saved):
            self.shares = [int(s) for s in saved]
        elif self.port.rank == 0:
            why = ("it has none" if saved is None else
                   f"its shares {list(saved)} do not fit {self.num_workers} workers of "
                   f"--batch-size {self.cfg.run.batch_size}")
            print(f"hvdtrain: --balance: the checkpoint's batch shares are not used ({why}); "
                  f"starting from equal shares {self.shares}", flush=True)

    def _fits(self, shares: list[int]) -> bool:
        return (len(shares) == self.num_workers and sum(shares) == self.global_batch
                and all(s >= self.granularity and s % self.granularity == 0 for s in shares))


class SharedBatches(Batches):
    """The epoch plan's view of --balance: each epoch cut by the scheme's current shares, which
    each epoch's step times re-plan (BalancedSync.step_times_measured)."""

    def __init__(self, scheme: BalancedSync):
        self.scheme = scheme

    def batch_shares(self) -> list[int]:
        return list(self.scheme.shares)

    def step_times_measured(self, times: RankStepTimes, epoch: int) -> dict | None:
        return self.scheme.step_times_measured(times, epoch)
