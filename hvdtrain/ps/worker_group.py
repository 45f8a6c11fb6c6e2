"""The async workers' collectives among themselves (never with the servers): the metrics sums,
the stop votes and the lead's broadcasts, and how they carry on after a lost worker
(survivors.py): on the survivors' communicators, with the sums some survivor had not completed
posted again, and the lead's roles taken over by the lowest live worker."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..scheme import PendingSum
from .survivors import Survivors, broadcast_surviving, on_current, wait_surviving


class WorkerGroup:
    """The workers of one job as ``worker`` sees them: ``worker_comm`` for the start-up
    agreement and the metrics sums, a channel of its own for the end-of-training agreement,
    and ``survivors`` for a lost worker."""

    def __init__(self, MPI, worker_comm, survivors: Survivors, worker: int, timeout_s: float):
        self.MPI, self.survivors, self.worker, self.timeout_s = MPI, survivors, worker, timeout_s
        self.comm = worker_comm  # workers only: start-up agreement, metrics sums
        # The end-of-training agreement has a channel of its own: after a stop signal, workers
        # that stopped at different steps have posted different numbers of sums on worker_comm.
        self.stop_comm = worker_comm.Dup()
        self.is_main = worker_comm.Get_rank() == 0  # the lead: after its loss, the lowest live
        self.take_lead: Callable[[], None] | None = None  # the trainer's hand-over of its roles
        self.sums: list[PendingAllreduce] = []  # every sum_later, in posting order

    def sum_later(self, values: list[float]) -> PendingSum:
        """A non-blocking sum over the workers: a fast worker posts its epoch's figures and
        trains on; the sum completes once the slowest worker has posted the same epoch's."""
        pending = PendingAllreduce(np.asarray(values, dtype=np.float64), self.MPI,
                                   self.timeout_s, self.worker, self.regroup)
        pending.post(self.comm)
        self.sums.append(pending)
        return pending

    def agree(self, value: int, op, what: str) -> int:
        """An Allreduce of one word over the workers on stop_comm, posted again on the
        survivors' one when a worker is lost meanwhile."""
        mine = np.array([value], dtype=np.int64)
        result = np.zeros(1, dtype=np.int64)
        request = on_current(lambda: self.stop_comm,
                             lambda comm: comm.Iallreduce(mine, result, op=op))
        wait_surviving(request, self.regroup, self.timeout_s,
                       lambda: f"worker {self.worker}: not every worker reached {what}")
        return int(result[0])

    def broadcast(self, obj: Any) -> Any:
        if not self.survivors.recovery:
            return self.comm.bcast(obj, root=0)
        return broadcast_surviving(obj, lambda: self.comm, self.regroup, self.timeout_s,
                                   lambda: (f"worker {self.worker}: the lead's broadcast never "
                                            "came (--early-stop-patience waits for its "
                                            "evaluation)"))

    def regroup(self) -> bool:
        """After server 0 said a worker was lost: the survivors' communicators, and the sums
        that some survivor had not completed posted again on them (survivors.py)."""
        if not self.survivors.poll():
            return False
        self.comm, self.stop_comm = self.survivors.communicators()
        completed = next((i for i, s in enumerate(self.sums) if not s.ready()), len(self.sums))
        for pending in self.sums[self.survivors.agree_completed(self.comm, completed):]:
            pending.post(self.comm)
        if not self.is_main and self.comm.Get_rank() == 0:  # the lead was lost
            self.is_main = True
            print(f"hvdtrain: the lead worker was lost; worker {self.worker} takes over "
                  "its roles: evaluation, checkpoints and the log", flush=True)
            if self.take_lead is not None:
                self.take_lead()
        return True


class PendingAllreduce(PendingSum):
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
