"""Pushes over slow links, received in the background, so that one worker's slow link does not
hold the server for the others.

A push's gradient travels after its header. Served at once, the server waits in the receive of
each chunk for as long as the worker's link takes to carry it: over a 25 Mbit/s link, 25 ms for a
77 KB gradient, while the workers beside the server (or behind fast links) wait for their replies
behind it. In the slow-link lab (compare/link_lab.py, the server beside worker 1) the server
spent 30% of the run in worker 0's receives.

So once a worker's push has come in slower than wire.SLOW_LINK_BYTES_PER_S (about 1 Gbit/s), the
server posts the receives of that worker's next gradient as soon as its header arrives, into a
buffer of its own (ShardWire.stage), and serves the others meanwhile; the push is served, as if
its header had just arrived, once the whole gradient is in. Pushes over fast links are served at
once as before, which keeps each chunk's update overlapped with the next chunk's arrival.

Only plain asynchronous rules take them, with two workers or more: a lone worker has nobody to
be served meanwhile, and its reply would lose the overlap of its chunks; lock-step rounds
(--bsp, --backup-workers) wait for every worker anyway, and a follower server reads a gradient
only at server 0's verdict. Nor does a server under recovery (--max-restarts, or a launch that
survives a lost worker), whose lost workers' gradients would never complete."""

from __future__ import annotations

import time
from collections import deque

import numpy as np

from .protocol import H_FLAGS, H_KIND, HEADER_LEN, NO_GRADIENT, Kind, Tag


class SlowArrivals:
    """The server's parked pushes. ``enabled``: whether its rules and launch allow them.

    One parked gradient is in flight at a time; the others wait in the order their headers came,
    their receives not yet posted, so their bytes stay off the wire meanwhile (past the eager
    part that MPI sends ahead). On a link that the slow workers share, the server's own, that
    keeps each gradient at the link's whole rate, first come first served as before: posted at
    once, two workers' gradients crossed the lab's 10 Mbit/s link side by side, each at half its
    rate, and async DiLoCo's steps took 15-20% longer."""

    def __init__(self, server, enabled: bool):
        self.server, self.enabled = server, enabled
        self.queue: deque[tuple[int, np.ndarray]] = deque()  # (worker, its push's header)
        # the gradient coming in: (worker, header, its receives, when they were posted)
        self.flight: tuple[int, np.ndarray, list, float] | None = None
        self.arrived: dict[int, float] = {}  # worker -> seconds its served gradient took
        # The receive of the next header while pushes are parked, posted once and kept until a
        # header comes, into a buffer of its own: server.header holds the push being served.
        self.next_header = np.zeros(HEADER_LEN, dtype=np.int64)
        self.header_receive = None

    def park(self, worker: int) -> bool:
        """Whether the request in server.header, from ``worker``, is a push whose gradient comes
        in the background; a later next_request serves it."""
        header, wire = self.server.header, self.server.shard.wire
        if not (self.enabled and header[H_KIND] == Kind.PUSH
                and not header[H_FLAGS] & NO_GRADIENT and wire.stages(worker)):
            return False
        self.queue.append((worker, header.copy()))
        self._post_next()
        return True

    def _post_next(self) -> None:
        if self.flight is None and self.queue:
            worker, header = self.queue.popleft()
            self.flight = (worker, header, self.server.shard.wire.stage(worker),
                           time.perf_counter())

    def next_request(self, status) -> int:
        """The rank whose request is next to serve, its header in server.header: one that has
        just arrived, or a parked push whose gradient is all in."""
        server = self.server
        if self.flight is None and self.header_receive is None:
            server.membership.receive(server, status)
            return status.Get_source()
        if self.header_receive is None:
            self.header_receive = server.comm.Irecv(self.next_header, source=server.MPI.ANY_SOURCE,
                                                    tag=Tag.REQUEST)
        while True:
            receives = [self.header_receive, *(self.flight[2] if self.flight else ())]
            index = server.membership.wait(server, receives, status)
            if index == 0:
                self.header_receive = None
                server.header[:] = self.next_header
                return status.Get_source()
            if server.MPI.Request.Testall(self.flight[2]):
                return self._arrived()

    def _arrived(self) -> int:
        """The gradient in flight is all in: its push's header back in server.header, and the
        next parked gradient on its way while the server serves this one."""
        worker, header, _, posted = self.flight
        self.flight = None
        self.server.header[:] = header
        self.arrived[worker] = time.perf_counter() - posted
        self._post_next()
        return worker

    def served(self, worker: int) -> None:
        """After the server served ``worker``'s request: a staged gradient's buffer is free."""
        seconds = self.arrived.pop(worker, None)
        if seconds is not None:
            self.server.shard.wire.unstage(worker, seconds)
