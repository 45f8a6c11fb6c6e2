"""The simulator's sync modes (sync, balanced): every virtual worker runs the real sync step,
engines/sync_step.py SyncStep, the class the Horovod and torch.distributed schemes run, on the
virtual collective (collective.py). Each worker holds its own weights and torch optimizer; the
step's gradient is averaged across the workers (summed in rank order, over N), clipped, and
stepped at lr * N by every worker alike, so all hold the same weights, as real sync workers do.

The round's time is sync's clock, share_clock.py: the slowest worker's step and the allreduce;
mode balanced trains the same rounds (its share-weighted gradient is the global batch's, as
sync's average is) and only its clock's shares differ."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from ...engines.sync_step import SyncStep
from ...flat_views import shaped_views
from ...optim import build_optimizer, set_learning_rate
from ...rules.balance import balance_settings
from ..share_clock import ShareClock
from .virtual_collective import VirtualCluster

if TYPE_CHECKING:
    from .workers import _Worker


class FlatLearner:
    """One virtual worker's model and optimizer as the sync engine steps them
    (engines/sync_step.py Learner): its own weights (``params``, one flat vector, and ``views``
    of it shaped as the model's parameters) and its own torch optimizer over the views, computed
    on the one real replica that every virtual worker loads its weights into."""

    def __init__(self, sim, worker: _Worker):
        self.sim, self.worker, self.model = sim, worker, sim.setup.model
        self.params = self.model.flat.clone()
        self.views = shaped_views(self.params, self.model.params)
        self.optimizer = build_optimizer(self.views, sim.setup.cfg.optim)

    def zero_grad(self) -> None:
        for p in self.model.params:
            p.grad = None

    def forward_backward(self, x: Any, y: Any, grad_scale: float) -> Any:
        """This worker's pass on its own weights, with its own random state."""
        w = self.worker
        self.model.flat.copy_(self.params)
        torch.set_rng_state(w.rng)
        stats = self.model.replica.forward_backward(x, y, grad_scale=grad_scale)
        w.rng = torch.get_rng_state()
        return stats

    def gradients_of(self) -> list[torch.Tensor]:
        """The replica's gradients, handed to this worker's own parameters (the next worker's
        pass on the replica makes new ones)."""
        for view, p in zip(self.views, self.model.params):
            view.grad, p.grad = p.grad, None
        return self.views

    def apply(self) -> None:
        """--clip-grad-norm on the averaged gradient (as precision.Precision.update does), then
        the optimizer's step."""
        clip = self.model.clip_grad_norm
        if clip > 0:
            torch.nn.utils.clip_grad_norm_([v for v in self.views if v.grad is not None], clip)
        self.optimizer.step()


class SyncRun:
    """Sync training of ``sim``'s workers; each round is one SyncStep on every worker. ``sim``:
    the Simulation (simulation.py, which imports this module, so its type is not named here)."""

    def __init__(self, sim):
        self.sim = sim
        cfg = sim.setup.cfg
        # Horovod's --compression fp16 rounds what the allreduce carries (each gradient, each
        # sum); the link model prices its bytes (link.py), and this its effect on training
        self.cluster = VirtualCluster(sim.num_workers, torch.float16
                                      if cfg.sync.compression == "fp16" else None)
        self.learners = [FlatLearner(sim, w) for w in sim.workers]
        for w, learner in zip(sim.workers, self.learners):
            w.engine = SyncStep(self.cluster.port(w.rank), learner,
                                cfg.sync.backward_passes_per_step)
        floor, damping = balance_settings(cfg, sim.setup.model.replica.model)  # as a real run
        # The straggler hook of a real worker is given its step's compute time, without the
        # wait for the allreduce (scheme.take_wait_seconds), and its samples.
        sim.clock = ShareClock(sim.timing, cfg.run.batch_size, sim.num_workers,
                               lambda rank, step, seconds, work: sim._delay(
                                   sim.workers[rank], step, seconds, work),
                               balance=sim.mode.balance,
                               granularity=cfg.sync.backward_passes_per_step, floor=floor,
                               damping=damping, message_bytes=sim.message_bytes)

    def run(self) -> None:
        sim = self.sim
        weights = self.learners[0].params  # every worker's, as every worker holds the same
        try:
            for step in range(sim.total_steps):
                lr = sim._lr(step, sim.num_workers)
                self.cluster.run(lambda rank: self._step(rank, lr))
                seconds = sim.clock.round_seconds(step)
                if (step + 1) % sim.steps_per_epoch == 0:
                    sim.clock.epoch_ended()  # --balance re-plans the shares here
                sim.round_seconds.append(seconds)
                sim.now += seconds
                sim._changed = True
                sim._maybe_evaluate(sim.now, weights)
        finally:
            self.cluster.close()
        sim._finish(weights)

    def _step(self, rank: int, lr: float) -> None:
        """Worker ``rank``'s step, on its thread: its next batch through the sync engine."""
        w, learner = self.sim.workers[rank], self.learners[rank]
        x, y = w.next_batch()
        set_learning_rate(learner.optimizer, lr)
        stats = w.engine.step(x, y)
        self.sim._counted(w, stats.loss_sum.item(), stats.count, float(stats.loss_weight))
