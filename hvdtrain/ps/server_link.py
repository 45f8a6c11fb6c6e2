"""A worker's wire to the parameter servers: the routes of its chunks, the flat buffers the
messages carry, and every message it exchanges with them (ps/client.py decides when).

One request goes to every server at once: the receives for the reply are posted first, then
the header and the gradient chunks, then everything is waited for. A server on the same host
reads the gradient buffer in place and announces each fresh parameter chunk with a READY word,
through an MPI shared-memory window (``shared_memory.py``)."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch

from ..flat_views import shaped_views
from .dispatch import NO_SLOT
from .protocol import (H_FLAGS, HAS_PLAN, HAS_STATE, NO_GRADIENT, SLOT_LIST, WANT_PARAMS,
                       WANT_SLOT, WANTS_STOP, Kind, Tag, chunk_bounds, chunk_elements,
                       make_header, shard_bounds)
from .shared_memory import HostWindow
from .waiting import wait_any
from .wire import WorkerWire


def reply_limit(recovery: bool) -> str:
    """What ServerLink.reply_timeout_s is, for its message."""
    return ("twice --timeout-s under the recovery settings, the time a server takes to drop a "
            "dead worker whose reply it holds" if recovery else "--timeout-s")


class ServerLink:
    """The messages of worker ``worker`` to the servers of ``topology`` over ``comm``.

    ``ps``: the config's ps section (chunk size, timeouts, the rules a held reply depends on);
    ``recovery``: mpirun's recovery settings are on, so a reply held for a dead worker comes
    only once server 0 drops it; ``check_ended``: called while waiting, raises when the job
    ended without this worker (survivors.py)."""

    def __init__(self, MPI, comm, topology, worker: int, ps, recovery: bool,
                 check_ended: Callable[[], None] | None):
        self.MPI, self.comm, self.topology = MPI, comm, topology
        self.worker, self.ps, self.recovery, self.check_ended = worker, ps, recovery, check_ended
        self.routes: list[tuple[int, list[tuple[int, int]]]] = []  # (server rank, chunk ranges)
        self._ack = np.zeros((topology.num_servers, 1), dtype=np.int64)
        self.host: HostWindow | None = None
        # server rank -> (its parameter shard in the shared window, the shard's first element)
        self.shared_params: dict[int, tuple[np.ndarray, int]] = {}
        self._ready: np.ndarray | None = None  # READY words, one per chunk of the whole model
        self._slot_word = np.zeros(1, dtype=np.int64)
        self.copies = None
        self.params_flat: torch.Tensor | None = None
        self.grads_flat: torch.Tensor | None = None
        self.grad_views: list[torch.Tensor] = []
        self.chunks: list[tuple[int, int]] = []

    @property
    def leader(self) -> int:
        return self.routes[0][0]

    # --- set-up --------------------------------------------------------------------------------
    def lay_out(self, copies, total: int) -> None:
        """The routes of a model of ``total`` elements, whose buffers ``copies`` holds."""
        self.copies = copies
        self.params_flat = copies.host_params  # what the messages carry
        chunk = chunk_elements(self.ps.chunk_mb)
        for server, (a, b) in zip(self.topology.server_ranks(),
                                  shard_bounds(total, self.topology.num_servers)):
            self.routes.append((server, [(a + x, a + y) for x, y in chunk_bounds(b - a, chunk)]))
        self._ready = np.zeros(sum(len(chunks) for _, chunks in self.routes), dtype=np.int64)
        self.wire = WorkerWire(self.ps.wire_dtype, total)  # --wire-dtype's buffers

    def bind_gradients(self, buffer: torch.Tensor, trained: list[torch.nn.Parameter]) -> None:
        """Make ``buffer`` the flat gradient the messages carry, and gather the parameters'
        gradients into one view per parameter of it (or of its copy on the device)."""
        self.grads_flat = buffer
        self.grad_views = shaped_views(self.copies.gradient_target(buffer), trained)
        self.chunks = [chunk for _, chunks in self.routes for chunk in chunks]

    def announce(self, total: int, server_state: bool, plan: bool) -> list:
        """Worker 0's INIT header to every server (the model's size; a checkpoint's state and
        the batch plan follow); the sends in flight."""
        flags = HAS_STATE if server_state else 0
        return [self.comm.Isend(make_header(Kind.INIT, size=total, flags=flags | (
            HAS_PLAN if plan and i == 0 else 0)), dest=server, tag=Tag.REQUEST)
            for i, (server, _) in enumerate(self.routes)]

    def open_window(self, total: int, trained: list[torch.nn.Parameter],
                    enabled: bool) -> None:
        """Collective with the servers on this host, which create it on receiving the INIT
        header (that is how they learn the model's size)."""
        self.host = HostWindow(self.comm, 4 * total, enabled)
        me = self.comm.Get_rank()
        if self.host.shares_host(me):
            self.bind_gradients(torch.from_numpy(self.host.segment(me)), trained)
            self.grads_flat.zero_()
        for (server, _), (first, _) in zip(self.routes,
                                           shard_bounds(total, self.topology.num_servers)):
            if self.host.shares_host(server):
                self.shared_params[server] = (self.host.segment(server), first)
        # A GPU worker's copies to and from the window run as DMA once its pages are pinned.
        self.copies.pin_window([shard for shard, _ in self.shared_params.values()] + (
            [self.grads_flat.numpy()] if self.host.shares_host(me) else []))

    def send_init_payload(self, server_state: dict[str, Any] | None,
                          place: tuple[str, dict[str, Any]] | None) -> None:
        """INIT's parameters, and on resume the checkpoint's server state: where each server's
        shard lies (``place``: the checkpoint's path and position; shard_file.py), or the
        optimizer vectors that an older checkpoint kept inside it."""
        params = self.params_flat.numpy()
        vectors = server_state.get("vectors", {}) if server_state else {}
        for server, chunks in self.routes:
            for a, b in chunks:
                self.comm.Send(params[a:b], dest=server, tag=Tag.PARAMS)
            if server_state:
                self.comm.send({"vectors": sorted(vectors),
                                "scalars": server_state.get("scalars", {}),
                                "version": server_state.get("version", 0),
                                "shards": server_state.get("shards"), "place": place},
                               dest=server, tag=Tag.INFO)
                for name in sorted(vectors):
                    vector = vectors[name].numpy()
                    for a, b in chunks:
                        self.comm.Send(np.ascontiguousarray(vector[a:b]), dest=server, tag=Tag.STATE)

    # --- the hot path --------------------------------------------------------------------------
    def exchange(self, kind: Kind, header: dict[str, Any], want_params: bool, send_grads: bool,
                 queue, slots: list[int] | None = None, step_us: int = 0) -> int:
        """One request to every server, all in flight at once: post the receives for the reply
        first, then the header and gradient chunks, then wait for everything. A chunk from a
        server on this host arrives as a READY word and is copied out of the shared window as
        soon as it is announced, while the server updates the next one. ``header``: the
        request's clock, lr, size and wants_stop; ``queue``: the slots of the job's batches
        (server 0 sends the next one with a push's reply), or None. ``slots``: the slots a
        push of async DiLoCo's round trained (several; server 0 sends as many new ones), in
        place of the queue's current one, with ``step_us``, this worker's time per step in
        microseconds (0: not measured). Returns the fastest worker's that server 0 knows (0:
        none), for --dynamic-local-steps."""
        if want_params:
            self.copies.before_parameters()
        # copies[i]: the parameters [a, b) that requests[i] brings, None for other messages
        requests, copies = self._post_replies(want_params, kind)
        slot = queue.current() if queue is not None and kind == Kind.PUSH else NO_SLOT
        listed = None  # async DiLoCo's push: the slots its round trained, each answered anew
        if slots is not None and queue is not None:
            listed = np.array([*slots, step_us], dtype=np.int64)
            slot = len(slots) or NO_SLOT  # H_SLOT: how many follow (then the step time)
        answer = self._slot_word if listed is None else np.empty(listed.size, np.int64)
        if slot != NO_SLOT:  # server 0 sends the next slot(s) before the reply
            requests.append(self.comm.Irecv(answer, source=self.leader, tag=Tag.SLOT))
            copies.append(None)
        words = self._header(kind, want_params=want_params, send_grads=send_grads, slot=slot,
                             **header)
        if listed is not None and slot != NO_SLOT:
            words[H_FLAGS] |= SLOT_LIST
        sends = self._send_request(words, send_grads)
        if listed is not None and slot != NO_SLOT:  # server 0 reads them after the header
            sends.append(self.comm.Isend(listed, dest=self.leader, tag=Tag.SLOT))
        requests, copies = requests + sends, copies + [None] * len(sends)
        self._complete(kind, header["clock"], requests, copies)
        fastest = 0
        if slot != NO_SLOT:
            if listed is not None:  # the new slots, then the fastest step time
                answer, fastest = answer[:-1], int(answer[-1])
            for word in answer:
                queue.receive(int(word))
        if want_params:
            self.copies.parameters_done()
        return fastest

    def _post_replies(self, want_params: bool, kind: Kind) -> tuple[list, list]:
        """The receives of every server's reply: its ACK, or its parameter chunks (READY words
        from a server on this host; a push's in --wire-dtype); (requests, the parameters each
        brings)."""
        requests, copies = [], []
        self.wire.reply_kind(kind)
        ready = iter(range(len(self._ready)))
        for i, (server, chunks) in enumerate(self.routes):
            if not want_params:
                requests.append(self.comm.Irecv(self._ack[i], source=server, tag=Tag.ACK))
                copies.append(None)
                continue
            shared = self.shared_params.get(server)
            for a, b in chunks:
                if shared is None:
                    target = self.wire.params_target(self.params_flat, a, b)
                    requests.append(self.comm.Irecv(target, source=server, tag=Tag.PARAMS))
                    copies.append((a, b, None, 0))
                else:
                    k = next(ready)
                    requests.append(self.comm.Irecv(self._ready[k:k + 1], source=server,
                                                    tag=Tag.READY))
                    copies.append((a, b, *shared))
        return requests, copies

    def _header(self, kind: Kind, clock: int, lr: float, size: int, wants_stop: bool,
                want_params: bool, send_grads: bool, slot: int) -> np.ndarray:
        flags = (WANT_PARAMS if want_params else 0) | \
            (WANTS_STOP if wants_stop and kind == Kind.PUSH else 0) | \
            (NO_GRADIENT if kind == Kind.PUSH and not send_grads else 0) | \
            (WANT_SLOT if slot != NO_SLOT else 0)
        return make_header(kind, clock=clock, lr=lr, size=size, flags=flags,
                           worker=self.worker, slot=slot)

    def _send_request(self, header: np.ndarray, send_grads: bool) -> list:
        """The header to every server, then the gradient chunks (in place in the shared window
        for a server on this host); the sends still in flight."""
        sends = []
        # Chunk numbers run over self.chunks: server by server, as gradients_to_host copies them.
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
                    sends.append(self.comm.Isend(self.wire.gradient(self.grads_flat, a, b),
                                                 dest=server, tag=Tag.GRAD))
        return sends

    def reply_timeout_s(self) -> float:
        """Under recovery a reply held for a dead worker (--staleness, --bsp) comes once server
        0 drops it, which takes up to --timeout-s after its last push (silence.py): waiting
        only as long would time out just as the server lets this worker go."""
        return self.ps.timeout_s * (2 if self.recovery else 1)

    def _complete(self, kind: Kind, clock: int, requests: list, copies: list) -> None:
        """Wait for every request; copy each parameter chunk to the device as it arrives."""
        while True:
            index = wait_any(self.MPI, requests, self.reply_timeout_s(),
                             lambda: self._no_reply(kind, clock), check=self.check_ended,
                             limit=reply_limit(self.recovery))
            if index == self.MPI.UNDEFINED:
                break
            if copies[index] is not None:
                a, b, shard, first = copies[index]
                if shard is not None:  # announced by a READY word: copy it out of the window
                    self.host.sync()
                    self.copies.parameters_from_window(shard[a - first:b - first], a, b)
                else:  # a message: widened out of the wire dtype (float32: received in place)
                    self.wire.params_arrived(self.params_flat, a, b)
                    self.copies.parameters_to_device(a, b)

    def _no_reply(self, kind: Kind, clock: int) -> str:
        """Why a reply may not come: a server died (a killed one looks like this: Open MPI
        reports no error), or, under a staleness bound or lock-step rounds, it holds the reply
        for a worker that stopped."""
        held = (self.ps.bsp or self.ps.staleness != float("inf")) and \
            self.topology.num_workers > 1
        return (f"worker {self.worker}: no reply from the parameter server to its "
                f"{kind.name} (clock {clock}): a server process died, hangs or was cut off"
                + ("; or it holds the reply until the slowest worker catches up (--staleness, "
                   "--bsp), and that worker stopped" if held else ""))

    # --- the other messages --------------------------------------------------------------------
    def tell(self, kind: Kind, clock: int, leader_only: bool = False) -> None:
        """A header of ``kind`` to every server (or to server 0 alone)."""
        for server in ([self.leader] if leader_only else [s for s, _ in self.routes]):
            self.comm.Send(make_header(kind, clock=clock, worker=self.worker),
                           dest=server, tag=Tag.REQUEST)

    def request_slots(self, count: int, epoch: int, clock: int) -> np.ndarray:
        """Ask server 0 for ``count`` more slots and wait for them. Under recovery, in the last
        epoch, server 0 holds the reply while a lost worker's batches may come back
        (ps/slot_waiters.py): that takes up to its silence limit, hence the reply's timeout."""
        self.comm.Send(make_header(Kind.SLOTS, clock=clock, size=count, worker=self.worker,
                                   slot=epoch), dest=self.leader, tag=Tag.REQUEST)
        slots = np.empty(count, dtype=np.int64)
        wait_any(self.MPI, [self.comm.Irecv(slots, source=self.leader, tag=Tag.SLOT)],
                 self.reply_timeout_s(), lambda: (
                     f"worker {self.worker}: parameter server 0 handed out no batch"),
                 check=self.check_ended, limit=reply_limit(self.recovery))
        return slots

    def send_plan(self, message: dict[str, Any]) -> None:
        self.comm.send(message, dest=self.leader, tag=Tag.INFO)

    def receive_debt(self) -> float:
        """The seconds server 0 charged for an evaluation's pause (sent before the reply, so
        it has arrived after one)."""
        debt = 0.0
        while self.comm.Iprobe(source=self.leader, tag=Tag.DEBT):
            word = np.empty(1, dtype=np.float64)
            self.comm.Recv(word, source=self.leader, tag=Tag.DEBT)
            debt += float(word[0])
        return debt

    def stop_arrived(self) -> bool:
        return self.comm.Iprobe(source=self.MPI.ANY_SOURCE, tag=Tag.STOP)

    def receive_stops(self) -> None:
        """The STOP every server sends each worker, once."""
        words = np.empty((len(self.routes), 1), dtype=np.int64)
        stops = [self.comm.Irecv(words[i], source=server, tag=Tag.STOP)
                 for i, (server, _) in enumerate(self.routes)]
        while wait_any(self.MPI, stops, self.ps.timeout_s, lambda: (
                f"worker {self.worker}: not every parameter server confirmed the stop"),
                check=self.check_ended) != self.MPI.UNDEFINED:
            pass

    def tell_place(self, place: tuple[str, dict[str, Any]]) -> None:
        """Where the checkpoint being written lies and its position, to every server, ahead of
        the SAVE header (a server reads it on that header; one sender's messages keep their
        order)."""
        for server, _ in self.routes:
            self.comm.send(place, dest=server, tag=Tag.INFO)

    def receive_state(self) -> dict[str, Any]:
        """After a SAVE's ACKs: what every server wrote (each its own shard's file beside the
        checkpoint) and server 0's clocks, version, staleness histogram and batch plan, as a
        checkpoint's ``server_state``."""
        metas = [self.comm.recv(source=server, tag=Tag.INFO) for server, _ in self.routes]
        first = metas[0]
        return {"shards": [meta["shard"] for meta in metas], "clocks": first["clocks"],
                "version": first["version"], "staleness_histogram": first["staleness"],
                **({"dispatch": first["dispatch"]} if first.get("dispatch") else {})}

    def say_done(self, clock: int, collect: bool) -> list[dict]:
        """DONE to every server; with ``collect`` (worker 0) their final statistics."""
        for server, _ in self.routes:
            self.comm.Send(make_header(Kind.DONE, clock=clock), dest=server, tag=Tag.REQUEST)
        return [self.comm.recv(source=server, tag=Tag.INFO) for server, _ in self.routes] \
            if collect else []


def round_as_replies(link: ServerLink) -> bool:
    """Round ``link``'s parameters as a push's reply in the wire dtype brings them (only the
    routes that travel as messages: a shared window is read in float32); False where nothing
    changes."""
    if link.wire.exact_dtype:
        return False
    for server, chunks in link.routes:
        if server not in link.shared_params:
            for a, b in chunks:
                link.params_flat[a:b] = link.params_flat[a:b].to(link.wire.dtype).float()
    return True
