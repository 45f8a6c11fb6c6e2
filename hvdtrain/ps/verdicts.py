"""--backup-workers with several servers: server 0 (the leader) decides for every shard. It sends
the others each round's members, in the order they joined, and each dropped push, and they carry
these verdicts out in order, each once the pushes it names have arrived (the server engine's
follower side, engines/server_engine.py). So every shard applies the same rounds with the same workers'
gradients and learning rate. Shards that decided on their own (as TensorFlow's
SyncReplicasOptimizer does per variable) could hang: a worker late at one shard and on time at
another waits there for a round that the workers it waits for cannot join."""

from __future__ import annotations

import numpy as np

from ..layout import Topology
from .protocol import H_FLAGS, H_SIZE, H_WORKER, WANTS_STOP, Kind, Tag, make_header


class Verdicts:
    def __init__(self, comm, topology: Topology, index: int, backup_workers: int):
        self.comm = comm
        self.leader_rank = topology.server_ranks()[0]
        self.is_leader = index == 0
        self.followers = topology.server_ranks()[1:] if backup_workers and self.is_leader \
            else []
        self.follows = bool(backup_workers) and not self.is_leader  # rounds close on verdicts

    def tell(self, kind: Kind, workers: list[int], stop: bool, version: int) -> None:
        """Send the other servers a verdict: a round's members (in the order they joined) or
        a dropped push; with ``stop``, every worker stops before these replies."""
        if not self.followers:
            return
        header = make_header(kind, clock=version, size=len(workers),
                             flags=WANTS_STOP if stop else 0, worker=workers[0])
        members = np.asarray(workers, dtype=np.int64)
        for server in self.followers:
            self.comm.Send(header, dest=server, tag=Tag.REQUEST)
            if kind == Kind.ROUND:
                self.comm.Send(members, dest=server, tag=Tag.VERDICT)

    def receive(self, kind: Kind, header: np.ndarray) -> tuple[bool, list[int], bool]:
        """A follower: the verdict whose header has arrived, as (a round?, its workers, stop),
        for the server engine to carry out (ServerEngine.on_verdict)."""
        stop = bool(header[H_FLAGS] & WANTS_STOP)
        if kind == Kind.ROUND:
            members = np.empty(int(header[H_SIZE]), dtype=np.int64)
            self.comm.Recv(members, source=self.leader_rank, tag=Tag.VERDICT)
            return True, [int(w) for w in members], stop
        return False, [int(header[H_WORKER])], stop
