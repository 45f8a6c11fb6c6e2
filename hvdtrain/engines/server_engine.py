"""The parameter server's algorithm, written once: what a push, an idle worker or a finished one
does to one shard of the parameters. The real server (ps/server.py) and the simulator
(compare/sim/server_run.py) both run this class; they differ only in their ServerPort, through
which the engine reads a gradient and answers a worker. No MPI and no clock here: the port moves
the bytes, and the simulator's port keeps its virtual time.

The decisions are the rules' (hvdtrain/rules/, built by rules/registry.server_rules): the round
policy says whether a reply goes now, which held workers go on, when a lock-step round closes and
whether a gradient is late; the apply step weights or corrects a gradient before the shard
optimizer's step. The engine keeps the state that those rules read: the workers' clocks, the
parameters' versions, the replies held back, the round's sum and the statistics.

Two kinds of policy (``policy.lock_step``): a gradient is applied on arrival (async, SSP), or
summed into lock-step rounds (--bsp, backup workers) whose mean is applied once. With backup
workers and several servers, server 0 judges each push and the other servers (followers) carry
out its verdicts in its order (ps/verdicts.py moves them), so that every shard applies the same
rounds."""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Container
from typing import Protocol

import numpy as np

from ..rules.accumulator import RoundSum
from ..rules.clocks import Versions, WorkerClocks
from ..rules.registry import ServerRules
from ..rules.statistics import RuleStatistics


class ServerPort(Protocol):
    """What the engine asks of its backend. Called in the order the messages must go: a stop
    before the replies that follow it, a verdict before its round's replies."""

    def load(self, worker: int) -> None:
        """``worker``'s gradient is about to be read (the real server syncs its shared window)."""

    def gradient_chunk(self, worker: int, a: int, b: int) -> np.ndarray:
        """Elements [a, b) of ``worker``'s pushed gradient (the engine may write into them when
        the apply step rewrites gradients)."""

    def discard(self, worker: int) -> None:
        """``worker``'s gradient is not used (a late one): take it off the wire."""

    def reply(self, worker: int, want_params: bool) -> None:
        """Let ``worker`` go on, with the parameters if it asked for them (then the port calls
        :meth:`ServerEngine.sent_params`)."""

    def start_stream(self, worker: int) -> bool:
        """Whether the reply to ``worker``'s push, which wants the parameters, goes out now
        chunk by chunk as the gradient is applied (chunk_applied, then streamed); False: the
        engine calls reply once the update is done."""

    def chunk_applied(self, worker: int, chunk: int) -> object:
        """Chunk ``chunk`` of the parameters is updated: start streaming it to ``worker`` (it
        is not touched again before streamed); returns a handle for streamed."""

    def streamed(self, worker: int, handles: list) -> None:
        """Every chunk is on its way to ``worker`` (``handles``: what chunk_applied returned,
        in order): complete the reply, then call sent_params."""

    def begin_stop(self) -> None:
        """Every running worker stops after its current step (sent before the replies that
        follow)."""

    def round_closed(self, workers: list[int], stop: bool, version: int) -> None:
        """A round of ``workers`` (in the order they joined) closes now, at ``version`` (server
        0: its verdict for the other shards)."""

    def dropped(self, worker: int, stop: bool, version: int) -> None:
        """``worker``'s late push is dropped (server 0: its verdict for the other shards)."""


