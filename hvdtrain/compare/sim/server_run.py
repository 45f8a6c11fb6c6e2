"""The simulator's async modes: virtual workers and one parameter server as events on a virtual
clock (compare/sim/simulation.py Simulation runs it)."""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ...engines.server_engine import ServerEngine
from ...loop.checkpointer import checkpoint_due
from ...ps.dispatch import NO_SLOT, BatchDispatcher, SlotPlan
from ...ps.shard_optimizer import ShardOptimizer
from ...rules.registry import server_rules
from ...rules.wire_dtype import narrow_dtype
from ...stragglers import _uniform
from .link import SharedLink

if TYPE_CHECKING:  # not the Simulation, which imports this module
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
    computes its next step on those weights. With a ``Timing.link`` the push and the reply
    each cross the server's link instead (link.py SharedLink: one queue, pushes and replies
    alike, in turn, each overlapping the one in flight the other way for a share of it), and
    ``push_seconds`` is not charged.

    What a push does is the real server's engine (engines/server_engine.py ServerEngine, the same
    class) with the run's rules (rules/registry.server_rules on its Config); this class is its
    ServerPort, which keeps the virtual time. The policy also says whether the workers keep
    fixed shares or take the job's batches (fixed_shares)."""

    ARRIVE, DONE, SEND = 0, 1, 2

    def __init__(self, sim):  # its Simulation (simulation.py)
        self.sim = sim
        self.timing = sim.timing
        cfg = sim.setup.cfg
        self.params = sim.setup.model.flat.clone()  # the server's weights
        self.optimizer = ShardOptimizer(self.params, sim.chunks, cfg.optim)
        rules = server_rules(cfg.ps, sim.num_workers, cfg.sync.local_steps)
        self.policy = rules.policy
        self.engine = ServerEngine(rules, sim.num_workers, self.optimizer, self,
                                   staleness=sim.staleness)
        self.free_at = 0.0   # when the server finishes its queue
        self.reply_at = 0.0  # when the replies the engine sends now reach their workers
        self.gradient: np.ndarray | None = None  # the push being served
        # As ps/client.py: a round averages N-b gradients, so it takes N-b times the rate; an
        # asynchronous update applies one worker's gradient alone.
        self.lr_scale = self.policy.lr_scale(sim.num_workers)
        self.events: list[tuple[float, float, int, int]] = []
        link = self.timing.server_link or self.timing.link
        # the pushes and the replies: one link, as the server takes one message at a time
        self.inbound = self.outbound = SharedLink(link) if link else None
        self.beside = frozenset(self.timing.beside_server) if link else frozenset()
        self.lead_epoch = 0  # the epoch of the batch worker 0 holds (_end_epochs)
        # As the async workers' batch feed (ps/async_group.py JobBatches), the round policy
        # says: the job's plan handed out to whoever asks, as server 0 does (ps/dispatch.py),
        # under async and backup workers; plain --bsp keeps each worker's own share.
        self.dispatcher = None if self.policy.fixed_shares else BatchDispatcher(SlotPlan(
            sim.steps_per_epoch, sim.num_workers, cfg.run.epochs))
        sim.lead_ends_epochs = self.dispatcher is not None

    def run(self) -> None:
        for w in self.sim.workers:
            self._start(w, 0.0, first=True)
        while self.events:
            at, _, rank, kind = heapq.heappop(self.events)
            w = self.sim.workers[rank]
            if kind == self.ARRIVE:
                self._arrive(w, at)
            elif kind == self.SEND:  # the push leaves the worker; the link says when it lands
                self._send(w, at)
            else:
                self._done(w, at)
        self.sim._finish(self.params)

    def _send(self, w: _Worker, at: float) -> None:
        """``w``'s push leaves it at ``at`` over the server's link and arrives when its bytes
        have landed. The server serves others meanwhile: a real one takes a slow link's
        gradient in the background (ps/arrivals.py), one at a time, as the link carries them."""
        self._schedule(self.inbound.send(at, self.sim.message_bytes, toward_server=True), w,
                       self.ARRIVE)

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
    def _start(self, w: _Worker, at: float, first: bool = False) -> None:
        """``w`` receives the server's weights at ``at``, sleeps its delay, starts its next
        step (or is done after its last)."""
        w.params = self._wire(self.params)
        w.pulled_version = self.engine.version
        self.engine.sent_params(w.rank)  # every reply here is a push's, with the weights
        start = at
        if not first:  # the straggler stretches the step's compute, not the wait for the reply
            start += self.sim._delay(w, w.steps - 1, self.timing.step_seconds)
        if self._out_of_work(w, first):
            self._schedule(self._last_epochs_end(w, start), w, self.DONE)
            return
        start = self._epoch_ends(w, start) + self.timing.loop_seconds  # then the loop's own
        w.started = start
        self._push_leaves(w, start + self.timing.step_seconds)

    def _epoch_ends(self, w: _Worker, at: float) -> float:
        """When worker 0, the lead, starts its next step (async DiLoCo: round) at ``at``: where
        the batch it now holds opens a later epoch, it ends its epochs first (_end_epochs).
        Returns when its step starts. Until stop 57 this cost nothing here, and in the lab the
        lead took a round nearly every epoch where the real one missed every other."""
        if w.rank != 0 or self.dispatcher is None or w.slot == NO_SLOT:
            return at
        return self._end_epochs(at, self.dispatcher.plan.locate(w.slot)[0])

    def _end_epochs(self, at: float, epoch: int) -> float:
        """The lead ends each epoch before ``epoch`` that it has not ended yet, from ``at``, as
        a real one ends its epochs: at each end that evaluates or checkpoints it pulls the
        server's weights across the link (ParameterServerClient.eval_replica; DiLoCoClient's
        pushes the round under way, or with none pulls: about a transfer each way either way,
        priced here as the pull's reply), then scores them where that epoch evaluates. Its
        epochs are the log's: a worker beside the server may train the next epoch's batches
        meanwhile (the lab's server beside worker 1), and the evaluation waits for the lead all
        the same. Returns when the lead is done with them."""
        ended, self.lead_epoch = range(self.lead_epoch, epoch), max(epoch, self.lead_epoch)
        crosses = self.outbound is not None and 0 not in self.beside
        per_epoch = self.sim.steps_per_epoch
        for e in ended:
            if crosses and self._reads_model(e):
                at = self.outbound.send(at, self.sim.message_bytes, toward_server=False)
            if self.sim.cadence.due(e):  # the weights the pull brings (its request's time)
                self.sim._evaluate(at, self.params, step=(e + 1) * per_epoch)
        return at

    def _last_epochs_end(self, w: _Worker, at: float) -> float:
        """When ``w``, out of batches at ``at``, is done: the lead ends its remaining epochs
        first (the job's batches may have run out while it was still epochs behind)."""
        if w.rank != 0 or self.dispatcher is None:
            return at
        return self._end_epochs(at, self.dispatcher.plan.epochs)

    def _reads_model(self, epoch: int) -> bool:
        """Whether the lead evaluates or checkpoints at ``epoch``'s end, as the trainer asks."""
        return self.sim.cadence.due(epoch) or checkpoint_due(self.sim.setup.cfg.run, epoch + 1)

    def _push_leaves(self, w: _Worker, at: float) -> None:
        """``w`` pushes at ``at``: over the server's link where there is one, through shared
        memory at once from the server's host (Timing.beside_server), else push_seconds on."""
        if w.rank in self.beside:
            self._schedule(at, w, self.ARRIVE)
        elif self.inbound is not None:
            self._schedule(at, w, self.SEND)
        else:
            self._schedule(at + self.timing.push_seconds, w, self.ARRIVE)

    # --- the server's side ------------------------------------------------------------------------
    def _out_of_work(self, w: _Worker, first: bool) -> bool:
        """After a reply: whether ``w`` has nothing left to train (the job's plan has no batch
        for it, or it took every step); a worker's first reply hands out its first batch."""
        if self.dispatcher is None:
            return w.steps == self.sim.total_steps
        if first:
            self._hand_out(w)
        return w.slot == NO_SLOT

    def _hand_out(self, w: _Worker) -> None:
        w.slot = self.dispatcher.take(w.rank)
        w.piece = None if w.slot == NO_SLOT else self.dispatcher.plan.locate(w.slot)
        if self.dispatcher.finished_pushing(w.rank):  # as server 0: nobody waits for its clock
            self.engine.on_finished(w.rank)

    def _arrive(self, w: _Worker, at: float) -> None:
        # The worker's schedule, in its header: its own steps, or the job's position when it
        # trains the job's batches (async, backup workers).
        lr = self.sim._lr(w.position if self.dispatcher is not None else w.steps, self.lr_scale)
        self.gradient = self._wire(self.sim._gradient(w, w.params)).numpy()
        slot = w.slot
        if self.dispatcher is not None:  # server 0 takes the push's slot, hands out the next
            self.dispatcher.complete(slot)
            self._hand_out(w)
        engine, version = self.engine, self.engine.version
        # The gradient's staleness as the server records it: None, dropped (a late backup
        # worker's); a round's are fresh; async ones as old as the weights they came from.
        late = engine.is_late(w.rank)
        staleness = None if late else 0 if self.policy.lock_step else engine.staleness(w.rank)
        done = self.reply_at = self._serve(at, 0.0 if late else self.timing.apply_seconds)
        with np.errstate(over="ignore", invalid="ignore"):  # a diverging run: see _gradient
            engine.on_push(w.rank, w.steps, lr, True, True, False)
        self._record(w, done, staleness, slot)
        self._updated(version)
        self.sim.now = max(self.sim.now, self.free_at)

    def _updated(self, version: int) -> None:
        """After a request: the weights changed since ``version`` (an update applied, a round
        closed), so an evaluation may be due."""
        if self.engine.version != version:
            self.sim._changed = True
            self.sim._maybe_evaluate(self.free_at, self.params)

    def _done(self, w: _Worker, at: float) -> None:
        """The worker has taken its last step: it no longer holds anyone back."""
        version = self.engine.version
        self.reply_at = max(at, self.free_at)
        self.engine.on_done(w.rank)
        self._updated(version)
        self.sim.now = max(self.sim.now, at, self.free_at)

    def _record(self, w: _Worker, at: float, staleness: int | None, slot: int) -> None:
        self.sim.pushes.append(PushRecord(at, w.rank, w.steps, staleness,
                                          w.steps - min(self.engine.clocks.clocks), slot))

    def _wire(self, tensor):
        """A copy of ``tensor`` as it crosses the wire: rounded to --wire-dtype, as the real
        pushes and replies are (ps/wire.py), and widened back to float32."""
        wire = narrow_dtype(self.sim.setup.cfg.ps.wire_dtype)
        return tensor.clone() if wire is None else tensor.to(wire).float()

    # --- the engine's ServerPort --------------------------------------------------------------
    def load(self, worker: int) -> None:
        pass  # the gradient is in hand

    def gradient_chunk(self, worker: int, a: int, b: int) -> np.ndarray:
        return self.gradient[a:b]

    def discard(self, worker: int) -> None:
        pass

    def reply(self, worker: int, want_params: bool) -> None:
        at = self.reply_at
        if self.outbound is not None and worker not in self.beside:
            at = self.outbound.send(at, self.sim.message_bytes, toward_server=False)
        self._start(self.sim.workers[worker], at)

    def start_stream(self, worker: int) -> bool:
        return False  # the reply goes whole once the update is done, at the same virtual time

    def chunk_applied(self, worker: int, chunk: int) -> None:
        raise AssertionError("the simulator's replies are not streamed")

    def streamed(self, worker: int, handles: list) -> None:
        raise AssertionError("the simulator's replies are not streamed")

    def begin_stop(self) -> None:
        pass  # the simulated workers never ask to stop

    def round_closed(self, workers: list[int], stop: bool, version: int) -> None:
        # Applying the round's mean takes the server another apply; its replies go after.
        self.reply_at = self._serve(self.reply_at, self.timing.apply_seconds)

    def dropped(self, worker: int, stop: bool, version: int) -> None:
        pass
