"""A real ParameterServer on a fake communicator and a fake shared-memory window (plain arrays,
every rank on one host), so that unit tests feed it request headers in an order they choose and
read off which worker got which reply. No MPI."""

from __future__ import annotations

import sys
from collections import defaultdict, deque
from types import SimpleNamespace

import numpy as np
import torch

from hvdtrain.config import Config
from hvdtrain.engines.server_engine import ServerEngine
from hvdtrain.ps import server as server_module
from hvdtrain.ps import shard as shard_module
from hvdtrain.layout import Topology
from hvdtrain.ps.protocol import NO_GRADIENT, WANT_PARAMS, Kind, Tag, make_header, shard_bounds
from hvdtrain.rules.registry import server_rules

REPLIES = (Tag.READY, Tag.PARAMS, Tag.ACK)


class FakeMPI:
    """What the server touches of mpi4py.MPI outside its receive loop."""

    class Request:
        @staticmethod
        def Waitall(requests):
            pass


class FakeComm:
    """A server's communicator: messages to workers land in the job's outbox as (destination,
    tag); messages to other servers wait in the job's queues until the test delivers them."""

    def __init__(self, rank: int, job: "Job"):
        self.rank, self.job = rank, job

    def Get_rank(self):
        return self.rank

    def Send(self, buf, dest, tag):
        self.job.post(self.rank, dest, tag, np.array(buf, copy=True))

    Isend = Send

    def send(self, obj, dest, tag):
        self.job.post(self.rank, dest, tag, obj)

    def Recv(self, buf, source, tag):
        assert tag == Tag.VERDICT, "every rank shares the host: only verdicts are messages"
        buf[:] = self.job.payloads[self.rank, source].popleft()

    def recv(self, source, tag):
        assert tag == Tag.INFO, "a pickled message to a server: a checkpoint's place"
        return self.job.payloads[self.rank, source].popleft()


class Job:
    """S real servers for N workers; each worker's gradient and each server's shard live in
    plain arrays, as they would in the shared-memory window."""

    def __init__(self, monkeypatch, workers: int, backup: int, servers: int = 1, total: int = 6,
                 seed: int = 0, bsp: bool = True, cfg: Config | None = None):
        self.topology = Topology(workers + servers, servers)
        if cfg is None:  # else the caller's settings
            cfg = Config()
            cfg.ps.bsp, cfg.ps.backup_workers = bsp, backup
            cfg.optim.momentum = 0.0  # plain SGD: p -= lr * mean gradient, easy to recompute
        cfg.ps.num_servers = servers
        self.cfg = cfg
        self.bounds = shard_bounds(total, servers)
        self.segments = {w: np.zeros(total, np.float32) for w in range(workers)}
        for rank, (a, b) in zip(self.topology.server_ranks(), self.bounds):
            self.segments[rank] = np.zeros(b - a, np.float32)
        segments = self.segments

        class Window:  # HostWindow with every rank on this host
            def __init__(self, comm, nbytes, enabled=True):
                pass

            def shares_host(self, rank):
                return True

            def segment(self, rank):
                return segments[rank]

            def sync(self):
                pass

        monkeypatch.setattr(shard_module, "HostWindow", Window)
        monkeypatch.setitem(sys.modules, "mpi4py", SimpleNamespace(MPI=FakeMPI))
        self.outbox: list[tuple[int, Tag]] = []       # server -> worker messages
        self.sent: list[tuple[int, Tag, object]] = []  # ... all of them, with their payloads
        self.clocks = defaultdict(int)  # worker -> pushes sent through send()
        self.queues = defaultdict(deque)  # (server rank, sender rank) -> headers in flight
        self.payloads = defaultdict(deque)  # (server rank, sender rank) -> VERDICT payloads
        self.servers = []
        rng = np.random.default_rng(seed)
        self.initial = rng.standard_normal(total).astype(np.float32)
        for rank, (a, b) in zip(self.topology.server_ranks(), self.bounds):
            server = server_module.ParameterServer(FakeComm(rank, self), cfg, self.topology)
            server._allocate(total)
            server.shard.params.numpy()[:] = self.initial[a:b]
            self.servers.append(server)

    def post(self, source: int, dest: int, tag: Tag, payload) -> None:
        if not self.topology.is_server(dest):
            self.outbox.append((dest, tag))
            self.sent.append((dest, tag, payload))
        elif tag == Tag.REQUEST:
            self.queues[dest, source].append(payload)
        else:
            self.payloads[dest, source].append(payload)

    def handle(self, rank: int, source: int, header: np.ndarray,
               now: float = 0.0) -> list[tuple[int, Tag]]:
        """Server ``rank`` serves one request (at time ``now``); returns what it sent the
        workers meanwhile."""
        self.outbox.clear()
        server = self.servers[self.topology.server_index(rank)]
        server.header[:] = header
        server._handle(source, now)
        return list(self.outbox)

    def send(self, worker: int, kind: Kind, flags: int = 0, lr: float = 1.0,
             now: float = 0.0) -> list[tuple[int, Tag]]:
        """One request to server 0, served at once. A push carries the worker's next clock, as
        a real worker's does (a server refuses one that does not advance: ps/ledger.py)."""
        if kind == Kind.PUSH:
            self.clocks[worker] += 1
        header = make_header(kind, clock=self.clocks[worker], lr=lr, flags=flags, worker=worker)
        return self.handle(self.topology.server_ranks()[0], worker, header, now)

    def push(self, worker: int, gradient: np.ndarray | None = None, flags: int = WANT_PARAMS,
             lr: float = 1.0) -> set[int]:
        """A push to the one server; the workers that got a reply."""
        if gradient is None:
            flags |= NO_GRADIENT
        else:
            self.segments[worker][:] = gradient
        return replied(self.send(worker, Kind.PUSH, flags=flags, lr=lr))

    def params(self, server: int = 0) -> np.ndarray:
        return self.servers[server].shard.params.numpy().copy()


def fake_engine(num_workers: int, released: list | None = None) -> ServerEngine:
    """A real ServerEngine (async rules) over a one-element shard that answers nobody, for the
    helpers that drive one (membership, slot waiters); ``released`` counts its releases."""
    port = SimpleNamespace(reply=lambda w, want: None, begin_stop=lambda: None)
    optimizer = SimpleNamespace(params=torch.zeros(1), chunks=[(0, 1)])
    engine = ServerEngine(server_rules(Config().ps, num_workers), num_workers, optimizer, port)
    if released is not None:
        engine.release = lambda: released.append(True)
    return engine


def replied(messages) -> set[int]:
    return {dest for dest, tag in messages if tag in REPLIES}


def stopped(messages) -> set[int]:
    return {dest for dest, tag in messages if tag == Tag.STOP}
