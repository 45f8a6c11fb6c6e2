"""The simulator's virtual workers: each one's batches, random state and (where it trains apart)
weights and optimizer."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from ...loop.epoch_plan import EpochPlan
from ...ps.dispatch import NO_SLOT
from ...ps.shard_optimizer import ShardOptimizer
from ...scheme import Progress


@dataclass
class _Worker:
    rank: int
    plan: EpochPlan
    steps: int = 0                        # steps taken: the global_step of a real worker
    batches: Iterator | None = None
    rng: torch.Tensor | None = None       # its own torch generator state (dropout and the like)
    params: torch.Tensor | None = None    # async and local SGD: its own copy of the weights
    pulled_version: int = 0               # async: the server's version it last received
    optimizer: ShardOptimizer | None = None  # local SGD: its own optimizer state
    engine: Any = None                    # sync, local SGD: the scheme's engine it runs
    started: float = 0.0                  # virtual time its current step began
    piece: tuple[int, int, int] | None = None  # the job's batches: the piece of the plan it holds
    slot: int = NO_SLOT                   # ... and its slot number
    position: int = 0                     # ... the job's global step after its last piece
    _pieces: list = field(default_factory=list)  # ... fed to its batch source
    _piece_batches: Iterator | None = None
    _seeded_epoch: int = -1

    def next_batch(self):
        """The batch a real worker of this rank trains on at its next step: its own share's
        next one, or the piece of the job's plan it was handed (async, backup workers:
        ps/dispatch.py)."""
        if self.piece is not None:
            return self._piece_batch()
        per_epoch = self.plan.steps_per_epoch
        if self.steps % per_epoch == 0:  # an epoch begins; the plan seeds torch as a real one does
            self.batches = self.plan.batches(Progress(epoch=self.steps // per_epoch,
                                                      global_step=self.steps,
                                                      workers=self.plan.num_workers))
        batch = next(self.batches)
        self.rng = torch.get_rng_state()  # the plan seeded the step (EpochPlan.seed_step)
        return batch

    def _piece_batch(self):
        epoch, step, _ = self.piece
        if epoch != self._seeded_epoch:  # as EpochPlan.batches seeds a real worker's epoch
            self.plan.seed_epoch(epoch)
            self.rng, self._seeded_epoch = torch.get_rng_state(), epoch
        if self._piece_batches is None:
            run = self.plan.run
            pieces = iter(lambda: self._pieces.pop(0), None)  # read lazily, one at a time
            self._piece_batches = self.plan.source.part_batches(pieces, self.plan.num_workers,
                                                                run.batch_size, run.seed)
        self._pieces.append(self.piece)
        self.position = max(self.position, epoch * self.plan.steps_per_epoch + step + 1)
        return next(self._piece_batches)

