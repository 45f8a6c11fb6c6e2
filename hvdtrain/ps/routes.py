"""A communicator for the parameter server's point-to-point messages that reaches a replacement
worker too (--max-restarts, replacement.py). A worker started with MPI_Comm_spawn is no rank of
the job's COMM_WORLD: server 0 reaches it through the intercommunicator that the spawn returned,
and it reaches the servers through its parent's. ``Routes`` keeps the job's ranks, so a worker's
index stays its rank in every message, and sends each message to the communicator that reaches
that rank. Collectives (the shared-memory window, the end's broadcast) stay on the base
communicator, which a replacement never joins."""

from __future__ import annotations

import numpy as np


class Routes:
    def __init__(self, base, any_source: int):
        self.base = base
        self.any_source = any_source
        self.links: dict[int, object] = {}  # job rank -> an intercomm whose remote rank 0 it is
        self.posted: dict[int, tuple[object, np.ndarray]] = {}  # channel -> request, buffer

    def link(self, rank: int, comm) -> None:
        """From now on ``rank`` is the process at the other end of ``comm``."""
        self.links[rank] = comm
        old = self.posted.pop(rank, None)  # a receive from a predecessor's link: never done
        if old is not None:
            old[0].Cancel()

    def _at(self, rank: int) -> tuple[object, int]:
        comm = self.links.get(rank)
        return (self.base, rank) if comm is None else (comm, 0)

    # --- point-to-point, as mpi4py's Comm spells it -----------------------------------------
    def Send(self, buf, dest: int, tag: int = 0) -> None:
        comm, rank = self._at(dest)
        comm.Send(buf, dest=rank, tag=tag)

    def Isend(self, buf, dest: int, tag: int = 0):
        comm, rank = self._at(dest)
        return comm.Isend(buf, dest=rank, tag=tag)

    def send(self, obj, dest: int, tag: int = 0) -> None:
        comm, rank = self._at(dest)
        comm.send(obj, dest=rank, tag=tag)

    def Recv(self, buf, source: int, tag: int = 0, status=None) -> None:
        comm, rank = self._at(source)
        comm.Recv(buf, source=rank, tag=tag, status=status)

    def Irecv(self, buf, source: int, tag: int = 0):
        comm, rank = self._at(source)
        return comm.Irecv(buf, source=rank, tag=tag)

    def recv(self, buf=None, source: int = 0, tag: int = 0, status=None):
        comm, rank = self._at(source)
        return comm.recv(buf, source=rank, tag=tag, status=status)

    def Iprobe(self, source: int, tag: int = 0, status=None) -> bool:
        comm, rank = self._at(source)
        return comm.Iprobe(source=rank, tag=tag, status=status)

    def __getattr__(self, name: str):  # ranks, groups, Split_type: the base communicator's
        return getattr(self.base, name)

    # --- a server's wait for the next request, from any worker ------------------------------
    def post_requests(self, header: np.ndarray, tag: int) -> list:
        """One receive of a request header per channel (the base communicator, from any
        source, and each link); those still posted from the last call stay posted."""
        if -1 not in self.posted:
            buffer = np.empty_like(header)
            self.posted[-1] = (self.base.Irecv(buffer, source=self.any_source, tag=tag), buffer)
        for rank, comm in self.links.items():
            if rank not in self.posted:
                buffer = np.empty_like(header)
                self.posted[rank] = (comm.Irecv(buffer, source=0, tag=tag), buffer)
        return [request for request, _ in self.posted.values()]

    def take(self, index: int, header: np.ndarray, status) -> None:
        """The request ``index`` of post_requests' list completed: its header into ``header``,
        and the job rank of its sender into ``status``."""
        channel = list(self.posted)[index]
        _, buffer = self.posted.pop(channel)
        header[:] = buffer
        if channel != -1:
            status.Set_source(channel)

    def cancel(self) -> None:
        for request, _ in self.posted.values():
            request.Cancel()
        self.posted.clear()
