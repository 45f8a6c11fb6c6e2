"""The parameter server: holds one contiguous shard of the flattened parameters (shard.py) and
applies each pushed gradient as it arrives, with a server-side torch optimizer whose state lives
here.

The server is a message loop: it receives a request, routes it, and replies. What a push does is
the server engine's (engines/server_engine.py, the rules of hvdtrain/rules/ and the state they read),
which answers through the ShardPort (pushes.py). The MPI-bound pieces each have a file:
evaluation pauses (pauses.py), server 0's round verdicts for the other shards (verdicts.py), the
silence check (silence.py) and the figures (server_stats.py).

The loop is a single thread that blocks in MPI receives. Open MPI moves point-to-point messages
only while a process is inside MPI, so a server that waits in ``Recv`` is always making progress
for the workers, and a server that is computing is never waiting for one.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from ..config import Config
from ..layout import Topology
from ..engines.server_engine import ServerEngine
from ..rules.registry import server_rules
from .arrivals import SlowArrivals
from .dispatch import BatchDispatcher, SlotPlan
from .ledger import PushLedger, answer_refused
from .membership import Membership
from .pauses import EvalPauses
from .pushes import ShardPort
from .protocol import (H_CLOCK, H_FLAGS, H_KIND, H_LR, H_SIZE, H_SLOT, H_WORKER, HAS_PLAN,
                       HAS_STATE, HEADER_LEN, NO_GRADIENT, SLOT_LIST, WANT_PARAMS, WANT_SLOT,
                       WANTS_STOP, Kind, Tag, word_to_lr)
from .replacement import Replacements
from .server_stats import ServerLoad
from .shard import Shard
from .silence import SilenceWatch
from . import shard_file, slot_waiters
from .verdicts import Verdicts


class ParameterServer:
    """``device``: where the shard's master copy and optimizer state live (--server-device,
    runtime.pick_server_device); the messages always move host memory."""

    def __init__(self, comm, cfg: Config, topology: Topology, device=None):
        from mpi4py import MPI

        self.MPI, self.comm, self.cfg, self.topology = MPI, comm, cfg, topology
        self.device = device
        self.index = topology.server_index(comm.Get_rank())
        self.num_workers = n = topology.num_workers
        # what the engine runs; it checks the options now
        self.rules = server_rules(cfg.ps, n, cfg.sync.local_steps)
        self.load = ServerLoad(n)
        self.ledger = PushLedger(n)  # no push applied twice, nor one from a lost worker
        self.header = np.zeros(HEADER_LEN, dtype=np.int64)
        self.shard: Shard | None = None    # filled in by INIT
        self.engine: ServerEngine | None = None  # ... what a push does
        self.arrivals: SlowArrivals | None = None  # ... and slow links' pushes (arrivals.py)
        self.pauses = EvalPauses(comm, charges=self.index == 0)
        self.verdicts = Verdicts(comm, topology, self.index, cfg.ps.backup_workers)
        self.membership = Membership(self.index, replacements=Replacements.at_server(
            cfg.ps.max_restarts, self.index))  # workers lost on the way, and replaced
        self.silence = SilenceWatch(self.index, n, cfg.ps.timeout_s,
                                    self.load.intervals if self.membership.recovery else None)
        self.dispatcher: BatchDispatcher | None = None  # server 0: the job's batch plan
        self.step_times: dict[int, int] = {}  # worker -> its last round's step time (us)

    # --- set-up --------------------------------------------------------------------------------
    def _allocate(self, total: int) -> None:
        self.shard = Shard(self.comm, self.cfg, self.index, self.topology.num_servers,
                           self.num_workers, total, self.rules.step.rewrites_gradient,
                           self.device)
        self.engine = ServerEngine(self.rules, self.num_workers, self.shard.optimizer,
                                   ShardPort(self, self.shard), follows=self.verdicts.follows)
        routed = hasattr(self.comm, "post_requests")  # --max-restarts: routes.py
        lone, lock_step = self.num_workers == 1, self.engine.round is not None
        self.arrivals = SlowArrivals(self, enabled=not (lone or lock_step or routed
                                                        or self.membership.recovery))

    def _recv_init(self) -> None:
        """The first message is worker 0's INIT: parameters, plus optimizer state on resume.
        Other workers' requests wait in MPI's queue until then, so nobody sees random weights."""
        self.comm.Recv(self.header, source=0, tag=Tag.REQUEST)
        assert self.header[H_KIND] == Kind.INIT, f"expected INIT, got {self.header[H_KIND]}"
        self._allocate(int(self.header[H_SIZE]))
        self.shard.receive_params(source=0)
        version = 0
        if self.header[H_FLAGS] & HAS_STATE:
            meta = self.shard.receive_state(source=0)
            version = int(meta.get("version", 0))
            if meta.get("shards"):  # each server's own file beside the checkpoint
                shard_file.restore(self.shard, self.index, meta)
        if self.header[H_FLAGS] & HAS_PLAN:
            plan = self.comm.recv(source=0, tag=Tag.INFO)
            self.dispatcher = BatchDispatcher(SlotPlan(*plan["plan"]), self.membership.recovery)
            if plan.get("state"):
                self.dispatcher.load_state_dict(plan["state"])
        self.engine.start(version)
        self.silence.start()

    # --- the loop ------------------------------------------------------------------------------
    def serve(self) -> dict[str, Any]:
        # A scheduler signals every process, servers too: a server that gets one stops the
        # workers the way a worker's signal does, and ends when they are done. It prints no
        # line of its own: its workers say what a stop does (loop/preemption.py).
        from ..loop.preemption import process_signals as signals

        signals.announce = False

        status = self.MPI.Status()
        self._recv_init()
        active = self.num_workers
        while active:
            if signals.received and not self.engine.stopping:
                self.engine.on_signal()
            source = self.arrivals.next_request(status)
            t0 = time.perf_counter()
            if self.arrivals.park(source):  # a slow link's gradient: served once it is in
                continue
            if source < self.num_workers:  # not a verdict from server 0
                self.silence.heard(source, self.header[H_KIND] == Kind.PUSH, t0)
            active -= self._handle(source, t0)
            self.arrivals.served(source)
            active -= self.membership.check(self, t0)
            self.load.busy_seconds += time.perf_counter() - t0
        stats = self.statistics()
        self.comm.send(stats, dest=self.membership.lead(self.num_workers), tag=Tag.INFO)
        if not self.membership.lost:  # a lost worker never joins the collective
            self.shard.close()  # collective with the workers' close()
        return stats

    def _handle(self, worker: int, now: float) -> bool:
        """Serve the request whose header has just arrived from ``worker``; True if it is the
        worker's DONE."""
        kind = int(self.header[H_KIND])
        self.shard.wire.request(worker, kind)  # a push's reply travels in --wire-dtype
        if kind in (Kind.PUSH, Kind.IDLE, Kind.DONE):
            self.pauses.arrived(worker, now)
        if kind == Kind.PUSH:
            self._handle_push(worker, now)
        elif kind == Kind.PULL:
            self._send_params(worker)
        elif kind == Kind.SAVE:
            self._save(worker)
        elif kind == Kind.QUIET:
            self.silence.quiet.add(worker)
        elif kind == Kind.SLOTS:  # H_SLOT: the epoch it is in
            slot_waiters.ask(self, worker, int(self.header[H_SIZE]), int(self.header[H_SLOT]))
        elif kind == Kind.IDLE:  # it waits for the other workers: rounds stop counting on it
            self.silence.waiting_for_others.add(worker)
            self.engine.on_idle(worker)
        elif kind == Kind.PAUSE:
            self.pauses.pause(worker, now)
        elif kind == Kind.RESUME:
            self._send_all(self.silence.resumed(self.pauses.resume(now, self.engine.clocks,
                                                                   self.engine.stopping), now))
        elif kind in (Kind.ROUND, Kind.DROP):  # a follower: a verdict from server 0
            self.engine.on_verdict(*self.verdicts.receive(kind, self.header))
        elif kind == Kind.LOST:  # a follower: server 0 dropped a worker
            self.membership.drop(self, int(self.header[H_WORKER]), now)  # counted by check
        elif kind == Kind.DONE:
            self.load.pushes_reported[worker] = int(self.header[H_CLOCK])
            self.engine.on_done(worker)
            slot_waiters.closed(self, worker)
            return True
        else:
            raise RuntimeError(f"parameter server got unknown request kind {kind} from {worker}")
        return False

    def _handle_push(self, worker: int, now: float) -> None:
        flags = int(self.header[H_FLAGS])
        if not self.ledger.admits(self.engine.clock(worker), worker,
                                  int(self.header[H_CLOCK])):
            answer_refused(self, worker, flags)
            return
        if flags & WANT_SLOT and self.dispatcher is not None:
            # Its slot is done; its next one goes out now, before the reply, which may be held.
            slots, listed = [int(self.header[H_SLOT])], bool(flags & SLOT_LIST)
            if listed:  # a round of async DiLoCo: several slots, listed
                slots = slot_waiters.receive_list(self, worker, slots[0])
            for slot in slots:
                self.dispatcher.complete(slot, worker)
            slot_waiters.hand_out(self, worker, len(slots), listed)  # never held
        self.load.push(worker, int(self.header[H_SIZE]), now)
        self.engine.on_push(worker, int(self.header[H_CLOCK]), word_to_lr(self.header[H_LR]),
                            not flags & NO_GRADIENT, bool(flags & WANT_PARAMS),
                            bool(flags & WANTS_STOP))
        self.load.last_push = time.perf_counter()

    def _describe_wait(self) -> str:
        paused = ""
        if self.pauses.paused_by is not None:
            paused = (f"; worker {self.pauses.paused_by} evaluates, replies to workers "
                      f"{sorted(self.pauses.held)} held until it resumes")
        return (f"parameter server {self.index}: no request from any worker "
                f"({self.engine.describe(set(self.membership.lost_workers))}{paused})")

    def begin_stop(self) -> None:
        """Tell every worker still training to stop after its current step (the engine's
        ServerPort.begin_stop, once). Sent before the replies that follow, so a worker that has
        its reply has this message too (Open MPI delivers one sender's messages in order)."""
        for worker in range(self.num_workers):
            if not self.engine.is_done(worker):
                self.comm.Send(np.ones(1, dtype=np.int64), dest=worker, tag=Tag.STOP)
        self._send_all(self.pauses.release())  # nobody waits for an evaluation once stopping
        slot_waiters.stop(self)  # ... nor for a slot: the held requests get NO_SLOT

    # --- replies -------------------------------------------------------------------------------
    def reply(self, worker: int, want_params: bool) -> None:
        stopping = self.engine.stopping
        if self.pauses.holds(worker, stopping):
            self.pauses.held[worker] = want_params
            return
        self.pauses.send_debt(worker, stopping)
        if want_params:
            self._send_params(worker)
        else:
            self.send_ack(worker)

    def _send_all(self, replies: dict[int, bool]) -> None:
        for worker, want_params in sorted(replies.items()):
            self.reply(worker, want_params)

    def send_ack(self, worker: int) -> None:
        """The reply to a request that wants no parameters back."""
        self.comm.Send(np.zeros(1, dtype=np.int64), dest=worker, tag=Tag.ACK)

    def _send_params(self, worker: int) -> None:
        self.shard.send_all(self.MPI, worker)
        self.engine.sent_params(worker)

    # --- checkpoint state and statistics -------------------------------------------------------
    def _save(self, worker: int) -> None:
        """The lead's checkpoint (its path and position came just before the header): this
        shard goes into its own file beside it (shard_file.py), and the lead gets an ACK (or
        the parameters it asked for), then what the checkpoint keeps of this server: the
        clocks, the version, the batch plan, and where the shard went."""
        place = self.comm.recv(source=worker, tag=Tag.INFO)
        shard = shard_file.save(self.shard, self.index, place)
        if self.header[H_FLAGS] & WANT_PARAMS:  # the lead's last reply was rounded
            self._send_params(worker)
        else:
            self.send_ack(worker)
        self.comm.send({**self.engine.state(), "shard": shard,
                        **({"dispatch": self.dispatcher.state_dict()} if self.dispatcher else {})},
                       dest=worker, tag=Tag.INFO)

    def statistics(self) -> dict[str, Any]:
        ps = self.cfg.ps
        rules = self.engine.report(self.rules.weighs_by_staleness)
        if ps.eval_pauses_workers and self.index == 0:
            rules["eval_pause_debt_seconds"] = round(self.pauses.debt_seconds, 3)
        return self.load.report(self.index, self.engine.version,
                                {**rules, **self.membership.report(self.load),
                                 **self.ledger.report(), **self.shard.wire.report(),
                                 "server_device": str(self.shard.device),
                                 **(self.dispatcher.statistics() if self.dispatcher else {})})
