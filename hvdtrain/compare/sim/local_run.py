"""The simulator's local SGD and DiLoCo modes (--local-steps H): every virtual worker runs the real
rounds, engines/local_rounds.py LocalRounds, the class the Horovod and torch.distributed schemes
run, on the virtual collective (collective.py). Each worker steps its own weights with its own
optimizer (the server's ShardOptimizer, the same arithmetic as torch's), at sync's rate over the
rule's gain (optim.py LrScale); the engine decides when a round averages them
(every H steps) and what it averages (the parameters, or DiLoCo's pseudo-gradients and outer
step). As a real run's loop does, the simulator asks for a round at an epoch's end (the model and
the optimizer state) and, under plain averaging, wherever an evaluation reads the model; DiLoCo's
evaluation inside a round scores the model the workers agreed on at its start, at that moment,
and the round goes on (sync/local_rounds_scheme.py eval_replica).

A round lasts as long as its slowest worker's steps, then one allreduce (whatever it carries)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...engines.local_rounds import LocalRounds, rule_for_wire
from ...optim import LrScale
from ...ps.shard_optimizer import ShardOptimizer
from ...rules.wire_dtype import narrow_dtype
from .virtual_collective import VirtualCluster
from .timing import _apply

if TYPE_CHECKING:
    from .workers import _Worker


class LocalRun:
    """Local SGD or DiLoCo training of ``sim``'s workers, one LocalRounds engine each. ``sim``:
    the Simulation (simulation.py, which imports this module, so its type is not named here)."""

    def __init__(self, sim):
        self.sim = sim
        cfg = sim.setup.cfg
        self.cluster = VirtualCluster(sim.num_workers)
        for w in sim.workers:
            w.params = sim.setup.model.flat.clone()
            w.optimizer = ShardOptimizer(w.params, sim.chunks, cfg.optim)
            wire = narrow_dtype(cfg.ps.wire_dtype)  # rounded as the real rounds round
            rule = rule_for_wire([w.params], cfg.sync.outer_lr, cfg.sync.outer_momentum, wire)
            w.engine = LocalRounds(self.cluster.port(w.rank), rule, sim.mode.local_steps,
                                   parameters=lambda w=w: [("flat", w.params)],
                                   optimizer_state=lambda w=w: list(w.optimizer.vectors.items()),
                                   wire=wire)
            w.engine.start()
        self.lr_scale = LrScale(sim.num_workers, rule.gain)
        self.busy = [0.0] * sim.num_workers  # each worker's seconds since the last round

    def run(self) -> None:
        sim = self.sim
        engine = sim.workers[0].engine
        try:
            for step in range(sim.total_steps):
                rounds = engine.rounds_total
                lr = sim._lr(step, self.lr_scale)
                self.cluster.run(lambda rank: self._step(sim.workers[rank], step, lr))
                epoch_end = (step + 1) % sim.steps_per_epoch == 0
                if epoch_end:  # as the trainer's epoch_done: the model and the optimizer state
                    self.cluster.run(lambda rank: sim.workers[rank].engine.share_everything())
                elif sim._due(step + 1):  # as an evaluation's eval_replica
                    chosen = self.cluster.run(
                        lambda rank: sim.workers[rank].engine.model_to_score())[0]
                    if chosen is not None:  # scored where the round stands, which goes on
                        _, (agreed,) = chosen  # the flat vector; no buffers here
                        sim._maybe_evaluate(sim.now + max(self.busy), agreed)
                if engine.rounds_total != rounds:
                    self._round_ended()
        finally:
            self.cluster.close()
        sim._finish(sim.workers[0].params)

    def _step(self, w: _Worker, step: int, lr: float) -> None:
        """Worker ``w``'s own optimizer step, on its thread; the engine may end a round."""
        sim, own = self.sim, self.sim.timing.step_seconds
        grad = sim._gradient(w, w.params)
        _apply(w.optimizer, sim.chunks, grad, lr)
        self.busy[w.rank] += sim.timing.loop_seconds + own + sim._delay(w, step, own)
        w.engine.stepped()

    def _round_ended(self) -> None:
        sim = self.sim
        exchange = sim.timing.average_seconds(sim.message_bytes, sim.num_workers)
        seconds = max(self.busy) + exchange
        self.busy = [0.0] * sim.num_workers
        sim.round_seconds.append(seconds)
        sim.now += seconds
        sim._changed = True
        sim._maybe_evaluate(sim.now, sim.workers[0].params)
