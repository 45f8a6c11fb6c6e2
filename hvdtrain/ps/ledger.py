"""No update is applied twice (issue 28): a server applies a worker's push only when its clock
(the worker's push count, H_CLOCK) is beyond the last one the server took from that worker.
A push that is not is refused and counted: a copy of a push already applied, or a push from a
worker already declared lost (membership.py sets its clock to infinity, as for a finished one),
such as a worker frozen (SIGSTOP, a node's hiccup) past the silence limit whose batches went to
the survivors meanwhile. Every server sees every push's header and decides the same from it, so
the shards stay in step without server 0's word.

A refused push is still answered, so that its sender does not hang: its gradient is taken off
the wire, server 0 sends it the slot word it waits for (NO_SLOT for a lost worker: its batches
are the survivors' now), and it gets its reply; server 0 then tells a lost worker that it is
lost (Tag.LOST with its own index), and it leaves the job (survivors.py).

The counts, per worker, go into the server's statistics: a test of a worker's loss checks that
each worker's applied pushes equal the pushes it made (the lost one's up to its loss)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .dispatch import NO_SLOT
from .protocol import NO_GRADIENT, WANT_PARAMS, WANT_SLOT, Tag


class PushLedger:
    def __init__(self, num_workers: int):
        self.applied = [0] * num_workers  # pushes taken, per worker
        self.refused = [0] * num_workers  # pushes refused: duplicates, or from a lost worker

    def admits(self, last_clock: float, worker: int, clock: int) -> bool:
        """Whether a push with ``clock`` from ``worker``, whose last push taken had
        ``last_clock`` (inf once done or lost), is taken; counts it either way."""
        if clock > last_clock:
            self.applied[worker] += 1
            return True
        self.refused[worker] += 1
        return False

    def report(self) -> dict[str, Any]:
        return {"pushes_per_worker": list(self.applied), "pushes_refused": sum(self.refused),
                "pushes_refused_per_worker": list(self.refused)}


def answer_refused(server, worker: int, flags: int) -> None:
    """Answer a refused push without applying it (see the module's text)."""
    lost = worker in server.membership.lost_workers
    if not flags & NO_GRADIENT:
        server.shard.discard_gradient(worker)
    if flags & WANT_SLOT and server.dispatcher is not None:
        slot = NO_SLOT if lost else server.dispatcher.take(worker)
        server.comm.Send(np.array([slot], dtype=np.int64), dest=worker, tag=Tag.SLOT)
    if flags & WANT_PARAMS:
        server.shard.send_all(server.MPI, worker)
    else:
        server.send_ack(worker)
    if lost and server.index == 0:
        pushes = server.load.pushes_reported[worker]
        server.comm.Send(np.array([worker, pushes], dtype=np.int64), dest=worker, tag=Tag.LOST)
