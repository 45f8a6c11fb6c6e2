"""Pushes over slow links received in the background (ps/arrivals.py, ps/wire.py's staging): a
server whose receive of one worker's gradient would hold every other worker's push. In one
process, on fake MPI requests that the test completes."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from hvdtrain.ps import wire as wire_module
from hvdtrain.ps.arrivals import SlowArrivals
from hvdtrain.ps.protocol import (H_FLAGS, H_KIND, H_WORKER, HEADER_LEN, NO_GRADIENT, Kind,
                                  Tag, chunk_bounds)
from hvdtrain.ps.waiting import wait_any
from hvdtrain.ps.wire import SLOW_LINK_BYTES_PER_S, ShardWire

TOTAL, CHUNK = 1000, 300  # 4 chunks, the last one short


class Request:
    """A receive that completes when the test says so (``land``), writing its message."""

    def __init__(self, buf, source, tag):
        self.buf, self.source, self.tag, self.done = buf, source, tag, False

    def land(self, message, source=None):
        self.buf[:] = message
        self.source = self.source if source is None else source
        self.done = True


class Status:
    def __init__(self):
        self.source = -1

    def Get_source(self):
        return self.source


class FakeMPI:
    ANY_SOURCE = -1

    class Request:
        @staticmethod
        def Testany(requests, status=None):
            for i, r in enumerate(requests):
                if r.done:
                    if status is not None:
                        status.source = r.source
                    r.done = None  # completed once, as MPI's request becomes inactive
                    return i, True
            return -1, False

        @staticmethod
        def Testall(requests):
            return all(r.done is not False for r in requests)


class Comm:
    """Receives the test completes; a header sent before its receive is posted lands when it
    is."""

    def __init__(self):
        self.posted: list[Request] = []
        self.headers: list[tuple[np.ndarray, int]] = []

    def Irecv(self, buf, source, tag):
        request = Request(buf, source, tag)
        self.posted.append(request)
        if tag == Tag.REQUEST and self.headers:
            request.land(*self.headers.pop(0))
        return request

    def send_header(self, header, source):
        waiting = [r for r in self.posted if r.tag == Tag.REQUEST and r.done is False]
        if waiting:
            waiting[0].land(header, source)
        else:
            self.headers.append((header, source))

    def receives(self, source, tag):
        return [r for r in self.posted if r.source == source and r.tag == tag]


def push_header(worker, gradient=True):
    header = np.zeros(HEADER_LEN, dtype=np.int64)
    header[H_KIND], header[H_WORKER] = Kind.PUSH, worker
    header[H_FLAGS] = 0 if gradient else NO_GRADIENT
    return header


def make_server(slow=(0, 1)):
    comm = Comm()
    wire = ShardWire(comm, "fp32", torch.zeros(TOTAL), chunk_bounds(TOTAL, CHUNK))
    wire.slow.update(slow)
    received = []

    def receive(server, status):  # the membership's wait: the test queued the header
        header, source = received.pop(0)
        server.header[:] = header
        status.source = source

    server = SimpleNamespace(
        MPI=FakeMPI, comm=comm, header=np.zeros(HEADER_LEN, dtype=np.int64),
        shard=SimpleNamespace(wire=wire), cfg=SimpleNamespace(ps=SimpleNamespace(timeout_s=5)),
        membership=SimpleNamespace(receive=receive, wait=lambda server, requests, status:
                                   wait_any(FakeMPI, requests, 5, lambda: "waiting", status)),
        _describe_wait=lambda: "waiting")
    return server, SlowArrivals(server, enabled=True), received


def land_gradient(comm, worker, values):
    for r in comm.receives(worker, Tag.GRAD):
        r.land(values[_offset(r, comm, worker)])


def _offset(request, comm, worker):
    """The slice of a whole gradient that ``request`` receives (chunks in order)."""
    requests = comm.receives(worker, Tag.GRAD)
    start = sum(len(r.buf) for r in requests[:requests.index(request)])
    return slice(start, start + len(request.buf))


def test_a_slow_workers_push_waits_for_its_gradient_while_another_is_served():
    server, arrivals, received = make_server()
    status = Status()
    received.append((push_header(0), 0))
    assert arrivals.next_request(status) == 0
    assert arrivals.park(0)  # slow: its gradient comes in the background
    assert len(server.comm.receives(0, Tag.GRAD)) == 4
    # meanwhile worker 2 (beside the server) pushes: its header is served at once
    server.comm.send_header(push_header(2), 2)
    assert arrivals.next_request(status) == 2 and server.header[H_WORKER] == 2
    assert not arrivals.park(2)  # not slow
    arrivals.served(2)
    # worker 0's gradient comes in: its push is next, its header back, its chunks from the buffer
    gradient = np.arange(TOTAL, dtype=np.float32)
    land_gradient(server.comm, 0, gradient)
    assert arrivals.next_request(status) == 0 and server.header[H_WORKER] == 0
    wire = server.shard.wire
    got = np.concatenate([wire.gradient(0, a, b).copy() for a, b in wire.chunks])
    np.testing.assert_array_equal(got, gradient)
    assert wire.bytes_pushed == 4 * TOTAL and wire.pushes_staged == 1
    arrivals.served(0)
    assert wire.staged == {} and len(wire._spare) == 1  # its buffer is reused next time


def test_slow_pushes_come_in_one_at_a_time_in_the_order_their_headers_came():
    """A second slow push's receives are posted only once the first gradient is in: on a link
    the slow workers share, each then has the link's whole rate, first come first served."""
    server, arrivals, received = make_server()
    status = Status()
    received.append((push_header(0), 0))
    assert arrivals.next_request(status) == 0 and arrivals.park(0)
    server.comm.send_header(push_header(1), 1)
    assert arrivals.next_request(status) == 1 and arrivals.park(1)
    assert server.comm.receives(1, Tag.GRAD) == []  # queued behind worker 0's
    land_gradient(server.comm, 0, np.ones(TOTAL, dtype=np.float32))
    assert arrivals.next_request(status) == 0
    assert len(server.comm.receives(1, Tag.GRAD)) == 4  # on its way while 0 is served
    arrivals.served(0)
    land_gradient(server.comm, 1, np.full(TOTAL, 2, dtype=np.float32))
    assert arrivals.next_request(status) == 1 and server.header[H_WORKER] == 1
    assert float(server.shard.wire.gradient(1, 0, CHUNK)[0]) == 2.0
    arrivals.served(1)
    # its own header receive, posted while 1 was in flight, is kept until a header comes ...
    assert arrivals.header_receive is not None
    server.comm.send_header(push_header(3), 3)
    assert arrivals.next_request(status) == 3 and arrivals.header_receive is None
    # ... then, nothing parked, the membership's wait again
    received.append((push_header(4), 4))
    assert arrivals.next_request(status) == 4 and received == []


