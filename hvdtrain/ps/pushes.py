"""What the server does with a push, one class per kind of round policy: applied on arrival
(async, SSP) or summed into lock-step rounds (BSP, backup workers). The decisions are the rules'
(hvdtrain/rules/); these classes move the gradient's chunks and the replies."""

from __future__ import annotations

from ..rules.accumulator import RoundSum
from .protocol import Kind


class AsyncPushes:
    """Each gradient is applied as it arrives; the policy says whether its reply goes now."""

    def __init__(self, server):
        self.server = server

    def on_signal(self) -> None:
        self.server.begin_stop()

    def push(self, worker: int, lr: float, want_params: bool, wants_stop: bool,
             has_gradient: bool) -> None:
        server = self.server
        if wants_stop:
            server.begin_stop()
        # Once stopping, nobody waits for a worker that may already have stopped.
        reply_now = server.stopping or server.policy.may_reply(server.clocks, worker)
        # Send each chunk back as soon as it is updated (unless the reply is held: a pause).
        stream = reply_now and want_params and not server.pauses.holds(worker, server.stopping)
        if has_gradient:  # without one (a skipped fp16 step) the clock moved, the parameters not
            self._apply(worker, lr, stream)
        if not (has_gradient and stream):
            if reply_now:
                server.reply(worker, want_params)
            else:
                server.pending[worker] = want_params
        self.release()

    def _apply(self, worker: int, lr: float, stream: bool) -> None:
        """Apply ``worker``'s gradient chunk by chunk, each updated chunk streamed back at once
        with ``stream``."""
        server, shard = self.server, self.server.shard
        staleness = server.versions.staleness(worker)
        lr, factor = server.step.rate(lr, staleness)
        server.stats.applied(staleness, factor)
        sends = []
        if stream:
            server.pauses.send_debt(worker, server.stopping)
        shard.host.sync()  # the worker's gradient stores happened before its header
        for i, (a, b) in enumerate(shard.chunks):
            server.step.apply_chunk(shard.optimizer, i, shard.gradient_chunk(worker, a, b), lr,
                                    worker)
            if stream:
                # Non-blocking: the worker copies chunk i out while this process receives and
                # updates chunk i+1, so the two directions overlap on two cores. Chunk i is not
                # touched again before the Waitall below.
                sends.append(shard.send_chunk(worker, i))
        server.versions.updated()
        if stream:
            server.MPI.Request.Waitall(sends)
            server.mark_pulled(worker)

    def release(self) -> None:
        server = self.server
        held = list(server.pending) if server.stopping else \
            server.policy.released(server.clocks, server.pending)
        for worker in held:
            server.reply(worker, server.pending.pop(worker))


class RoundPushes:
    """Lock-step averaging: sum the round's gradients, apply their mean once, reply to the
    round's workers (all of them; with backup workers the first N-b, a late push dropped). A
    push without a gradient (a skipped fp16 step) takes part in the round and counts for its
    quorum, and the mean is over the gradients that came (rules/accumulator.py). With backup
    workers and several servers, server 0 judges each push and the others follow its verdicts
    (verdicts.py)."""

    def __init__(self, server, length: int):
        self.server = server
        self.round = RoundSum(length)
        self.lr = 0.0         # the round's rate: that of the push that joined it last
        self.stops = False    # a push of this round asked to stop

    def on_signal(self) -> None:
        self.stops = True  # at the end of the round under way

    def push(self, worker: int, lr: float, want_params: bool, wants_stop: bool,
             has_gradient: bool) -> None:
        server = self.server
        if server.verdicts.follows:  # a follower waits for server 0's verdict
            server.verdicts.arrived[worker] = (want_params, has_gradient, lr)
            self.follow()
            return
        if server.policy.is_late(server.versions, worker):
            if wants_stop:  # no round of its own to carry the stop to the others
                server.begin_stop()
            server.verdicts.tell(Kind.DROP, [worker], wants_stop, server.versions.version)
            self._drop_late(worker, want_params, has_gradient)
            return
        self.lr = lr
        self.stops |= wants_stop
        self._join(worker, want_params, has_gradient)
        if server.policy.closes(server.clocks, self.round.pushes):
            self._finish()

    def follow(self) -> None:
        """A follower carries out the leader's verdicts in the leader's order, so its shard goes
        through the same rounds."""
        arrived = self.server.verdicts.arrived
        for kind, workers, stop in self.server.verdicts.ready():
            if kind == Kind.DROP:
                if stop:
                    self.server.begin_stop()
                want_params, has_gradient, _ = arrived.pop(workers[0])
                self._drop_late(workers[0], want_params, has_gradient)
                continue
            for w in workers:
                want_params, has_gradient, self.lr = arrived.pop(w)
                self._join(w, want_params, has_gradient)
            self.stops |= stop
            self._finish()

    def _join(self, worker: int, want_params: bool, has_gradient: bool) -> None:
        server, shard = self.server, self.server.shard
        if has_gradient:
            shard.host.sync()
            for a, b in shard.chunks:
                self.round.add(a, b, shard.gradient_chunk(worker, a, b))
        self.round.join(has_gradient)
        server.pending[worker] = want_params  # in the order they joined (followers repeat it)

    def _drop_late(self, worker: int, want_params: bool, has_gradient: bool) -> None:
        """Discard a late gradient and send its worker the current parameters at once, so its
        next gradient belongs to the round under way."""
        server = self.server
        server.versions.replied_to_push(worker)
        if has_gradient:
            server.shard.discard_gradient(worker)
            server.stats.dropped()
        server.reply(worker, want_params)

    def _finish(self) -> None:
        server = self.server
        server.verdicts.tell(Kind.ROUND, list(server.pending), self.stops,
                             server.versions.version)
        server.stats.round_closed(self.round.gradients)
        mean = self.round.mean()
        if mean is not None:
            server.step.apply_all(server.shard.optimizer, mean, self.lr)
            server.versions.updated()
        self.round.clear()
        if self.stops:  # every worker stops after this same round
            server.begin_stop()
        for w, want in sorted(server.pending.items()):
            server.versions.replied_to_push(w)
            server.reply(w, want)
        server.pending.clear()

    def release(self) -> None:
        """A worker that finished mid-round (or, with backup workers, went idle) must not hold
        the others' round open. A follower's rounds close on the leader's verdicts."""
        server = self.server
        if server.pending and not server.verdicts.follows and \
                server.policy.closes(server.clocks, self.round.pushes):
            self._finish()
