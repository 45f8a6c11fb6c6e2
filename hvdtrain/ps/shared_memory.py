"""The same-host fast path: an MPI-3 shared-memory window between the servers and workers of a host.

Over messages, every byte of a push is copied by the server (Open MPI's single-copy receive runs
in the receiving process) before the server can update with it, so a push costs a copy plus an
update on the server's one core. With a window, each process owns one segment that the others on
its host can load from directly:

- a server's segment holds its parameter shard; a worker copies fresh chunks straight out of it;
- a worker's segment holds its flat gradient; the server's update reads it in place.

Only small control messages (the request header, one "chunk i is ready" word per chunk, an ack)
still travel over MPI, so ordering and back-pressure are the same as on the message path. Ranks
on different hosts keep using messages. ``win.Sync()`` is the memory barrier that the MPI
standard asks for between a store in one process and a load in another, paired with a message.
"""

from __future__ import annotations

import numpy as np


class HostWindow:
    """One shared-memory window over the processes of ``comm`` that run on this host.

    Collective over ``comm``: every server and worker creates it at the same point of start-up,
    each with the size of its own segment (0 for none). With ``enabled`` False nothing is shared
    and every peer is reached by messages.
    """

    def __init__(self, comm, nbytes: int, enabled: bool = True):
        from mpi4py import MPI

        self.MPI = MPI
        self.win = None
        self.node = None
        self.local: dict[int, int] = {}  # comm rank -> rank in the host communicator
        if not enabled:
            return
        self.node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
        self.win = MPI.Win.Allocate_shared(nbytes, 4, comm=self.node)
        # A passive-target epoch for the window's whole life: Sync() is only legal inside one.
        self.win.Lock_all(MPI.MODE_NOCHECK)
        node_ranks = MPI.Group.Translate_ranks(comm.Get_group(), list(range(comm.Get_size())),
                                               self.node.Get_group())
        self.local = {rank: nr for rank, nr in enumerate(node_ranks) if nr != MPI.UNDEFINED}

    def shares_host(self, rank: int) -> bool:
        return rank in self.local

    def segment(self, rank: int) -> np.ndarray:
        """The float32 segment that ``rank`` (a rank of the communicator it was made on) owns."""
        buffer, _ = self.win.Shared_query(self.local[rank])
        return np.frombuffer(buffer, dtype=np.float32)

    def sync(self) -> None:
        """Memory barrier: stores before it are visible to a peer that synced after our message."""
        if self.win is not None:
            self.win.Sync()

    def close(self) -> None:
        """Collective over the host: call once, after the last access by any process."""
        if self.win is not None:
            self.win.Unlock_all()
            self.win.Free()
            self.node.Free()
            self.win = None
