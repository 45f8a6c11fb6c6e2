"""A worker's side of a lost worker (membership.py): server 0 tells each live worker who was
lost (Tag.LOST), and the workers' collectives (the epochs' metric sums, the end-of-training
agreement) move to a communicator of the survivors, as a collective with a dead member never
completes.

Every survivor reads the same LOST messages in the same order, at its next step or while it
waits in a collective, and builds the same communicators from them (``Create_group`` is
collective over the survivors only). Sums posted on the old communicator are posted again on
the new one, from the first one that some survivor had not completed, so that the survivors'
sums stay matched one for one."""

from __future__ import annotations

import pickle
import time
from typing import Any, Callable

import numpy as np

from .membership import WorkerLost, recovery_enabled
from .protocol import Tag
from .waiting import StuckError


class Survivors:
    def __init__(self, MPI, comm, worker_comm, leader: int):
        self.MPI, self.comm, self.base, self.leader = MPI, comm, worker_comm, leader
        self.recovery = recovery_enabled()
        self.lost: list[int] = []         # worker indices, in server 0's order
        self.pushes: dict[int, int] = {}  # what each lost worker had pushed

    def poll(self) -> bool:
        """Read server 0's LOST messages; True when a worker was lost since the last poll."""
        if not self.recovery:
            return False
        self.check_ended()
        news = False
        word = np.empty(2, dtype=np.int64)
        while self.comm.Iprobe(source=self.leader, tag=Tag.LOST):
            self.comm.Recv(word, source=self.leader, tag=Tag.LOST)
            if int(word[0]) == self.comm.Get_rank():  # this one (ledger.py): it leaves
                raise WorkerLost(f"worker {int(word[0])} was declared lost after "
                                 f"{int(word[1])} pushes; its batches went to the others; "
                                 "this process leaves the job, which goes on without it")
            self.lost.append(int(word[0]))
            self.pushes[int(word[0])] = int(word[1])
            news = True
        return news

    def check_ended(self) -> None:
        """WorkerLost if server 0 said that the job ended without this worker, lost while it was
        frozen (Membership.job_ended): no server will answer what it waits for. Called in every
        wait for a server's reply under recovery, and in every poll."""
        if not self.recovery or not self.comm.Iprobe(source=self.leader, tag=Tag.ENDED):
            return
        word = np.empty(2, dtype=np.int64)
        self.comm.Recv(word, source=self.leader, tag=Tag.ENDED)
        raise WorkerLost(f"worker {int(word[0])} was declared lost after {int(word[1])} pushes "
                         "while it was silent (frozen, or cut off), and the job has ended "
                         "without it; this process leaves the job quietly")

    def communicators(self):
        """The survivors' worker communicator and a duplicate for the end's agreement; their
        ranks follow the workers' order, so the lowest live worker is rank 0."""
        group = self.base.Get_group().Excl(sorted(self.lost))
        comm = self.base.Create_group(group, tag=1000 + len(self.lost))
        group.Free()
        return comm, comm.Dup()

    def agree_completed(self, comm, completed: int) -> int:
        """The fewest sums any survivor had completed on the old communicator."""
        mine = np.array([completed], dtype=np.int64)
        fewest = np.zeros(1, dtype=np.int64)
        comm.Allreduce(mine, fewest, op=self.MPI.MIN)
        return int(fewest[0])


def wait_surviving(request: Callable[[], object], regroup: Callable[[], bool], timeout_s: float,
                   explain: Callable[[], str]) -> None:
    """Wait for ``request()`` (the current request: a regroup may post it again elsewhere),
    regrouping whenever a worker is lost; StuckError after --timeout-s without progress. Under
    recovery the wait is longer: server 0 needs --timeout-s of silence to tell a lost worker."""
    waited = f"{timeout_s:g} s, --timeout-s"
    if timeout_s and recovery_enabled():
        timeout_s = 2 * timeout_s + 5
        waited = (f"{timeout_s:g} s, 2 x --timeout-s + 5 s: under mpirun's recovery a lost "
                  "worker takes --timeout-s to tell")
    deadline = time.monotonic() + timeout_s if timeout_s else None
    polls = 0
    while not request().Test():
        polls += 1
        if polls & 1023:
            continue
        if regroup():
            deadline = time.monotonic() + timeout_s if timeout_s else None
        elif deadline is not None and time.monotonic() > deadline:
            raise StuckError(f"{explain()} (waited {waited}); a process has stopped or "
                             "hangs. Raise --timeout-s if it may pause this long.")


def on_current(comm: Callable[[], Any], post: Callable[[Any], Any]) -> Callable[[], Any]:
    """A request for wait_surviving: ``post(c)`` on the current communicator ``c = comm()``,
    posted again whenever a regroup replaced it (the request on the old one is left behind)."""
    posted = {"comm": None, "request": None}

    def request():
        current = comm()
        if posted["comm"] is not current:
            posted["comm"], posted["request"] = current, post(current)
        return posted["request"]

    return request


BROADCAST_BYTES = 1 << 20  # the largest pickled object broadcast_surviving carries


def broadcast_surviving(obj: Any, comm: Callable[[], Any], regroup: Callable[[], bool],
                        timeout_s: float, explain: Callable[[], str]) -> Any:
    """The lead's ``obj`` on every worker, through a non-blocking broadcast of a fixed-size
    buffer from rank 0 of ``comm()``, posted again on the survivors' communicator when a worker
    is lost meanwhile; rank 0 there is the lead, another worker if the lead was the one lost.
    A blocking broadcast from a dead lead never completes, and blocks the regroup too. For the
    small records a run broadcasts (--early-stop-patience's after each evaluation, the lead's
    decisions at the start): up to BROADCAST_BYTES pickled."""
    buffer = np.zeros(8 + BROADCAST_BYTES, dtype=np.uint8)

    def post(current):
        if current.Get_rank() == 0:
            data = pickle.dumps(obj)
            if len(data) > BROADCAST_BYTES:
                raise ValueError(f"an object of {len(data)} bytes pickled is more than the "
                                 f"{BROADCAST_BYTES} a broadcast among survivors carries")
            buffer[:8] = np.frombuffer(np.int64(len(data)).tobytes(), dtype=np.uint8)
            buffer[8:8 + len(data)] = np.frombuffer(data, dtype=np.uint8)
        return current.Ibcast(buffer, root=0)

    wait_surviving(on_current(comm, post), regroup, timeout_s, explain)
    size = int(buffer[:8].view(np.int64)[0])
    return pickle.loads(buffer[8:8 + size].tobytes())
