"""The simulator's asynchronous DiLoCo (``adiloco`` modes: --mode async --local-steps H): virtual
workers that each take H inner steps with their own optimizer and push the round's
pseudo-gradient, and one parameter server that applies the outer step to each push as it
arrives (compare/sim/simulation.py Simulation runs it).

The server side is ServerRun's, with the real server's engine and the real outer step
(ps/shard_optimizer.py with rules/local_sgd.OuterStep); a worker's round is
ps/diloco_client.py's: the inner steps consume one batch of the job's plan each, the push lists
them, and the reply's weights are both the worker's live weights and its next round's start. An
evaluation cuts no round, as a real worker 0's inside an epoch does not; it scores the server's
weights, where a real worker 0 scores those of its last reply (ps/diloco_client.py eval_replica),
at most one round of the other workers' pushes older (evaluating costs no virtual time here).
With --dynamic-local-steps each push reports its worker's time per step and the next round takes
its share of H by the fastest worker's, as server 0 answers (_next_local_steps)."""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

import numpy as np
import torch

from ...optim import LrScale
from ...ps.dispatch import NO_SLOT
from ...ps.shard_optimizer import ShardOptimizer
from ...rules.local_sgd import dynamic_local_steps, outer_step_of
from .server_run import PushRecord, ServerRun
from .timing import _apply

if TYPE_CHECKING:
    from .workers import _Worker


