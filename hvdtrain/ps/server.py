"""The parameter server: holds one contiguous shard of the flattened parameters and applies each
pushed gradient as it arrives, with a server-side torch optimizer whose state lives here.

The loop is a single thread that blocks in MPI receives. Open MPI moves point-to-point messages
only while a process is inside MPI, so a server that waits in ``Recv`` is always making progress
for the workers, and a server that is computing is never waiting for one.

Workers on the server's host share its memory (``shared_memory.HostWindow``): the update reads
their gradient in place and they copy each updated chunk out of the shard themselves, so the
server's core spends a push on the update alone. Like the workers of Hogwild and of any
asynchronous PS, a worker copying chunk i may see it half-way through another worker's update
of it: every element is either the old or the new value. Lock-step rounds (``--bsp``) never
write while anyone reads; with ``--backup-workers`` a round may close while a worker left out of
it still copies the last parameters, but the gradient that worker computes on them is then late
by construction (the version moved on) and is dropped.

Backup workers (``--bsp --backup-workers b``, Chen et al. 2016, "Revisiting distributed
synchronous SGD"): a round closes as soon as N-b of the N workers have pushed a gradient computed
on the current parameters. Which round a push belongs to is the parameter version in its
worker's last push reply (``push_version``): a push made on an older version arrives after its
round closed, so its gradient is dropped (``dropped_gradients``) and its worker gets the current
parameters at once. Every applied gradient is therefore fresh.

With several servers, server 0 (the leader) decides for every shard: it sends the others each
round's members, in the order they joined, and each dropped push, and they carry these verdicts
out in order, each once the pushes it names have arrived. So every shard applies the same rounds
with the same workers' gradients and learning rate. Shards that decided on their own (as
TensorFlow's SyncReplicasOptimizer does per variable) could hang: a worker late at one shard and
on time at another waits there for a round that the workers it waits for cannot join.
"""

from __future__ import annotations

import math
import resource
import time
from collections import Counter, deque
from typing import Any

import numpy as np
import torch

from ..config import Config
from ..layout import Topology
from .dispatch import BatchDispatcher, SlotPlan
from .protocol import (H_CLOCK, H_FLAGS, H_KIND, H_LR, H_SIZE, H_SLOT, H_WORKER, HAS_PLAN,
                       HAS_STATE, HEADER_LEN, NO_GRADIENT, WANT_PARAMS, WANT_SLOT, WANTS_STOP,
                       Kind, Tag, chunk_bounds,
                       bsp_quorum, check_backup_workers, chunk_elements, delay_compensate,
                       make_header, may_proceed, shard_bounds, staleness_lr_factor, word_to_lr)
from .shard_optimizer import ShardOptimizer
from .shared_memory import HostWindow
from .waiting import StuckError, wait_any


def peak_rss_bytes() -> int:
    # The kernel raises ru_maxrss lazily (on unmap and exit), so it can lag the resident size
    # read now; the larger of the two is the peak so far.
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    return max(peak, current_rss_bytes() or 0)


