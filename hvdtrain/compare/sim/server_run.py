"""The simulator's async modes: virtual workers and one parameter server as events on a virtual
clock (compare/sim/simulation.py Simulation runs it)."""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ...ps.dispatch import NO_SLOT, BatchDispatcher, SlotPlan
from ...ps.shard_optimizer import ShardOptimizer
from ...rules.accumulator import RoundSum
from ...rules.clocks import Versions, WorkerClocks
from ...rules.registry import server_rules
from ...rules.statistics import RuleStatistics
from ...stragglers import _uniform

if TYPE_CHECKING:
    from .simulation import Simulation
    from .workers import _Worker


@dataclass(slots=True)
class PushRecord:
    """One gradient as the server saw it (async modes): for tests and for a look inside."""

    time: float            # when the server was done with it
    worker: int
    clock: int             # the worker's pushes, this one included
    staleness: int | None  # None: dropped (a late backup worker's gradient)
    ahead: float           # clock minus the slowest running worker's clock (SSP bounds it)
    slot: int = NO_SLOT    # the batch of the job's plan it carried (ps/dispatch.py); NO_SLOT
                           # under fixed shares: batch clock - 1 of its worker's own share


class ServerRun:
    """The async modes: workers and one parameter server as events on a virtual clock.

    A worker's step ends with its push; the gradient reaches the server ``push_seconds``
    later, and the server, a queue, takes ``apply_seconds`` per gradient in arrival order.
    The reply carries the weights right after that update (the server streams them back);
    then the worker sleeps its straggler delay (after the step, as loop/hooks.py does) and
    computes its next step on those weights.

    What a push does is the real server's rules (rules/registry.server_rules on the run's
    Config): the same round policy, apply step, round sum and statistics objects. The policy
    also says whether the workers keep fixed shares or take the job's batches (fixed_shares)."""

    ARRIVE, DONE = 0, 1

    def __init__(self, sim: Simulation):
        self.sim = sim
        self.timing = sim.timing
        cfg = sim.setup.cfg
        self.params = sim.setup.model.flat.clone()  # the server's weights
        self.optimizer = ShardOptimizer(self.params, sim.chunks, cfg.optim)
        rules = server_rules(cfg.ps, sim.num_workers)
        self.policy, self.step = rules.policy, rules.step
        self.clocks, self.versions = WorkerClocks(sim.num_workers), Versions(sim.num_workers)
        self.stats = RuleStatistics(sim.staleness)
        self.round = RoundSum(self.params.numel()) if self.policy.lock_step else None
        self.round_lr = 0.0  # the server steps with the last pusher's rate
        self.free_at = 0.0                          # when the server finishes its queue
        self.held: dict[int, _Worker] = {}          # replies held back (SSP) or in a round (BSP)
        # As ps/client.py: a round averages N-b gradients, so it takes N-b times the rate; an
        # asynchronous update applies one worker's gradient alone.
        self.lr_scale = self.policy.lr_scale(sim.num_workers)
        self.events: list[tuple[float, float, int, int]] = []
        # As client.batch_feed, the round policy says: the job's plan handed out to whoever
        # asks, as server 0 does (ps/dispatch.py), under async and backup workers; plain --bsp
        # keeps each worker's own share.
        self.dispatcher = None if self.policy.fixed_shares else BatchDispatcher(SlotPlan(
            sim.steps_per_epoch, sim.num_workers, cfg.run.epochs))

    def run(self) -> None:
        for w in self.sim.workers:
            self._reply(w, 0.0, first=True)
        while self.events:
            at, _, rank, kind = heapq.heappop(self.events)
            w = self.sim.workers[rank]
            if kind == self.ARRIVE:
                self._arrive(w, at)
            else:
                self._done(w, at)
        self.sim._finish(self.params)

    def _schedule(self, at: float, w: _Worker, kind: int) -> None:
        # Requests at the same virtual time (workers without random delays finish their steps
        # together) reach a real server in an order that jitter decides: a seeded draw per
        # (worker, step) here, so that no rank is always last, which with backup workers
        # would drop the same shard of the data every round.
        tie = _uniform("tie", self.sim.seed, w.rank, w.steps)
        heapq.heappush(self.events, (at, tie, w.rank, kind))

    def _serve(self, arrived: float, seconds: float) -> float:
        """The server takes the request that arrived at ``arrived`` when it is free; returns
        when it is done with it."""
        self.free_at = max(arrived, self.free_at) + seconds
        return self.free_at

    # --- a worker's side --------------------------------------------------------------------------
    def _reply(self, w: _Worker, at: float, first: bool = False) -> None:
        """``w`` receives the server's weights at ``at``, sleeps its delay, starts its next
        step (or is done after its last)."""
        w.params = self.params.clone()
        w.pulled_version = self.versions.version
        self.versions.received(w.rank)  # every reply here is a push's, with the weights
        self.versions.replied_to_push(w.rank)
        self.step.received(w.rank, self.params.numpy())
        start = at
        if not first:  # the straggler stretches the step's compute, not the wait for the reply
            start += self.sim._delay(w, w.steps - 1, self.timing.step_seconds)
        if self.dispatcher is not None and first:
            self._hand_out(w)
        if (w.slot == NO_SLOT if self.dispatcher is not None else
                w.steps == self.sim.total_steps):
            self._schedule(start, w, self.DONE)
            return
        start += self.timing.loop_seconds  # the loop's time before the update begins
        w.started = start
        self._schedule(start + self.timing.step_seconds + self.timing.push_seconds, w,
                       self.ARRIVE)

    # --- the server's side ------------------------------------------------------------------------
    def _hand_out(self, w: _Worker) -> None:
        w.slot = self.dispatcher.take(w.rank)
        w.piece = None if w.slot == NO_SLOT else self.dispatcher.plan.locate(w.slot)
        if self.dispatcher.finished_pushing(w.rank):  # as server 0: nobody waits for its clock
            self.clocks.finished.add(w.rank)

    def _arrive(self, w: _Worker, at: float) -> None:
        # The worker's schedule, in its header: its own steps, or the job's position when it
        # trains the job's batches (async, backup workers).
        lr = self.sim._lr(w.position if self.dispatcher is not None else w.steps, self.lr_scale)
        grad = self.sim._gradient(w, w.params)
        slot = w.slot
        if self.dispatcher is not None:  # server 0 takes the push's slot, hands out the next
            self.dispatcher.complete(slot)
            self._hand_out(w)
        self.stats.pushed(True)
        self.clocks.push(w.rank, w.steps)
        if self.policy.lock_step:
            self._arrive_in_round(w, at, grad.numpy(), lr, slot)
        else:
            self._apply_now(w, at, grad.numpy(), lr, slot)
            self.sim._maybe_evaluate(self.free_at, self.params)
        self.sim.now = max(self.sim.now, self.free_at)

    def _apply_now(self, w: _Worker, at: float, grad: np.ndarray, lr: float,
                   slot: int) -> None:
        """ps/pushes.py AsyncPushes: the policy's reply, the apply step (staleness weight,
        DC-ASGD), the update."""
        reply_now = self.policy.may_reply(self.clocks, w.rank)
        staleness = self.versions.staleness(w.rank)
        lr, factor = self.step.rate(lr, staleness)
        self.stats.applied(staleness, factor)
        with np.errstate(over="ignore", invalid="ignore"):  # a diverging run: see _gradient
            self.step.apply_all(self.optimizer, grad, lr, worker=w.rank)
        self.versions.updated()
        self.sim._changed = True
        done = self._serve(at, self.timing.apply_seconds)
        self._record(w, done, staleness, slot)
        if reply_now:
            self._reply(w, done)
        else:
            self.held[w.rank] = w
        self._release(done)

    def _release(self, at: float) -> None:
        """SSP: reply to the held-back workers that may now go on (AsyncPushes.release)."""
        for rank in self.policy.released(self.clocks, list(self.held)):
            self._reply(self.held.pop(rank), at)

    def _arrive_in_round(self, w: _Worker, at: float, grad: np.ndarray, lr: float,
                         slot: int) -> None:
        """--bsp: a gradient computed on this round's weights joins the round; one computed on
        older weights (a late backup worker's) is dropped, and its worker goes on at once
        from the current weights."""
        if self.policy.is_late(self.versions, w.rank):
            done = self._serve(at, 0.0)
            self.stats.dropped()
            self._record(w, done, None, slot)
            self._reply(w, done)
            return
        done = self._serve(at, self.timing.apply_seconds)  # adding it into the round's sum
        self._record(w, done, 0, slot)
        self.round.add(0, grad.size, grad)
        self.round.join(True)
        self.round_lr = lr
        self.held[w.rank] = w
        self._maybe_close_round(done)

    def _maybe_close_round(self, at: float) -> None:
        """The round closes when the policy says (RoundPushes: its quorum of pushes)."""
        if not self.policy.closes(self.clocks, self.round.pushes):
            return
        self.stats.round_closed(self.round.gradients)
        self.step.apply_all(self.optimizer, self.round.mean(), self.round_lr)
        self.versions.updated()
        self.sim._changed = True
        self.round.clear()
        done = self._serve(at, self.timing.apply_seconds)
        held, self.held = self.held, {}
        for w in held.values():
            self._reply(w, done)
        self.sim._maybe_evaluate(done, self.params)  # the weights change at round ends only

    def _done(self, w: _Worker, at: float) -> None:
        """The worker has taken its last step: it no longer holds anyone back."""
        self.clocks.done(w.rank)
        served = max(at, self.free_at)
        if self.policy.lock_step:
            self._maybe_close_round(served)
        else:
            self._release(served)
        self.sim.now = max(self.sim.now, at, self.free_at)

    def _record(self, w: _Worker, at: float, staleness: int | None, slot: int) -> None:
        self.sim.pushes.append(PushRecord(at, w.rank, w.steps, staleness,
                                          w.steps - min(self.clocks.clocks), slot))