@pytest.mark.parametrize("header, slow, enabled", [
    (push_header(0, gradient=False), True, True),  # no gradient (a skipped fp16 step)
    (push_header(0), False, True),  # a fast link
    (push_header(0), True, False),  # lock-step rules, recovery, or a lone worker
])
def test_what_is_served_at_once(header, slow, enabled):
    server, arrivals, _ = make_server(slow=(0,) if slow else ())
    arrivals.enabled = enabled
    server.header[:] = header
    assert not arrivals.park(0) and server.comm.posted == []


def test_a_link_is_slow_when_its_last_gradient_came_in_below_the_rate(monkeypatch):
    """Measured on the receives themselves: chunk by chunk, or the whole staged gradient."""
    server, _, _ = make_server(slow=())
    wire = server.shard.wire
    clock = iter(np.arange(0, 100, 0.5))  # each receive takes half a second
    monkeypatch.setattr(wire_module.time, "perf_counter", lambda: float(next(clock)))
    wire.comm.Recv = lambda buf, source, tag: None
    for a, b in wire.chunks:
        wire.gradient(7, a, b)
    assert 7 in wire.slow  # 4000 bytes in 2 s
    fast = TOTAL * 4 / SLOW_LINK_BYTES_PER_S / 2
    wire.stage(7)
    wire.unstage(7, fast)
    assert 7 not in wire.slow
    wire.stage(7)
    wire.unstage(7, fast * 4)
    assert 7 in wire.slow


def test_a_16_bit_gradient_staged_is_widened_as_one_received_at_once():
    comm = Comm()
    wire = ShardWire(comm, "bf16", torch.zeros(TOTAL), chunk_bounds(TOTAL, CHUNK))
    sent = torch.randn(TOTAL).to(torch.bfloat16)
    wire.stage(5)
    land_gradient(comm, 5, sent.view(torch.int16).numpy())
    got = np.concatenate([wire.gradient(5, a, b).copy() for a, b in wire.chunks])
    np.testing.assert_array_equal(got, sent.float().numpy())
    assert wire.bytes_pushed == 2 * TOTAL


def test_a_wait_that_times_out_names_the_limit_it_waited():
    """A worker under the recovery settings waits twice --timeout-s for a reply, and said
    "(waited 12 s, --timeout-s)" of --timeout-s 6."""
    from types import SimpleNamespace

    from hvdtrain.ps.waiting import StuckError

    never = [SimpleNamespace(done=False, source=0)]
    with pytest.raises(StuckError, match=r"^no reply \(waited 0\.01 s, twice --timeout-s\)"):
        wait_any(FakeMPI, never, 0.01, lambda: "no reply", limit="twice --timeout-s")
    with pytest.raises(StuckError, match=r"\(waited 0\.01 s, --timeout-s\)"):
        wait_any(FakeMPI, never, 0.01, lambda: "no reply")