class DiLoCoRun(ServerRun):
    """ServerRun whose workers push a round of H inner steps (class docstring of the module)."""

    def __init__(self, sim):  # its Simulation (simulation.py)
        super().__init__(sim)
        cfg = sim.setup.cfg
        outer = outer_step_of(cfg)
        assert outer is not None, "DiLoCoRun runs --mode async --local-steps H > 1"
        self.optimizer = ShardOptimizer(self.params, sim.chunks, cfg.optim, outer)
        self.engine.optimizer = self.optimizer  # the server's outer step
        self.local_steps, self.outer_lr = cfg.sync.local_steps, outer.lr
        self.dynamic = cfg.sync.dynamic_local_steps
        self.step_times: dict[int, float] = {}  # as server 0's: each worker's time per step
        # As DiLoCoClient.lr_scale: the inner rate over the outer step's gain.
        self.lr_scale = LrScale(self.lr_scale, outer.gain)
        for w in sim.workers:
            w.params = self.params.clone()
            w.optimizer = ShardOptimizer(w.params, sim.chunks, cfg.optim)  # the inner one
            # its pulled weights, its pushes, the slots it holds (the job's batches) and those
            # of its round under way
            w.engine = {"pulled": self.params.clone(), "pushes": 0, "queued": deque(),
                        "round": [], "local_steps": self.local_steps, "step_s": 0.0}

    # --- a worker's side --------------------------------------------------------------------------
    def _start(self, w: _Worker, at: float, first: bool = False) -> None:
        """``w`` receives the server's weights at ``at`` (its live weights and its round's
        start), then computes its next round (or is done after its last)."""
        with torch.no_grad():
            w.params.copy_(self._wire(self.params))
            w.engine["pulled"].copy_(w.params)
        w.pulled_version = self.engine.version
        self.engine.sent_params(w.rank)
        if self._out_of_work(w, first):
            self._schedule(self._last_epochs_end(w, at), w, self.DONE)
            return
        at = self._epoch_ends(w, at)
        steps = w.engine["local_steps"]
        if self.dispatcher is not None:
            w.engine["round"] = self._round(w)
            steps = len(w.engine["round"])
        timing, own = self.timing, self.timing.step_seconds
        # The round's steps, each with the straggler's delay after it (loop/hooks.py).
        start = at + sum(timing.loop_seconds + own + self.sim._delay(w, w.steps + k, own)
                         for k in range(steps))
        w.started = start
        w.engine["step_s"] = (start - at) / steps if steps else 0.0  # no push, no evaluation
        self._push_leaves(w, start)

    def _arrive(self, w: _Worker, at: float) -> None:
        slots = self._inner_steps(w)
        self.gradient = self._wire(w.engine["pulled"] - w.params).numpy()
        if self.dispatcher is not None:  # server 0 takes the listed slots, hands out as many
            for slot in slots:
                self.dispatcher.complete(slot)
            self._hand_out(w, len(slots))
        w.engine["pushes"] += 1
        self._next_local_steps(w)
        engine, version = self.engine, self.engine.version
        late = engine.is_late(w.rank)
        staleness = None if late else 0 if self.policy.lock_step else engine.staleness(w.rank)
        done = self.reply_at = self._serve(at, 0.0 if late else self.timing.apply_seconds)
        pushes = w.engine["pushes"]
        with torch.no_grad(), np.errstate(over="ignore", invalid="ignore"):  # see _gradient
            engine.on_push(w.rank, pushes, self.outer_lr, True, True, False)
        self.sim.pushes.append(PushRecord(done, w.rank, pushes, staleness,
                                          pushes - min(engine.clocks.clocks),
                                          slots[0] if slots else NO_SLOT))
        self._updated(version)
        self.sim.now = max(self.sim.now, self.free_at)

    def _inner_steps(self, w: _Worker) -> list[int]:
        """The round's inner steps of ``w`` on its own weights: one batch of the job's plan
        each (its round's slots, _round), or up to H of its own share, fewer where it runs out.
        Returns the slots it trained, in order."""
        sim = self.sim
        if self.dispatcher is None:
            steps = min(w.engine["local_steps"], sim.total_steps - w.steps)
            slots = []
        else:
            slots, w.engine["round"] = w.engine["round"], []
            steps = len(slots)
        for k in range(steps):
            if slots:
                w.slot, w.piece = slots[k], self.dispatcher.plan.locate(slots[k])
            lr = sim._lr(w.position if self.dispatcher is not None else w.steps, self.lr_scale)
            _apply(w.optimizer, sim.chunks, sim._gradient(w, w.params), lr)
        return slots

    def _next_local_steps(self, w: _Worker) -> None:
        """--dynamic-local-steps, as DiLoCoClient.push_round and server 0's answer: the push
        tells the server ``w``'s time per step over its round, the answer the fastest worker's
        it knows, and ``w``'s next round takes its share of H by them."""
        if not self.dynamic or w.engine["step_s"] <= 0:
            return
        self.step_times[w.rank] = w.engine["step_s"]
        w.engine["local_steps"] = dynamic_local_steps(self.local_steps, w.engine["step_s"],
                                                      min(self.step_times.values()))

    # --- the job's batches (server 0's dispatcher) ------------------------------------------------
    def _hand_out(self, w: _Worker, count: int = 1) -> None:
        """As server 0 answers ``w``: ``count`` slots, as many as the round it pushed trained
        (ps/slot_waiters.hand_out), behind those it still holds."""
        queued = w.engine["queued"]
        for _ in range(count):
            slot = self.dispatcher.take(w.rank)
            if slot == NO_SLOT:
                break
            queued.append(slot)
        self._front(w)
        if self.dispatcher.finished_pushing(w.rank):  # as server 0: nobody waits for its clock
            self.engine.on_finished(w.rank)

    def _round(self, w: _Worker) -> list[int]:
        """The slots of ``w``'s round, at its start: up to H, those it holds first, then one
        at a time from server 0 as a real worker's empty queue asks (SlotFeed.fetch). Worker
        0's round ends with its epoch where that epoch's end reads the model (DiLoCoClient
        eval_replica and state_dict push the round under way); the others' rounds go on into
        the next epoch, as theirs do."""
        queued, plan = w.engine["queued"], self.dispatcher.plan
        epoch = plan.locate(queued[0])[0]
        ends_with_epoch = w.rank == 0 and self._reads_model(epoch)
        slots: list[int] = []
        while len(slots) < w.engine["local_steps"]:
            if not queued:
                slot = self.dispatcher.take(w.rank)
                if slot == NO_SLOT:
                    break
                queued.append(slot)
            if ends_with_epoch and plan.locate(queued[0])[0] != epoch:
                break
            slots.append(queued.popleft())
        self._front(w)
        return slots

    def _front(self, w: _Worker) -> None:
        """``w.slot``: the next slot ``w`` trains, the front of those it holds (NO_SLOT: none)."""
        queued = w.engine["queued"]
        w.slot = queued[0] if queued else NO_SLOT
        w.piece = None if w.slot == NO_SLOT else self.dispatcher.plan.locate(w.slot)