class ServerEngine:
    """One shard's pushes, by the rules ``rules``, on ``optimizer`` (a ps.shard_optimizer
    ShardOptimizer: its params and chunks), answering through ``port``. ``follows``: a follower
    of server 0's verdicts (backup workers, a server other than 0). ``staleness``: the Counter
    that the statistics fill (the simulator reads it as it goes).

    A backend changes the engine's state only through its methods; it may read ``clocks`` (the
    WorkerClocks that the rules read, for its silence watch and pauses) and ``stopping``."""

    def __init__(self, rules: ServerRules, num_workers: int, optimizer, port: ServerPort,
                 follows: bool = False, staleness: Counter | None = None):
        self.policy, self.step = rules.policy, rules.step
        self.optimizer, self.port = optimizer, port
        self._params = optimizer.params.numpy()  # what the apply step's adjustments see
        self._chunks = list(enumerate(optimizer.chunks))
        self._streaming: list = []  # the chunk handles of the reply being streamed
        self.clocks, self.versions = WorkerClocks(num_workers), Versions(num_workers)
        self.stats = RuleStatistics(staleness)
        self.pending: dict[int, bool] = {}  # worker -> wants params: replies the policy holds
        self._stopping = False  # every worker stops after its step
        lock_step = self.policy.lock_step
        self.round = RoundSum(self._params.size) if lock_step else None
        self.round_lr = 0.0       # a round steps with the rate of the push that joined it last
        self.round_stops = False  # a push of this round asked to stop
        self.follows = follows and lock_step
        self.verdicts: deque = deque()  # a follower's verdicts to carry out, in order
        self.awaiting: dict[int, tuple[bool, bool, float]] = {}  # ... pushes awaiting one

    # --- what the backend reads -------------------------------------------------------------------
    @property
    def stopping(self) -> bool:
        """Whether the job stops: every worker stops after its current step (begin_stop)."""
        return self._stopping

    @property
    def version(self) -> int:
        return self.versions.version

    def clock(self, worker: int) -> float:
        """``worker``'s pushes so far (inf once done or lost)."""
        return self.clocks.clocks[worker]

    def is_done(self, worker: int) -> bool:
        return self.clocks.is_done(worker)

    def staleness(self, worker: int) -> int:
        """Updates applied since ``worker`` received the parameters its next gradient is from."""
        return self.versions.staleness(worker)

    def is_late(self, worker: int) -> bool:
        """Whether a push from ``worker`` now would be dropped (a late backup worker's)."""
        return self.policy.is_late(self.versions, worker)

    def held(self) -> tuple[Container[int], Container[int]]:
        """The workers that wait for this server by design: a held reply, a follower's push
        awaiting server 0's verdict."""
        return self.pending, self.awaiting

    def describe(self, lost: Container[int]) -> str:
        """Where the workers stand, for a server that hears from none (``lost``: workers
        dropped, whose clocks read done too)."""
        clocks = ", ".join(
            f"worker {w}: {'lost' if w in lost else 'done' if self.clocks.is_done(w) else int(c)}"
            for w, c in enumerate(self.clocks.clocks))
        held = f"; replies held back for workers {sorted(self.pending)}" if self.pending else ""
        idle = f"; idle: workers {sorted(self.clocks.idle)}" if self.clocks.idle else ""
        verdicts = (f"; {len(self.verdicts)} of server 0's round decisions wait for pushes "
                    f"(arrived: workers {sorted(self.awaiting)})" if self.verdicts else "")
        return f"pushes so far: {clocks}{held}{idle}{verdicts}"

    def state(self) -> dict:
        """What a checkpoint keeps of the engine (the shard optimizer's state aside)."""
        return {"clocks": [-1 if self.clocks.is_done(w) else c
                           for w, c in enumerate(self.clocks.clocks)],
                "version": self.versions.version, "staleness": dict(self.stats.staleness)}

    def report(self, staleness_lr: bool) -> dict:
        """The rules' statistics, for the server's figures at the end of a run."""
        return self.stats.report(self.policy.lock_step, staleness_lr)

    # --- what the workers do ----------------------------------------------------------------------
    def start(self, version: int) -> None:
        """Every worker begins from ``version`` (a fresh start, or a checkpoint's)."""
        self.versions.start(version)

    def on_push(self, worker: int, clock: int, lr: float, has_gradient: bool, want_params: bool,
                wants_stop: bool) -> None:
        """A push from ``worker``, its ``clock``-th, stepped at ``lr``; without a gradient (a
        skipped fp16 step) it counts for the clocks and rounds but changes no parameter."""
        self.stats.pushed(has_gradient)
        self.clocks.push(worker, clock)
        if self.round is None:
            self._push_async(worker, lr, has_gradient, want_params, wants_stop)
        elif self.follows:  # a follower waits for server 0's verdict
            self.awaiting[worker] = (want_params, has_gradient, lr)
            self._follow()
        else:
            self._push_round(worker, lr, has_gradient, want_params, wants_stop)

    def on_idle(self, worker: int) -> None:
        """``worker`` waits for the others (or for a slot): no round nor bound counts on its
        clock until it pushes again."""
        self.clocks.idle.add(worker)
        self.release()

    def on_active(self, worker: int) -> None:
        """``worker`` trains again before its next push (its slot came): rounds count on it."""
        self.clocks.idle.discard(worker)

    def on_finished(self, worker: int) -> bool:
        """``worker``'s batches are used up: nobody waits for its clock. True if that is news
        (then the backend calls release)."""
        if worker in self.clocks.finished:
            return False
        self.clocks.finished.add(worker)
        return True

    def on_done(self, worker: int) -> None:
        """``worker`` has taken its last step: it no longer holds anyone back."""
        self.clocks.done(worker)
        self.release()

    def on_lost(self, worker: int) -> None:
        """``worker`` was declared lost: its clock reads done and nothing is sent to it."""
        self.clocks.done(worker)
        self.pending.pop(worker, None)

    def rejoin(self, worker: int, clock: int) -> None:
        """A newcomer takes lost ``worker``'s place at ``clock``."""
        self.clocks.clocks[worker] = clock
        self.clocks.finished.discard(worker)
        self.clocks.idle.discard(worker)

    def on_signal(self) -> None:
        """A stop signal reached this server: async stops now, a round at its end."""
        if self.round is None:
            self.begin_stop()
        else:
            self.round_stops = True

    def begin_stop(self) -> None:
        if not self._stopping:
            self._stopping = True
            self.port.begin_stop()

    def sent_params(self, worker: int) -> None:
        """``worker`` received this shard's parameters (a reply, a pull)."""
        self.versions.received(worker)
        self.step.received(worker, self._params)

    def release(self) -> None:
        """Send the held replies that may go now: SSP's once the slowest caught up (all once
        stopping); a round's once it closes without the workers that finished or went idle (a
        follower's rounds close on server 0's verdicts)."""
        if self.round is None:
            pending = self.pending
            held = list(pending) if self.stopping else self.policy.released(self.clocks, pending)
            for worker in held:
                self.port.reply(worker, pending.pop(worker))
        elif self.pending and not self.follows and \
                self.policy.closes(self.clocks, self.round.pushes):
            self._close_round()

    # --- applied on arrival -----------------------------------------------------------------------
    def _push_async(self, worker: int, lr: float, has_gradient: bool, want_params: bool,
                    wants_stop: bool) -> None:
        if wants_stop:
            self.begin_stop()
        # Once stopping, nobody waits for a worker that may already have stopped.
        reply_now = self.stopping or self.policy.may_reply(self.clocks, worker)
        if has_gradient:  # without one the clock moved, the parameters not
            # Each updated chunk goes back at once (unless the reply waits: held, a pause).
            stream = reply_now and want_params and self.port.start_stream(worker)
            self._apply(worker, lr, stream)
            if stream:
                self.release()
                return
        if reply_now:
            self.port.reply(worker, want_params)
        else:
            self.pending[worker] = want_params
        self.release()

    def _apply(self, worker: int, lr: float, stream: bool) -> None:
        """Apply ``worker``'s gradient chunk by chunk, each updated chunk streamed back at once
        with ``stream``: the worker copies chunk i out while the server updates chunk i+1."""
        port, step, optimizer = self.port, self.step, self.optimizer
        staleness = self.versions.staleness(worker)
        lr, factor = step.rate(lr, staleness)
        self.stats.applied(staleness, factor)
        port.load(worker)
        gradient_chunk, handles = port.gradient_chunk, self._streaming
        for i, (a, b) in self._chunks:
            step.apply_chunk(optimizer, i, gradient_chunk(worker, a, b), lr, worker)
            if stream:
                handles.append(port.chunk_applied(worker, i))
        self.versions.updated()
        if stream:
            port.streamed(worker, handles)
            handles.clear()

    # --- lock-step rounds -------------------------------------------------------------------------
    def _push_round(self, worker: int, lr: float, has_gradient: bool, want_params: bool,
                    wants_stop: bool) -> None:
        if self.policy.is_late(self.versions, worker):
            if wants_stop:  # no round of its own to carry the stop to the others
                self.begin_stop()
            self.port.dropped(worker, wants_stop, self.versions.version)
            self._drop_late(worker, want_params, has_gradient)
            return
        self.round_lr = lr
        self.round_stops |= wants_stop
        self._join(worker, want_params, has_gradient)
        if self.policy.closes(self.clocks, self.round.pushes):
            self._close_round()

    def on_verdict(self, is_round: bool, workers: list[int], stop: bool) -> None:
        """A follower: server 0's verdict, a round of ``workers`` (in the order they joined) or
        a dropped push; with ``stop`` every worker stops before its replies."""
        self.verdicts.append((is_round, workers, stop))
        self._follow()

    def _follow(self) -> None:
        """Carry out server 0's verdicts in its order, each once every push it names has
        arrived, so this shard goes through the same rounds."""
        verdicts, awaiting = self.verdicts, self.awaiting
        while verdicts and all(w in awaiting for w in verdicts[0][1]):
            is_round, workers, stop = verdicts.popleft()
            if not is_round:
                if stop:
                    self.begin_stop()
                want_params, has_gradient, _ = awaiting.pop(workers[0])
                self._drop_late(workers[0], want_params, has_gradient)
                continue
            for w in workers:
                want_params, has_gradient, self.round_lr = awaiting.pop(w)
                self._join(w, want_params, has_gradient)
            self.round_stops |= stop
            self._close_round()

    def _join(self, worker: int, want_params: bool, has_gradient: bool) -> None:
        if has_gradient:
            self.port.load(worker)
            for _, (a, b) in self._chunks:
                self.round.add(a, b, self.port.gradient_chunk(worker, a, b))
        self.round.join(has_gradient)
        self.pending[worker] = want_params  # in the order they joined (followers repeat it)

    def _drop_late(self, worker: int, want_params: bool, has_gradient: bool) -> None:
        """Discard a late gradient and send its worker the current parameters at once, so its
        next gradient belongs to the round under way."""
        self.versions.replied_to_push(worker)
        if has_gradient:
            self.port.discard(worker)
            self.stats.dropped()
        self.port.reply(worker, want_params)

    def _close_round(self) -> None:
        self.port.round_closed(list(self.pending), self.round_stops, self.versions.version)
        self.stats.round_closed(self.round.gradients)
        mean = self.round.mean()
        if mean is not None:
            self.step.apply_all(self.optimizer, mean, self.round_lr)
            self.versions.updated()
        self.round.clear()
        if self.round_stops:  # every worker stops after this same round
            self.begin_stop()
        pending, self.pending = self.pending, {}
        for w, want in sorted(pending.items()):
            self.versions.replied_to_push(w)
            self.port.reply(w, want)
