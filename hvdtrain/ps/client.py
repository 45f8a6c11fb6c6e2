"""The worker side of the parameter server: the async update scheme behind the shared trainer.

The replica's parameters are views into one contiguous float32 buffer, so a pull receives
straight into the model's weights; gradients are gathered into a second buffer of the same
layout and pushed shard by shard, chunk by chunk, with buffer-based (never pickled) MPI calls.
A server on the same host reads that gradient buffer in place and the worker copies fresh
parameters out of the server's shard, through an MPI shared-memory window (``shared_memory.py``).
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import numpy as np
import torch

from ..config import Config
from ..layout import Topology
from ..replica import BatchStats, Replica
from ..runtime import Runtime
from ..scheme import BatchFeed, PendingSum, UpdateScheme
from ..precision import PushGate
from ..rules.backup import check_backup_workers
from ..rules.registry import server_rules
from .device_copies import copies_for
from .dispatch import NO_SLOT, BatchDispatcher, SlotPlan, SlotQueue
from .protocol import (HAS_PLAN, HAS_STATE, NO_GRADIENT, WANT_PARAMS, WANT_SLOT, WANTS_STOP, Kind,
                       Tag, chunk_bounds, chunk_elements, make_header, shard_bounds)
from .shared_memory import HostWindow
from .survivors import Survivors, broadcast_surviving, on_current, wait_surviving
from .waiting import wait_any


class ParameterServerClient(UpdateScheme):
    """The async update scheme: push gradients to the servers, pull parameters back.

    What is trained: the parameters that require a gradient, of any floating dtype (float32 ones
    on the replica's first device live in the flat buffer; others, and those of pipeline stages
    on other devices, are copied out of it after each pull). A parameter that got no gradient in
    a step pushes zeros. Buffers (BatchNorm running statistics) are each worker's own: every
    worker starts from worker 0's, and the model that is evaluated and checkpointed carries
    worker 0's, which track its shard of the same data.

    Devices: the servers keep parameters and optimizer state in host memory. A worker computes
    on its replica's device; device_copies.py moves the flat buffers between the two, and is the
    only part that differs between a CPU and a GPU worker.

    Mixed precision and clipping happen here, on the worker, before the push (precision.py):
    the worker unscales its gradient (fp16), clips it, and pushes it in float32, or skips the
    push when the loss scale overflowed. Clipping is the worker's job because each server holds
    only a shard of the gradient, so the whole gradient's norm would take another exchange per
    push, and because it bounds each worker's contribution the way clipping bounds a step in
    single-process training."""

    def __init__(self, cfg: Config, runtime: Runtime, comm, worker_comm, topology: Topology):
        from mpi4py import MPI

        self.MPI = MPI
        self.cfg = cfg
        self.runtime = runtime
        self.comm = comm                # private duplicate of COMM_WORLD: servers and workers
        self.worker_comm = worker_comm  # workers only: start-up agreement, metrics sums
        # The end-of-training agreement has a channel of its own: after a stop signal, workers
        # that stopped at different steps have posted different numbers of sums on worker_comm.
        self.stop_comm = worker_comm.Dup()
        self.topology = topology
        self.worker_rank = worker_comm.Get_rank()
        self.is_main = self.worker_rank == 0  # the lead: after its loss, the lowest live worker
        self._take_lead = None  # the trainer's hand-over of the lead's roles (when_leading)
        self.pull_every = cfg.ps.pull_every
        self._waited = 0.0  # seconds the last step's push waited (take_wait_seconds)
        self.backup_workers = cfg.ps.backup_workers
        check_backup_workers(self.backup_workers, topology.num_workers)  # as the servers do
        self._started = False  # the servers have their INIT: other requests may follow
        self.clock = 0
        self.replica: Replica | None = None
        self.params_flat: torch.Tensor | None = None
        self.grads_flat: torch.Tensor | None = None
        self.routes: list[tuple[int, list[tuple[int, int]]]] = []  # (server rank, chunk ranges)
        self._ack = np.zeros((topology.num_servers, 1), dtype=np.int64)
        self.host: HostWindow | None = None
        # server rank -> (its parameter shard in the shared window, the shard's first element)
        self.shared_params: dict[int, tuple[np.ndarray, int]] = {}
        self._ready: np.ndarray | None = None  # READY words, one per chunk of the whole model
        self._wants_stop = False  # a stop signal arrived here: the next push says so
        self._told_to_stop = False  # a server's STOP arrived
        self._debt = 0.0  # --eval-pauses-workers: seconds to sleep for an evaluation's pause
        self._stops_received = False
        self.feed: _SlotFeed | None = None  # the job's batches, handed out by server 0
        self._slot_word = np.zeros(1, dtype=np.int64)
        # Lost workers (survivors.py): their collectives move to a communicator of the others.
        self.survivors = Survivors(MPI, comm, worker_comm, topology.server_ranks()[0])
        # While it waits for a server under recovery: a frozen worker, lost meanwhile, may wake
        # after the job ended, and leaves when told so rather than time out (survivors.py).
        self._check_ended = self.survivors.check_ended if self.survivors.recovery else None
        self._sums: list[_PendingAllreduce] = []  # every sum_later, in posting order

    @property
    def lr_scale(self) -> float:
        # The server's round policy says (rules/bsp.py, rules/ssp.py).
        num_workers = self.topology.num_workers
        return server_rules(self.cfg.ps, num_workers).policy.lr_scale(num_workers)

    def workers(self) -> tuple[int, int]:
        return self.worker_rank, self.topology.num_workers

    def leads(self) -> bool:
        return self.is_main

    def when_leading(self, take_lead) -> None:
        self._take_lead = take_lead

    def batch_feed(self, steps_per_epoch: int, epochs: int, lookahead: int) -> BatchFeed | None:
        """Progress is the job's (ps/dispatch.py): server 0 hands out the epochs' batches as
        the workers ask, so a fast worker takes more of them and an epoch ends when its
        batches are used up. The round policy says where that holds (its ``fixed_shares``):
        plain --bsp keeps a fixed share per worker, as every round takes one batch of each;
        backup workers take the job's batches, or a straggler whose gradients are dropped
        would train most of its share alone at the end (issue 25)."""
        num_workers = self.topology.num_workers
        if server_rules(self.cfg.ps, num_workers).policy.fixed_shares:
            return None
        plan = SlotPlan(steps_per_epoch, num_workers, epochs)
        # One slot ahead of what the source reads ahead: the next one arrives with each push's
        # reply, so the worker never waits for the hand-out.
        self.feed = _SlotFeed(SlotQueue(plan), depth=1 + lookahead, fetch=self._request_slots)
        return self.feed

    @property
    def steps_agree(self) -> bool:
        return self.feed is None

    def _request_slots(self, count: int, epoch: int) -> None:
        """Ask server 0 for ``count`` more slots and wait for them (at the start, and whenever
        the source reads further ahead than the replies have brought). Under recovery, in the
        last epoch, server 0 holds the reply while a lost worker's batches may come back
        (ps/slot_waiters.py): that takes up to its silence limit, hence the reply's timeout."""
        leader = self.routes[0][0]
        self.comm.Send(make_header(Kind.SLOTS, clock=self.clock, size=count,
                                   worker=self.worker_rank, slot=epoch),
                       dest=leader, tag=Tag.REQUEST)
        slots = np.empty(count, dtype=np.int64)
        wait_any(self.MPI, [self.comm.Irecv(slots, source=leader, tag=Tag.SLOT)],
                 self._reply_timeout_s(), lambda: (
                     f"worker {self.worker_rank}: parameter server 0 handed out no batch"),
                 check=self._check_ended)
        for slot in slots:
            self.feed.queue.receive(int(slot))

    @property
    def eval_partition(self) -> tuple[int, int] | None:
        # Worker 0 scores the whole test split with the servers' current parameters; the other
        # workers keep training instead of waiting for it.
        return (0, 1) if self.is_main else None

    # --- set-up --------------------------------------------------------------------------------
    def attach(self, replica: Replica) -> None:
        self.replica = replica
        # Frozen parameters stay out: the server's optimizer (momentum, weight decay) would move them.
        self.trained = [p for p in replica.model.parameters() if p.requires_grad]
        for p in self.trained:
            if not p.is_floating_point():
                raise ValueError(f"async mode trains floating-point parameters; this model has "
                                 f"a {p.dtype} parameter that requires a gradient")
        total = sum(p.numel() for p in self.trained)
        home = replica.devices[0]
        self.copies = copies_for(home, total)
        self.params_flat = self.copies.host_params  # what the messages carry
        weights = self.copies.device_params         # what the model computes with
        self._copied: list[tuple[torch.nn.Parameter, torch.Tensor]] = []  # not views of it
        offset = 0
        for p in self.trained:
            n = p.numel()
            view = weights[offset:offset + n]
            view.copy_(p.data.reshape(-1))
            if p.dtype == torch.float32 and p.device == view.device:
                p.data = view.view_as(p)  # the weights live in the buffer
            else:
                self._copied.append((p, view))
            offset += n
        self.copies.parameters_to_host()
        # Whether the loss scale lets a step be pushed; built only for --precision fp16 or
        # --clip-grad-norm, as building a torch optimizer imports torch._dynamo (tens of MiB).
        self.gate: PushGate | None = None
        chunk = chunk_elements(self.cfg.ps.chunk_mb)
        for server, (a, b) in zip(self.topology.server_ranks(),
                                  shard_bounds(total, self.topology.num_servers)):
            self.routes.append((server, [(a + x, a + y) for x, y in chunk_bounds(b - a, chunk)]))
        self._bind_gradients(self.copies.new_host_gradients(total))
        self._ready = np.zeros(sum(len(chunks) for _, chunks in self.routes), dtype=np.int64)

    def _bind_gradients(self, buffer: torch.Tensor) -> None:
        """Make ``buffer`` the flat gradient the messages carry, and gather the parameters'
        gradients into one view per parameter of it (or of its copy on the device)."""
        self.grads_flat = buffer
        target = self.copies.gradient_target(buffer)
        offset, self._grad_views = 0, []
        for p in self.trained:
            self._grad_views.append(target[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
        self._chunks = [chunk for _, chunks in self.routes for chunk in chunks]

    def start(self, state: dict[str, Any] | None, resuming: bool) -> None:
        """Collective over workers: worker 0 seeds the servers (its initial weights, or the
        checkpoint's weights and optimizer state) and the other workers' buffers; then every
        worker pulls."""
        total = self.params_flat.numel()
        server_state = state.get("server_state") if state else None
        headers = []
        if self.is_main and state is not None:
            self.replica.model.load_state_dict(state["model"])
            self.replica.precision.load_state_dict(state.get("grad_scaler"))  # worker 0's scale
            self._flatten_copied()
            self.copies.parameters_to_host()
        buffers = self.worker_comm.bcast(
            {k: v.cpu() for k, v in self.replica.model.named_buffers()} if self.is_main else None,
            root=0)
        if not self.is_main:
            own = dict(self.replica.model.named_buffers())
            for name, value in buffers.items():
                own[name].copy_(value)
        if self.is_main:
            flags = HAS_STATE if server_state else 0
            headers = [self.comm.Isend(make_header(Kind.INIT, size=total, flags=flags | (
                HAS_PLAN if self.feed is not None and i == 0 else 0)), dest=server,
                tag=Tag.REQUEST) for i, (server, _) in enumerate(self.routes)]
        # Collective with the servers on this host, which create it on receiving the INIT header
        # (that is how they learn the model's size).
        self.host = HostWindow(self.comm, 4 * total, self.cfg.ps.shared_memory)
        me = self.comm.Get_rank()
        if self.host.shares_host(me):
            self._bind_gradients(torch.from_numpy(self.host.segment(me)))
            self.grads_flat.zero_()
        for (server, _), (first, _) in zip(self.routes,
                                           shard_bounds(total, self.topology.num_servers)):
            if self.host.shares_host(server):
                self.shared_params[server] = (self.host.segment(server), first)
        if self.is_main:
            self.MPI.Request.Waitall(headers)
            self._send_init_payload(server_state)
            if self.feed is not None:
                self._send_plan(state)
        self.pull()
        self._started = True

    def _send_plan(self, state: dict[str, Any] | None) -> None:
        """Server 0 gets the job's batch plan: a checkpoint's position in it, or, from a
        checkpoint written without one (lock-step rounds, an older version), the start of the
        checkpoint's step."""
        plan = self.feed.queue.plan
        position = (state.get("server_state") or {}).get("dispatch") if state else None
        if position is None and state is not None:
            position = {"plan": plan.as_list(), "outstanding": [],
                        "next": plan.first_slot(state["epoch"], state.get("step", 0))}
        if position is not None:
            note = BatchDispatcher(plan).load_state_dict(position)  # as server 0 will
            if note:
                print(f"hvdtrain: warning: {note}", flush=True)
        self.comm.send({"plan": plan.as_list(), "state": position}, dest=self.routes[0][0],
                       tag=Tag.INFO)

    def _send_init_payload(self, server_state: dict[str, Any] | None) -> None:
        params = self.params_flat.numpy()
        for server, chunks in self.routes:
            for a, b in chunks:
                self.comm.Send(params[a:b], dest=server, tag=Tag.PARAMS)
            if server_state:
                self.comm.send({"vectors": sorted(server_state["vectors"]),
                                "scalars": server_state["scalars"],
                                "version": server_state.get("version", 0)},
                               dest=server, tag=Tag.INFO)
                for name in sorted(server_state["vectors"]):
                    vector = server_state["vectors"][name].numpy()
                    for a, b in chunks:
                        self.comm.Send(np.ascontiguousarray(vector[a:b]), dest=server, tag=Tag.STATE)

    # --- the hot path --------------------------------------------------------------------------
    def step(self, x: Any, y: Any, lr: float) -> BatchStats:
        for p in self.trained:
            p.grad = None
        stats = self.replica.forward_backward(x, y, grad_scale=1.0)
        finite = True
        if self.replica.precision.needs_synchronized_gradients:
            if self.gate is None:
                self.gate = PushGate(self.trained)
            finite = self.replica.update(self.gate)  # unscale, clip; False: fp16 overflowed
        if finite:
            for p, view in zip(self.trained, self._grad_views):
                if p.grad is None:  # unused in this step's graph
                    view.zero_()
                else:
                    view.copy_(p.grad)
            self.copies.gradients_to_host(self._chunks)
        started = time.perf_counter()  # the push and the reply: the wait for the servers
        self.push(lr, samples=stats.count,
                  want_params=self.clock % self.pull_every == self.pull_every - 1,
                  gradient=finite)
        self._waited = time.perf_counter() - started
        if self.cfg.ps.eval_pauses_workers:
            self._receive_debt()
        if not self._told_to_stop:
            self._told_to_stop = self.comm.Iprobe(source=self.MPI.ANY_SOURCE, tag=Tag.STOP)
        self._regroup()
        return stats

    def _regroup(self) -> bool:
        """After server 0 said a worker was lost: the survivors' communicators, and the sums
        that some survivor had not completed posted again on them (survivors.py)."""
        if not self.survivors.poll():
            return False
        self.worker_comm, self.stop_comm = self.survivors.communicators()
        completed = next((i for i, s in enumerate(self._sums) if not s.ready()), len(self._sums))
        for pending in self._sums[self.survivors.agree_completed(self.worker_comm, completed):]:
            pending.post(self.worker_comm)
        if not self.is_main and self.worker_comm.Get_rank() == 0:  # the lead was lost
            self.is_main = True
            print(f"hvdtrain: the lead worker was lost; worker {self.worker_rank} takes over "
                  "its roles: evaluation, checkpoints and the log", flush=True)
            if self._take_lead is not None:
                self._take_lead()
        return True

    def take_wait_seconds(self) -> float:
        waited, self._waited = self._waited, 0.0
        return waited

    def agree_to_stop(self, wants: bool) -> bool:
        """The servers coordinate a stop: this worker's next push carries its signal, and every
        server then sends each worker one STOP message. Without lock-step rounds each worker
        stops after its own current step; with --bsp the servers send it when the round that
        carried the signal closes, so every worker stops after that same round."""
        self._wants_stop = self._wants_stop or wants
        if self._told_to_stop:
            self._receive_stops()
        return self._told_to_stop

    def _receive_stops(self) -> None:
        """The STOP every server sends each worker, once: none is left unreceived."""
        if self._stops_received:
            return
        # It pushes no more, and a round still open may be waiting for it (--backup-workers).
        self._going_idle()
        words = np.empty((len(self.routes), 1), dtype=np.int64)
        stops = [self.comm.Irecv(words[i], source=server, tag=Tag.STOP)
                 for i, (server, _) in enumerate(self.routes)]
        while wait_any(self.MPI, stops, self.cfg.ps.timeout_s, lambda: (
                f"worker {self.worker_rank}: not every parameter server confirmed the stop"),
                check=self._check_ended) != self.MPI.UNDEFINED:
            pass
        self._stops_received = True

    def push(self, lr: float, samples: int = 0, want_params: bool = True,
             gradient: bool = True) -> None:
        """Send the gradient buffer to the servers; with want_params, receive fresh parameters
        into the model's weights. Returns once the servers allow this worker to go on. Without
        a ``gradient`` (an fp16 step that overflowed) the push counts for the clocks and rounds
        but carries nothing to apply."""
        self.clock += 1
        self._exchange(Kind.PUSH, lr=lr, want_params=want_params, send_grads=gradient,
                       size=samples)

    def pull(self) -> None:
        self._exchange(Kind.PULL, lr=0.0, want_params=True, send_grads=False)

    def _exchange(self, kind: Kind, lr: float, want_params: bool, send_grads: bool,
                  size: int = 0) -> None:
        """One request to every server, all in flight at once: post the receives for the reply
        first, then the header and gradient chunks, then wait for everything. A chunk from a
        server on this host arrives as a READY word and is copied out of the shared window as
        soon as it is announced, while the server updates the next one."""
        if want_params:
            self.copies.before_parameters()
        # copies[i]: the parameters [a, b) that requests[i] brings, None for other messages
        requests, copies = self._post_replies(want_params)
        slot = self.feed.queue.current() if self.feed and kind == Kind.PUSH else NO_SLOT
        if slot != NO_SLOT:  # server 0 sends the next slot before the reply
            requests.append(self.comm.Irecv(self._slot_word, source=self.routes[0][0],
                                            tag=Tag.SLOT))
            copies.append(None)
        header = self._header(kind, lr, size, want_params, send_grads, slot)
        sends = self._send_request(header, send_grads)
        requests, copies = requests + sends, copies + [None] * len(sends)
        self._complete(kind, requests, copies)
        if slot != NO_SLOT:
            self.feed.queue.receive(int(self._slot_word[0]))
        if want_params:
            self.copies.parameters_done()
            for p, view in self._copied:
                p.data.copy_(view.view_as(p))

    def _post_replies(self, want_params: bool) -> tuple[list, list]:
        """The receives of every server's reply: its ACK, or its parameter chunks (READY words
        from a server on this host); (requests, the parameters each brings)."""
        params = self.params_flat.numpy()
        requests, copies = [], []
        ready = iter(range(len(self._ready)))
        for i, (server, chunks) in enumerate(self.routes):
            if not want_params:
                requests.append(self.comm.Irecv(self._ack[i], source=server, tag=Tag.ACK))
                copies.append(None)
                continue
            shared = self.shared_params.get(server)
            for a, b in chunks:
                if shared is None:
                    requests.append(self.comm.Irecv(params[a:b], source=server, tag=Tag.PARAMS))
                    copies.append((a, b, None, 0))
                else:
                    k = next(ready)
                    requests.append(self.comm.Irecv(self._ready[k:k + 1], source=server,
                                                    tag=Tag.READY))
                    copies.append((a, b, *shared))
        return requests, copies

    def _header(self, kind: Kind, lr: float, size: int, want_params: bool, send_grads: bool,
                slot: int) -> np.ndarray:
        flags = (WANT_PARAMS if want_params else 0) | \
            (WANTS_STOP if self._wants_stop and kind == Kind.PUSH else 0) | \
            (NO_GRADIENT if kind == Kind.PUSH and not send_grads else 0) | \
            (WANT_SLOT if slot != NO_SLOT else 0)
        return make_header(kind, clock=self.clock, lr=lr, size=size, flags=flags,
                           worker=self.worker_rank, slot=slot)

    def _send_request(self, header: np.ndarray, send_grads: bool) -> list:
        """The header to every server, then the gradient chunks (in place in the shared window
        for a server on this host); the sends still in flight."""
        grads = self.grads_flat.numpy()
        sends = []
        # Chunk numbers run over self._chunks: server by server, as gradients_to_host copies them.
        first_chunk = np.cumsum([0] + [len(chunks) for _, chunks in self.routes])
        if send_grads:
            for (server, chunks), first in zip(self.routes, first_chunk):
                if server in self.shared_params:  # the server reads it once the header arrives
                    for n in range(first, first + len(chunks)):
                        self.copies.wait_gradient(n)
            self.host.sync()  # publish the gradient stores before the header announces them
        for (server, chunks), first in zip(self.routes, first_chunk):
            self.comm.Send(header, dest=server, tag=Tag.REQUEST)
            if send_grads and server not in self.shared_params:
                for n, (a, b) in enumerate(chunks, start=first):
                    self.copies.wait_gradient(n)  # the copies of later chunks go on meanwhile
                    sends.append(self.comm.Isend(grads[a:b], dest=server, tag=Tag.GRAD))
        return sends

    def _reply_timeout_s(self) -> float:
        """Under recovery a reply held for a dead worker (--staleness, --bsp) comes once server
        0 drops it, which takes up to --timeout-s after its last push (silence.py): waiting
        only as long would time out just as the server lets this worker go."""
        return self.cfg.ps.timeout_s * (2 if self.survivors.recovery else 1)

    def _complete(self, kind: Kind, requests: list, copies: list) -> None:
        """Wait for every request; copy each parameter chunk to the device as it arrives."""
        params = self.params_flat.numpy()
        while True:
            index = wait_any(self.MPI, requests, self._reply_timeout_s(),
                             lambda: self._no_reply(kind), check=self._check_ended)
            if index == self.MPI.UNDEFINED:
                break
            if copies[index] is not None:
                a, b, shard, first = copies[index]
                if shard is not None:  # announced by a READY word: copy it out of the window
                    self.host.sync()
                    params[a:b] = shard[a - first:b - first]
                self.copies.parameters_to_device(a, b)

    def _no_reply(self, kind: Kind) -> str:
        """Why a reply may not come: a server died (a killed one looks like this: Open MPI
        reports no error), or, under a staleness bound or lock-step rounds, it holds the reply
        for a worker that stopped."""
        held = (self.cfg.ps.bsp or self.cfg.ps.staleness != float("inf")) and \
            self.topology.num_workers > 1
        return (f"worker {self.worker_rank}: no reply from the parameter server to its "
                f"{kind.name} (clock {self.clock}): a server process died, hangs or was cut off"
                + ("; or it holds the reply until the slowest worker catches up (--staleness, "
                   "--bsp), and that worker stopped" if held else ""))

    def _flatten_copied(self) -> None:
        """After the model's non-float32 parameters changed (a checkpoint), refresh the buffer."""
        for p, view in self._copied:
            view.copy_(p.data.reshape(-1))

    # --- what the trainer needs besides steps ----------------------------------------------------
    def _going_idle(self) -> None:
        """Before this worker waits for the others (a blocking collective of workers): with
        --backup-workers the others may be waiting for a round of N-b pushes that this worker
        would never join, so tell server 0, which decides every shard's rounds, not to count
        on it until its next push. Plain --bsp needs no such message: its workers never drift
        apart. With --eval-pauses-workers every server is told, so that an evaluation's pause
        charges a waiting worker nothing (pauses.EvalPauses.resume). Under mpirun's recovery
        settings server 0 is told too: a worker waiting for the others is silent by design,
        and would otherwise be taken for lost before a dead worker that it waits for, whose
        silence limit may be longer (silence.py; seen with --stop-at, which ends the job in
        the end-of-training agreement)."""
        if not self._started:
            return
        bounded = not self.cfg.ps.bsp and self.cfg.ps.staleness != float("inf")
        # nor does a pause charge it, nor a staleness bound hold the others back for its clock
        # (the job's batches are not shared out evenly, so a worker meeting the others at an
        # epoch's end may be behind them): every server
        if self.cfg.ps.eval_pauses_workers or bounded:
            self._tell_servers(Kind.IDLE)
        elif self.backup_workers or self.survivors.recovery:
            leader = self.routes[0][0]
            self.comm.Send(make_header(Kind.IDLE, clock=self.clock, worker=self.worker_rank),
                           dest=leader, tag=Tag.REQUEST)

    def sum_across_workers(self, values: list[float]) -> list[float]:
        self._going_idle()
        return self.sum_later(values).wait()

    def sum_later(self, values: list[float]) -> PendingSum:
        """A non-blocking sum over the workers: a fast worker posts its epoch's figures and
        trains on; the sum completes once the slowest worker has posted the same epoch's."""
        pending = _PendingAllreduce(np.asarray(values, dtype=np.float64), self.MPI,
                                    self.cfg.ps.timeout_s, self.worker_rank, self._regroup)
        pending.post(self.worker_comm)
        self._sums.append(pending)
        return pending

    def _agree(self, value: int, op, what: str) -> int:
        """An Allreduce of one word over the workers on stop_comm, posted again on the
        survivors' one when a worker is lost meanwhile."""
        mine = np.array([value], dtype=np.int64)
        result = np.zeros(1, dtype=np.int64)
        request = on_current(lambda: self.stop_comm,
                             lambda comm: comm.Iallreduce(mine, result, op=op))
        wait_surviving(request, self._regroup, self.cfg.ps.timeout_s,
                       lambda: f"worker {self.worker_rank}: not every worker reached {what}")
        return int(result[0])

    def sums_posted_everywhere(self, posted: int) -> int:
        # On stop_comm, after end_of_training: every stopped worker gets here once, whichever
        # step it stopped at, while worker_comm may still hold the sums the others never join.
        return self._agree(posted, self.MPI.MIN, "the end of its log")

    def broadcast_object(self, obj: Any) -> Any:
        self._going_idle()
        if not self.survivors.recovery:
            return self.worker_comm.bcast(obj, root=0)
        return broadcast_surviving(obj, lambda: self.worker_comm, self._regroup,
                                   self.cfg.ps.timeout_s, lambda: (
                                       f"worker {self.worker_rank}: the lead's broadcast never "
                                       "came (--early-stop-patience waits for its evaluation)"))

    def eval_replica(self) -> Replica:
        self.pull()  # score the servers' current parameters
        return self.replica

    @contextlib.contextmanager
    def evaluating(self):
        """--eval-pauses-workers: the servers hold the other workers' replies while this worker
        evaluates, and charge each of them the time it computed meanwhile, which it then
        sleeps (_receive_debt): as if the job froze, so that nobody trains during an
        evaluation, as in sync mode."""
        if self._started and self.eval_partition is not None:
            self._tell_servers(Kind.QUIET)  # a long evaluation is no hang (silence.py)
        if not (self.cfg.ps.eval_pauses_workers and self._started and
                self.eval_partition is not None):
            yield
            return
        self._tell_servers(Kind.PAUSE)
        try:
            yield
        finally:
            self._tell_servers(Kind.RESUME)

    def _receive_debt(self) -> None:
        """After a reply: the seconds server 0 charged for an evaluation's pause (sent before
        the reply, so it has arrived), to be slept after the step (step_done), outside the
        step's own time, which a straggler's slowdown multiplies."""
        leader = self.routes[0][0]
        while self.comm.Iprobe(source=leader, tag=Tag.DEBT):
            word = np.empty(1, dtype=np.float64)
            self.comm.Recv(word, source=leader, tag=Tag.DEBT)
            self._debt += float(word[0])

    def step_done(self, progress) -> None:
        if self._debt > 0:
            time.sleep(self._debt)
            self._debt = 0.0

    def _tell_servers(self, kind: Kind) -> None:
        for server, _ in self.routes:
            self.comm.Send(make_header(kind, clock=self.clock, worker=self.worker_rank),
                           dest=server, tag=Tag.REQUEST)

    def take_epoch_metrics(self) -> dict:
        return self.copies.take_epoch_metrics()  # a GPU worker's copies: seconds and bytes

    def end_of_training(self) -> bool:
        # The final evaluation and checkpoint must include every worker's last update; a worker
        # that finished its epochs learns here whether another one was stopped by a signal.
        self._going_idle()  # it pushes no more
        anyone = self._agree(int(self._told_to_stop), self.MPI.MAX, "the end of training")
        if anyone:
            self._told_to_stop = True  # the servers sent this worker a STOP too
            self._receive_stops()
        return bool(anyone)

    def state_dict(self) -> dict[str, Any]:
        """Worker 0 asks every server for its shard and optimizer state; others return {}."""
        if not self.is_main:
            return {}
        vectors: dict[str, np.ndarray] = {}
        meta: dict[str, Any] = {}
        dispatch = None
        self._exchange(Kind.SAVE, lr=0.0, want_params=True, send_grads=False)
        for server, chunks in self.routes:
            meta = self.comm.recv(source=server, tag=Tag.INFO)
            dispatch = meta.get("dispatch", dispatch)  # server 0's
            for name in meta["vectors"]:
                vector = vectors.setdefault(name, np.empty(self.params_flat.numel(), np.float32))
                for a, b in chunks:
                    self.comm.Recv(vector[a:b], source=server, tag=Tag.STATE)
        self._tell_servers(Kind.QUIET)  # the write follows: no hang however long it takes
        model_state = {k: v.clone() for k, v in self.replica.model.state_dict().items()}
        scale = self.replica.precision.state_dict()
        return {"model": model_state, **({"grad_scaler": scale} if scale is not None else {}),
                "server_state": {"vectors": {k: torch.from_numpy(v) for k, v in vectors.items()},
                                 "scalars": meta.get("scalars", {}),
                                 "clocks": meta.get("clocks", []),
                                 "version": meta.get("version", 0),
                                 "staleness_histogram": meta.get("staleness", {}),
                                 **({"dispatch": dispatch} if dispatch else {})}}

    def close(self) -> dict[str, Any] | None:
        """Tell the servers this worker is done; worker 0 collects their final statistics."""
        for server, _ in self.routes:
            self.comm.Send(make_header(Kind.DONE, clock=self.clock), dest=server, tag=Tag.REQUEST)
        stats = ([self.comm.recv(source=server, tag=Tag.INFO) for server, _ in self.routes]
                 if self.is_main else [])
        self.survivors.poll()
        if not self.survivors.lost:  # a lost worker never joins the collective
            self.host.close()  # collective with the servers, which close after the last DONE
        if not self.is_main:
            return None
        # Every server sees every push (each holds a shard), so server 0's counts are the job's.
        return {"servers": stats, "staleness_histogram": stats[0]["staleness_histogram"],
                "pushes_applied": stats[0]["pushes_applied"],
                "pushes_made_by_workers": stats[0]["pushes_made_by_workers"],
                "samples": stats[0]["samples"],
                "samples_per_sec": stats[0]["samples_per_sec"],
                **{k: stats[0][k] for k in ("batches_completed", "batches_per_worker",
                                            "batches_left", "batches_handed_back",
                                            "workers_lost",
                                            "workers_replaced") if k in stats[0]}}


class _PendingAllreduce(PendingSum):
    def __init__(self, send: np.ndarray, MPI, timeout_s: float, worker: int, regroup):
        super().__init__()
        self.send, self.result = send, np.empty_like(send)  # buffers live until done
        self.MPI, self.timeout_s, self.worker, self.regroup = MPI, timeout_s, worker, regroup
        self.request, self.done = None, False

    def post(self, comm) -> None:
        """Post the sum on ``comm`` (again, on the survivors' one, after a lost worker)."""
        self.request = comm.Iallreduce(self.send, self.result, op=self.MPI.SUM)
        self.done = False

    def ready(self) -> bool:
        self.done = self.done or self.request.Test()
        return self.done

    def wait(self) -> list[float]:
        if not self.done:
            wait_surviving(lambda: self.request, self.regroup, self.timeout_s, lambda: (
                f"worker {self.worker}: the other workers never reported the epoch's metrics"))
            self.done = True
        return self.result.tolist()


class _SlotFeed(BatchFeed):
    """The trainer's view of the slots server 0 hands this worker (scheme.BatchFeed)."""

    def __init__(self, queue: SlotQueue, depth: int, fetch):
        self.queue = queue
        self.num_parts = queue.plan.num_parts
        self.depth = depth  # slots this worker holds ahead: 1 + what its source reads ahead
        self.fetch = fetch

    def next_part(self, epoch: int) -> tuple[int, int, int] | None:
        q = self.queue
        if not q.queued and not q.exhausted:
            self.fetch(max(1, self.depth - len(q.training)), epoch)
        return q.next_of_epoch(epoch)

    def part_trained(self) -> tuple[int, int, int] | None:
        return self.queue.trained()
