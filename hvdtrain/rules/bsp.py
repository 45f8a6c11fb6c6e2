"""Lock-step rounds through the server (--bsp): each round sums the gradients of every running
worker, applies their mean once and then replies to all of them, so every applied gradient is
fresh, like sync training."""

from __future__ import annotations

from .clocks import IDLE_TO_EVERY_SERVER, IDLE_TO_LEADER, Versions, WorkerClocks


def bsp_quorum(num_workers: int, backup_workers: int, pushing: int) -> int:
    """Pushes that close a --bsp round: the first N-b (Chen et al. 2016), or all of the
    ``pushing`` workers (those still running that have not said they are idle) once fewer are
    left, so the end of training never waits for a worker that will not push again. At least 1."""
    return max(1, min(num_workers - backup_workers, pushing))


class LockStepRounds:
    """The round policy of --bsp: a reply waits for its round, which closes once its quorum of
    pushes (every running worker) has joined."""

    lock_step = True  # gradients are summed into rounds (accumulator.RoundSum)
    backup_workers = 0
    # Each worker trains a fixed share of every epoch rather than the job's batches from server
    # 0 (ps/dispatch.py): every round takes one batch of each worker anyway.
    fixed_shares = True

    def __init__(self, num_workers: int):
        self.num_workers = num_workers

    def lr_scale(self, num_workers: int) -> float:
        # A round applies the mean of its workers' gradients, like sync training, so it takes
        # the same linearly scaled rate (ps/client.py); with backup workers N-b gradients.
        return float(num_workers - self.backup_workers)

    def quorum(self, clocks: WorkerClocks) -> int:
        return bsp_quorum(self.num_workers, self.backup_workers, clocks.pushing())

    def closes(self, clocks: WorkerClocks, joined: int) -> bool:
        """Whether a round that ``joined`` pushes have joined closes now. A worker that finished
        mid-round (or, with backup workers, went idle) must not hold the others' round open."""
        return joined > 0 and joined >= self.quorum(clocks)

    def is_late(self, versions: Versions, worker: int) -> bool:
        return False  # every running worker is in every round: nobody falls behind one

    def idle_reports(self, eval_pauses_workers: bool, recovery: bool) -> str | None:
        """Whom a worker that waits for the others tells (clocks.IDLE_TO_*). With backup
        workers the others may wait for a round of N-b pushes that it would never join: server
        0, which decides every shard's rounds. Plain --bsp needs no such message (its workers
        never drift apart), unless mpirun's recovery settings make server 0 watch for silent
        workers (silence.py). An evaluation's pause must not charge it: every server."""
        if eval_pauses_workers:
            return IDLE_TO_EVERY_SERVER
        return IDLE_TO_LEADER if self.backup_workers or recovery else None