def current_rss_bytes() -> int | None:
    """Resident memory now (Linux), to show it stays flat over a long run."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize()
    except (OSError, ValueError, IndexError):
        return None


class ParameterServer:
    def __init__(self, comm, cfg: Config, topology: Topology):
        from mpi4py import MPI

        self.MPI = MPI
        self.comm = comm  # the private, duplicated communicator
        self.cfg = cfg
        self.topology = topology
        self.index = topology.server_index(comm.Get_rank())
        self.num_workers = topology.num_workers
        self.staleness_bound = cfg.ps.staleness
        self.bsp = cfg.ps.bsp
        self.backup_workers = cfg.ps.backup_workers
        check_backup_workers(self.backup_workers, self.num_workers)
        self.dc_lambda = cfg.ps.dc_lambda
        self.staleness_lr = cfg.ps.staleness_lr
        self.lr_factor_sum = 0.0  # --staleness-lr: the factors applied, for the statistics
        self.chunk_elems = chunk_elements(cfg.ps.chunk_mb)
        self.header = np.zeros(HEADER_LEN, dtype=np.int64)
        # filled in by INIT
        self.params: torch.Tensor | None = None
        self.chunks: list[tuple[int, int]] = []
        self.optimizer: ShardOptimizer | None = None
        self.grad_buffer: np.ndarray | None = None
        self.host: HostWindow | None = None
        self.shared_grads: dict[int, np.ndarray] = {}      # worker -> its gradient, this shard
        self.ready_words: np.ndarray | None = None         # READY payloads, one per chunk
        self.lr = 0.0  # the pushing worker's current learning rate (its schedule, its header)
        # bookkeeping
        self.clocks: list[float] = [0] * self.num_workers   # pushes per worker; inf once done
        self.version = 0                                   # updates applied to these parameters
        self.pulled_version = [0] * self.num_workers       # version each worker last received
        self.staleness = Counter()                         # staleness of every applied gradient
        self.pending: dict[int, bool] = {}                 # worker -> wants params, reply held back
        self.pushes_received = 0
        self.pushes_reported = [0] * self.num_workers      # each worker's own count, at DONE
        self.rss_at_first_push: int | None = None
        self.samples_received = 0
        self.first_push: float | None = None
        self.last_push = 0.0
        self.busy_seconds = 0.0
        self.started = time.perf_counter()
        self.rss_at_start = peak_rss_bytes()  # MPI and torch are loaded, no tensors yet
        self.round_sum: np.ndarray | None = None           # BSP: this round's gradient sum
        self.round_count = 0                               # BSP: pushes of this round
        self.round_gradients = 0                           # ... that carried a gradient
        self.pushes_without_gradient = 0                   # fp16 steps the workers skipped
        self.dropped_gradients = 0          # --backup-workers: late gradients, never applied
        self.gradients_per_round = Counter()  # BSP: rounds closed, by the gradients they took
        self.idle: set[int] = set()         # workers in a wait for the others (IDLE): no round
                                            # of backup workers waits for them; a pause charges
                                            # them nothing
        self.paused_by: int | None = None   # --eval-pauses-workers: the worker evaluating now
        self.held: dict[int, bool] = {}     # ... and the replies held until it resumes
        self.pause_started = 0.0            # ... since when
        self.computed_in_pause: dict[int, float] = {}  # ... worker -> seconds until it pushed
        self.debts: dict[int, float] = {}   # ... worker -> seconds it owes, sent with its reply
        self.debt_seconds = 0.0             # ... all the debts charged
        self.push_version = [0] * self.num_workers  # ... version of each worker's last push reply
        # --backup-workers with several servers: server 0 decides the rounds of every shard.
        self.leader_rank = topology.server_ranks()[0]
        self.is_leader = self.index == 0
        self.followers = topology.server_ranks()[1:] if self.backup_workers and self.is_leader \
            else []
        self.verdicts: deque = deque()      # a follower's verdicts to carry out, in order
        self.arrived: dict[int, tuple[bool, bool, float]] = {}  # ... pushes awaiting one
        self.backups: dict[int, np.ndarray] = {}           # DC-ASGD: params each worker last pulled
        self.stopping = False     # a worker got a stop signal: every worker stops after its step
        self.dispatcher: BatchDispatcher | None = None  # server 0: the job's batch plan
        self.finished_pushing: set[int] = set()  # ... workers whose batches are all used up
        self.last_heard: list[float] = []  # each worker's last request (from INIT on)
        self._silence_checked = 0.0
        self.quiet: set[int] = set()  # workers busy with their own work until their next push
        self.round_stops = False  # BSP: a push of this round asked to stop

    # --- set-up --------------------------------------------------------------------------------
    def _allocate(self, total: int) -> None:
        start, end = shard_bounds(total, self.topology.num_servers)[self.index]
        # Collective with every worker on this host, which create it right after sending INIT.
        self.host = HostWindow(self.comm, 4 * (end - start), self.cfg.ps.shared_memory)
        if self.host.shares_host(self.comm.Get_rank()):
            self.params = torch.from_numpy(self.host.segment(self.comm.Get_rank()))
        else:
            self.params = torch.zeros(end - start, dtype=torch.float32)
        self.shared_grads = {w: self.host.segment(w)[start:end] for w in range(self.num_workers)
                             if self.host.shares_host(w)}
        self.chunks = chunk_bounds(end - start, self.chunk_elems)
        self.ready_words = np.arange(len(self.chunks), dtype=np.int64)
        # Chunk i is updated as soon as it has arrived. The update rules are elementwise, so
        # chunked application is the same arithmetic as one step over the whole shard.
        self.optimizer = ShardOptimizer(self.params, self.chunks, self.cfg.optim)
        self.grad_buffer = np.empty(max(b - a for a, b in self.chunks), dtype=np.float32)
        if self.bsp:
            self.round_sum = np.zeros(end - start, dtype=np.float32)

    def _recv_init(self) -> None:
        """The first message is worker 0's INIT: parameters, plus optimizer state on resume.
        Other workers' requests wait in MPI's queue until then, so nobody sees random weights."""
        self.comm.Recv(self.header, source=0, tag=Tag.REQUEST)
        assert self.header[H_KIND] == Kind.INIT, f"expected INIT, got {self.header[H_KIND]}"
        self._allocate(int(self.header[H_SIZE]))
        params = self.params.numpy()
        for a, b in self.chunks:
            self.comm.Recv(params[a:b], source=0, tag=Tag.PARAMS)
        if self.header[H_FLAGS] & HAS_STATE:
            self._recv_state(source=0)
        if self.header[H_FLAGS] & HAS_PLAN:
            plan = self.comm.recv(source=0, tag=Tag.INFO)
            self.dispatcher = BatchDispatcher(SlotPlan(*plan["plan"]))
            if plan.get("state"):
                self.dispatcher.load_state_dict(plan["state"])
        for w in range(self.num_workers):
            self.pulled_version[w] = self.push_version[w] = self.version
        # Silence counts from here, however long worker 0 took to start (reading a large
        # checkpoint while the others wait for it).
        self.last_heard = [time.perf_counter()] * self.num_workers

    # --- the loop ------------------------------------------------------------------------------
    def serve(self) -> dict[str, Any]:
        # A scheduler signals every process, servers too: a server that gets one stops the
        # workers the way a worker's signal does, and ends when they are done.
        from ..loop.preemption import process_signals as signals

        status = self.MPI.Status()
        self._recv_init()
        active = self.num_workers
        while active:
            if signals.received and not self.stopping:
                if self.bsp:
                    self.round_stops = True  # at the end of the round under way
                else:
                    self._begin_stop()
            self._next_request(status)
            t0 = time.perf_counter()
            if status.Get_source() < self.num_workers:  # not a verdict from server 0
                self.last_heard[status.Get_source()] = t0
                if self.header[H_KIND] == Kind.PUSH:  # back to training
                    self.quiet.discard(status.Get_source())
            active -= self._handle(status.Get_source(), t0)
            self._check_silence(t0)
            self.busy_seconds += time.perf_counter() - t0
        stats = self.statistics()
        self.comm.send(stats, dest=0, tag=Tag.INFO)
        self.host.close()  # collective with the workers' close()
        return stats

    def _handle(self, worker: int, now: float) -> bool:
        """Serve the request whose header has just arrived from ``worker``; True if it is the
        worker's DONE."""
        kind = int(self.header[H_KIND])
        if self.paused_by not in (None, worker) and kind in (Kind.PUSH, Kind.IDLE, Kind.DONE):
            # it stops computing here, its reply held: how long it computed in the pause
            self.computed_in_pause.setdefault(worker, now - self.pause_started)
        if kind == Kind.PUSH:
            if self.header[H_FLAGS] & WANT_SLOT and self.dispatcher is not None:
                self._hand_out_after(worker, int(self.header[H_SLOT]))
            self.samples_received += int(self.header[H_SIZE])
            if self.first_push is None:
                self.first_push = now
                self.rss_at_first_push = current_rss_bytes()
            flags = int(self.header[H_FLAGS])
            self._push(worker, int(self.header[H_CLOCK]), word_to_lr(self.header[H_LR]),
                       bool(flags & WANT_PARAMS), bool(flags & WANTS_STOP),
                       has_gradient=not flags & NO_GRADIENT)
            self.last_push = time.perf_counter()
        elif kind == Kind.PULL:
            self._send_params(worker)
        elif kind == Kind.QUIET:
            self.quiet.add(worker)
        elif kind == Kind.SLOTS:
            self._hand_out(worker, int(self.header[H_SIZE]))
        elif kind == Kind.SAVE:
            self._send_params(worker)
            self._send_state(worker)
        elif kind == Kind.IDLE:  # it waits for the other workers: rounds stop counting on it
            self.idle.add(worker)
            self._release_pending()
        elif kind == Kind.PAUSE:
            self.paused_by, self.pause_started, self.computed_in_pause = worker, now, {}
        elif kind == Kind.RESUME:
            self._resume(now)
        elif kind in (Kind.ROUND, Kind.DROP):  # a follower: a verdict from server 0
            self._receive_verdict(kind)
        elif kind == Kind.DONE:
            self.pushes_reported[worker] = int(self.header[H_CLOCK])
            self.clocks[worker] = math.inf
            self._release_pending()
            return True
        else:
            raise RuntimeError(f"parameter server got unknown request kind {kind} from {worker}")
        return False

    # --- the job's batch plan (server 0) ---------------------------------------------------------
    def _hand_out_after(self, worker: int, trained: int) -> None:
        """A push carried slot ``trained``: it is done, and the worker gets its next slot now,
        before the reply, which may be held (a staleness bound, a pause)."""
        self.dispatcher.complete(trained)
        self._hand_out(worker, 1)

    def _hand_out(self, worker: int, count: int) -> None:
        """Send ``worker`` its next ``count`` slots (NO_SLOT for each one not left)."""
        slots = np.array([self.dispatcher.take(worker) for _ in range(count)], dtype=np.int64)
        self.comm.Send(slots, dest=worker, tag=Tag.SLOT)
        if self.dispatcher.finished_pushing(worker) and worker not in self.finished_pushing:
            self.finished_pushing.add(worker)
            self._release_pending()  # nobody waits for its clock any more

    def _bound_clocks(self) -> list[float]:
        """The clocks a staleness bound compares: a worker that will push no more (its batches
        are used up), or none until the others meet it (idle in a collective of workers), is as
        good as done, or the others would wait for it forever."""
        return [math.inf if w in self.finished_pushing or w in self.idle else c
                for w, c in enumerate(self.clocks)]

    def _check_silence(self, now: float) -> None:
        """End the job when one worker has sent nothing for --timeout-s while the others go on
        (stopped, or hung in its own code): a wait for *any* request never notices it while
        the others push. A worker that waits on the servers (a held reply, a round, a pause),
        on the other workers (idle, done, its batches used up), or that said it is busy with
        its own work (QUIET: worker 0 evaluating or writing a checkpoint) is silent by design."""
        timeout = self.cfg.ps.timeout_s
        if not timeout or self.stopping or self.paused_by is not None or \
                now - self._silence_checked < 1.0:
            return
        self._silence_checked = now
        for w, heard in enumerate(self.last_heard):
            if now - heard <= timeout or math.isinf(self.clocks[w]) or w in self.pending or \
                    w in self.held or w in self.idle or w in self.finished_pushing or \
                    w in self.arrived or w in self.quiet:
                continue
            raise StuckError(
                f"parameter server {self.index}: worker {w} (rank {w}) sent nothing for "
                f"{now - heard:.0f} s while the other workers trained (its pushes so far: "
                f"{int(self.clocks[w])}); it has stopped or hangs (waited {timeout:g} s, "
                "--timeout-s). Raise --timeout-s if a worker's own code may pause this long "
                "between two steps.")

    def _next_request(self, status) -> None:
        """Receive the next request header from any worker, or raise StuckError."""
        request = self.comm.Irecv(self.header, source=self.MPI.ANY_SOURCE, tag=Tag.REQUEST)
        try:
            wait_any(self.MPI, [request], self.cfg.ps.timeout_s, self._describe_wait, status)
        except BaseException:
            request.Cancel()
            raise

    def _describe_wait(self) -> str:
        clocks = ", ".join(f"worker {w}: {'done' if math.isinf(c) else int(c)}"
                           for w, c in enumerate(self.clocks))
        held = f"; replies held back for workers {sorted(self.pending)}" if self.pending else ""
        idle = f"; idle: workers {sorted(self.idle)}" if self.idle else ""
        if self.paused_by is not None:
            idle += (f"; worker {self.paused_by} evaluates, replies to workers {sorted(self.held)} "
                     "held until it resumes")
        verdicts = (f"; {len(self.verdicts)} of server 0's round decisions wait for pushes "
                    f"(arrived: workers {sorted(self.arrived)})" if self.verdicts else "")
        return (f"parameter server {self.index}: no request from any worker (pushes so far: "
                f"{clocks}{held}{idle}{verdicts})")

    def _push(self, worker: int, clock: int, lr: float, want_params: bool,
              wants_stop: bool = False, has_gradient: bool = True) -> None:
        self.pushes_received += 1
        self.pushes_without_gradient += not has_gradient
        self.clocks[worker] = clock
        self.idle.discard(worker)  # it pushes again: rounds and pauses count on it again
        if self.bsp and self.backup_workers:
            self._push_backup(worker, lr, want_params, wants_stop, has_gradient)
            return
        self.lr = lr
        if self.bsp:
            self.round_stops |= wants_stop
            self._push_bsp(worker, want_params, has_gradient)
            return
        if wants_stop:
            self._begin_stop()
        # Once stopping, nobody waits for a worker that may already have stopped.
        reply_now = self.stopping or may_proceed(clock, self._bound_clocks(),
                                                 self.staleness_bound)
        if not has_gradient:  # the clock moved on; the parameters did not
            if reply_now:
                self._reply(worker, want_params)
            else:
                self.pending[worker] = want_params
            self._release_pending()
            return
        staleness = self.version - self.pulled_version[worker]
        self.staleness[staleness] += 1
        if self.staleness_lr:  # Zhang et al. 2016: a step of lr / staleness
            factor = staleness_lr_factor(staleness)
            self.lr *= factor
            self.lr_factor_sum += factor
        # send each chunk back as soon as it is updated (unless the reply is held: a pause)
        stream = reply_now and want_params and not self._held_back(worker)
        sends = []
        if stream:
            self._send_debt(worker)
        self.host.sync()  # the worker's gradient stores happened before its header
        for i, (a, b) in enumerate(self.chunks):
            grad = self._gradient_chunk(worker, a, b)
            if self.dc_lambda:
                self._delay_compensate(worker, grad, a, b)
            self._apply(i, grad)
            if stream:
                # Non-blocking: the worker copies chunk i out while this process receives and
                # updates chunk i+1, so the two directions overlap on two cores. Chunk i is not
                # touched again before the Waitall below.
                sends.append(self._send_chunk(worker, i))
        self.version += 1
        if stream:
            self.MPI.Request.Waitall(sends)
            self._mark_pulled(worker)
        elif reply_now:
            self._reply(worker, want_params)
        else:
            self.pending[worker] = want_params
        self._release_pending()

    def _push_bsp(self, worker: int, want_params: bool, has_gradient: bool = True) -> None:
        """Lock-step averaging: sum the round's gradients, apply their mean once, reply to the
        round's workers (all of them; with backup workers the first N-b). A push without a
        gradient (a skipped fp16 step) takes part in the round and counts for its quorum, and
        the mean is over the gradients that came."""
        self._join_round(worker, want_params, has_gradient)
        if self.round_count >= self._round_quorum():
            self._finish_round()

    def _join_round(self, worker: int, want_params: bool, has_gradient: bool) -> None:
        if has_gradient:
            self.host.sync()
            for a, b in self.chunks:
                self.round_sum[a:b] += self._gradient_chunk(worker, a, b)
            self.round_gradients += 1
        self.pending[worker] = want_params  # in the order they joined (followers repeat it)
        self.round_count += 1

    # --- backup workers --------------------------------------------------------------------------
    def _push_backup(self, worker: int, lr: float, want_params: bool, wants_stop: bool,
                     has_gradient: bool) -> None:
        """--backup-workers: the leader judges the push now; a follower waits for its verdict."""
        if not self.is_leader:
            self.arrived[worker] = (want_params, has_gradient, lr)
            self._follow()
            return
        # Computed on parameters that a round closed since (without it) replaced? Pulls do not
        # count: a follower may have served one with parameters older than the leader's.
        if self.push_version[worker] < self.version:
            if wants_stop:  # no round of its own to carry the stop to the others
                self._begin_stop()
            self._tell_followers(Kind.DROP, [worker], wants_stop)
            self._drop_late(worker, want_params, has_gradient)
            return
        self.lr = lr  # the round's rate: that of the push that joined it last
        self.round_stops |= wants_stop
        self._push_bsp(worker, want_params, has_gradient)

    def _tell_followers(self, kind: Kind, workers: list[int], stop: bool) -> None:
        """Send the other servers a verdict: a round's members (in the order they joined) or
        a dropped push; with ``stop``, every worker stops before these replies."""
        if not self.followers:
            return
        header = make_header(kind, clock=self.version, size=len(workers),
                             flags=WANTS_STOP if stop else 0, worker=workers[0])
        members = np.asarray(workers, dtype=np.int64)
        for server in self.followers:
            self.comm.Send(header, dest=server, tag=Tag.REQUEST)
            if kind == Kind.ROUND:
                self.comm.Send(members, dest=server, tag=Tag.VERDICT)

    def _receive_verdict(self, kind: Kind) -> None:
        stop = bool(self.header[H_FLAGS] & WANTS_STOP)
        if kind == Kind.ROUND:
            members = np.empty(int(self.header[H_SIZE]), dtype=np.int64)
            self.comm.Recv(members, source=self.leader_rank, tag=Tag.VERDICT)
            self.verdicts.append((kind, [int(w) for w in members], stop))
        else:
            self.verdicts.append((kind, [int(self.header[H_WORKER])], stop))
        self._follow()

    def _follow(self) -> None:
        """A follower carries out the leader's verdicts in the leader's order, each once every
        push it names has arrived, so its shard goes through the same rounds."""
        while self.verdicts and all(w in self.arrived for w in self.verdicts[0][1]):
            kind, workers, stop = self.verdicts.popleft()
            if kind == Kind.DROP:
                if stop:
                    self._begin_stop()
                want_params, has_gradient, _ = self.arrived.pop(workers[0])
                self._drop_late(workers[0], want_params, has_gradient)
                continue
            for w in workers:
                want_params, has_gradient, self.lr = self.arrived.pop(w)
                self._join_round(w, want_params, has_gradient)
            self.round_stops |= stop
            self._finish_round()

    def _drop_late(self, worker: int, want_params: bool, has_gradient: bool) -> None:
        """Discard a late gradient and send its worker the current parameters at once, so its
        next gradient belongs to the round under way."""
        self.push_version[worker] = self.version
        if has_gradient:
            if worker not in self.shared_grads:  # the chunks are on the wire: take them off
                for a, b in self.chunks:
                    self._gradient_chunk(worker, a, b)
            self.dropped_gradients += 1
        self._reply(worker, want_params)

    def _round_quorum(self) -> int:
        """Pushes that close a round: every running worker under plain --bsp; with backup
        workers the first N-b, or fewer once fewer workers are left to push."""
        pushing = sum(1 for w, c in enumerate(self.clocks)  # IDLE counts with backup workers
                      if not math.isinf(c) and not (self.backup_workers and w in self.idle))
        return bsp_quorum(self.num_workers, self.backup_workers, pushing)

    def _finish_round(self) -> None:
        if self.backup_workers:
            self._tell_followers(Kind.ROUND, list(self.pending), self.round_stops)
        self.gradients_per_round[self.round_gradients] += 1
        if self.round_gradients:
            self.round_sum /= self.round_gradients
            for i, (a, b) in enumerate(self.chunks):
                self._apply(i, self.round_sum[a:b])
            self.staleness[0] += self.round_gradients  # every gradient of a round is fresh
            self.version += 1
            self.round_sum[:] = 0
        self.round_count = self.round_gradients = 0
        if self.round_stops:  # every worker stops after this same round
            self._begin_stop()
        for w, want in sorted(self.pending.items()):
            self.push_version[w] = self.version
            self._reply(w, want)
        self.pending.clear()

    def _gradient_chunk(self, worker: int, a: int, b: int) -> np.ndarray:
        shared = self.shared_grads.get(worker)
        if shared is None:
            grad = self.grad_buffer[: b - a]
            self.comm.Recv(grad, source=worker, tag=Tag.GRAD)
            return grad
        if self.dc_lambda:  # compensation rewrites the gradient: work on a copy, not the worker's
            grad = self.grad_buffer[: b - a]
            grad[:] = shared[a:b]
            return grad
        return shared[a:b]

    def _send_chunk(self, worker: int, chunk: int):
        """Start handing chunk ``chunk`` of the parameters to ``worker``; returns the request."""
        if worker in self.shared_grads:  # same host: the worker copies it out of the window
            self.host.sync()
            return self.comm.Isend(self.ready_words[chunk:chunk + 1], dest=worker, tag=Tag.READY)
        a, b = self.chunks[chunk]
        return self.comm.Isend(self.params.numpy()[a:b], dest=worker, tag=Tag.PARAMS)

    def _apply(self, chunk: int, grad: np.ndarray) -> None:
        self.optimizer.apply(chunk, torch.from_numpy(grad), self.lr)

    def _delay_compensate(self, worker: int, grad: np.ndarray, a: int, b: int) -> None:
        backup = self.backups.get(worker)  # the parameters this worker last received
        if backup is not None:
            delay_compensate(grad, self.dc_lambda, self.params.numpy()[a:b], backup[a:b])

    def _begin_stop(self) -> None:
        """Tell every worker still training to stop after its current step. Sent before the
        replies that follow, so a worker that has its reply has this message too (Open MPI
        delivers one sender's messages in order)."""
        if self.stopping:
            return
        self.stopping = True
        for worker in range(self.num_workers):
            if not math.isinf(self.clocks[worker]):
                self.comm.Send(np.ones(1, dtype=np.int64), dest=worker, tag=Tag.STOP)
        self._send_held()  # nobody waits for an evaluation once stopping


    # --- replies -------------------------------------------------------------------------------
    def _reply(self, worker: int, want_params: bool) -> None:
        if self._held_back(worker):
            self.held[worker] = want_params
            return
        self._send_debt(worker)
        if want_params:
            self._send_params(worker)
        else:
            self.comm.Send(np.zeros(1, dtype=np.int64), dest=worker, tag=Tag.ACK)

    def _held_back(self, worker: int) -> bool:
        """Whether a reply to ``worker`` waits for the evaluating worker's RESUME. Its own
        replies never wait, nor does anyone once the job is stopping."""
        return self.paused_by is not None and worker != self.paused_by and not self.stopping

    def _resume(self, now: float) -> None:
        """The evaluation is over: every held reply goes out, with the parameters of now.

        Server 0 also charges each other worker the time it computed during the pause (until
        its push arrived, or all of it if it is still computing), which the worker then sleeps
        (client.step_done). Every worker's timeline thus shifts by the evaluation's length, as
        if the whole job had frozen while worker 0 evaluated: nobody gains the steps under way,
        and worker 0, whose clock leaves the evaluation out, waits for nobody. A worker that
        was waiting for the others (IDLE) or done owes nothing; only server 0 charges, as
        every push reaches it."""
        if self.is_leader and not self.stopping:
            for w, clock in enumerate(self.clocks):
                if w == self.paused_by or math.isinf(clock) or (
                        w in self.idle and w not in self.computed_in_pause):
                    continue
                debt = self.computed_in_pause.get(w, now - self.pause_started)
                self.debts[w] = self.debts.get(w, 0.0) + debt
                self.debt_seconds += debt
        self.paused_by = None
        self._send_held()

    def _send_debt(self, worker: int) -> None:
        """Before a reply: what ``worker`` owes for the last pauses (see _resume)."""
        debt = self.debts.pop(worker, 0.0)
        if debt > 0 and not self.stopping:
            self.comm.Send(np.array([debt], dtype=np.float64), dest=worker, tag=Tag.DEBT)

    def _send_held(self) -> None:
        held, self.held = self.held, {}
        for worker, want_params in sorted(held.items()):
            self._reply(worker, want_params)

    def _send_params(self, worker: int) -> None:
        self.MPI.Request.Waitall([self._send_chunk(worker, i) for i in range(len(self.chunks))])
        self._mark_pulled(worker)

    def _mark_pulled(self, worker: int) -> None:
        self.pulled_version[worker] = self.version
        if self.dc_lambda:
            backup = self.backups.setdefault(worker, np.empty_like(self.params.numpy()))
            backup[:] = self.params.numpy()

    def _release_pending(self) -> None:
        if self.bsp:
            # A worker that finished mid-round (or, with backup workers, went idle) must not
            # hold the others' round open. A follower's rounds close on the leader's verdicts.
            if self.pending and self.round_count >= self._round_quorum() and (
                    self.is_leader or not self.backup_workers):
                self._finish_round()
            return
        clocks = self._bound_clocks()  # replies move no clock: once for all held workers
        for worker, want in list(self.pending.items()):
            if self.stopping or may_proceed(self.clocks[worker], clocks, self.staleness_bound):
                del self.pending[worker]
                self._reply(worker, want)

    # --- checkpoint state ----------------------------------------------------------------------
    def _send_state(self, dest: int) -> None:
        """Optimizer state as named per-element vectors (momentum_buffer for SGD, exp_avg and
        exp_avg_sq for Adam) plus scalars, so a checkpoint does not depend on the shard layout."""
        vectors = sorted(self.optimizer.vectors)
        self.comm.send({"vectors": vectors, "scalars": self.optimizer.scalars(),
                        "clocks": [c if not math.isinf(c) else -1 for c in self.clocks],
                        "version": self.version,
                        "staleness": dict(self.staleness),
                        **({"dispatch": self.dispatcher.state_dict()} if self.dispatcher else {})},
                       dest=dest, tag=Tag.INFO)
        for name in vectors:
            vector = self.optimizer.vectors[name].numpy()
            for a, b in self.chunks:
                self.comm.Send(vector[a:b], dest=dest, tag=Tag.STATE)

    def _recv_state(self, source: int) -> None:
        meta = self.comm.recv(source=source, tag=Tag.INFO)
        vectors = {name: torch.empty_like(self.params) for name in meta["vectors"]}
        for name in meta["vectors"]:
            for a, b in self.chunks:
                self.comm.Recv(vectors[name].numpy()[a:b], source=source, tag=Tag.STATE)
        self.optimizer.load(vectors, meta["scalars"])
        self.version = int(meta.get("version", 0))

    def statistics(self) -> dict[str, Any]:
        span = self.last_push - self.first_push if self.first_push else 0.0
        return {"server": self.index, "pushes_applied": self.pushes_received,
                "samples": self.samples_received, "push_span_seconds": round(span, 4),
                "samples_per_sec": round(self.samples_received / span, 2) if span else None,
                "pushes_made_by_workers": sum(self.pushes_reported),
                "peak_rss_bytes": peak_rss_bytes(), "rss_at_start_bytes": self.rss_at_start,
                "rss_at_first_push_bytes": self.rss_at_first_push,
                "rss_at_end_bytes": current_rss_bytes(),
                "updates": self.version,
                "pushes_without_gradient": self.pushes_without_gradient,
                "dropped_gradients": self.dropped_gradients,
                **({"eval_pause_debt_seconds": round(self.debt_seconds, 3)}
                   if self.cfg.ps.eval_pauses_workers and self.is_leader else {}),
                **({"gradients_per_round": {int(k): int(v) for k, v in
                                            sorted(self.gradients_per_round.items())}}
                   if self.bsp else {}),
                **({"mean_lr_factor": round(self.lr_factor_sum / max(1, sum(
                    self.staleness.values())), 6)} if self.staleness_lr else {}),
                "staleness_histogram": {int(k): int(v) for k, v in sorted(self.staleness.items())},
                **(self.dispatcher.statistics() if self.dispatcher else {}),
                "busy_seconds": round(self.busy_seconds, 3),
                "wall_seconds": round(time.perf_counter() - self.started, 3)}
