"""Backup workers (``--bsp --backup-workers b``, Chen et al. 2016, "Revisiting distributed
synchronous SGD"): a round closes as soon as N-b of the N workers have pushed a gradient computed
on the current parameters. Which round a push belongs to is the parameter version in its
worker's last push reply (Versions.pushed_on): a push made on an older version arrives after its
round closed, so its gradient is dropped and its worker gets the current parameters at once.
Every applied gradient is therefore fresh."""

from __future__ import annotations

from ..errors import ConfigError
from .bsp import LockStepRounds, bsp_quorum
from .clocks import Versions, WorkerClocks


def check_backup_workers(backup_workers: int, num_workers: int) -> None:
    """--backup-workers b needs at least one gradient per round: b < N."""
    if not 0 <= backup_workers < num_workers:
        raise ConfigError(
            f"--backup-workers: invalid value {backup_workers}; this job has {num_workers} "
            f"worker(s), and each round needs at least one gradient: use at most "
            f"{num_workers - 1} backup worker(s), or launch more processes")


class BackupWorkers(LockStepRounds):
    """Rounds of the first N-b fresh pushes; a late push's gradient does not count."""

    # The job's batches go to whoever asks (ps/dispatch.py), as under async. With a fixed share
    # the straggler, whose gradients are dropped, would still hold most of its share when the
    # others finish, and train it alone in rounds of one gradient at lr x (N-b) (issue 25).
    fixed_shares = False

    def __init__(self, num_workers: int, backup_workers: int):
        check_backup_workers(backup_workers, num_workers)
        super().__init__(num_workers)
        self.backup_workers = backup_workers

    def quorum(self, clocks: WorkerClocks) -> int:
        # A worker that waits for the others (IDLE) will not push before they meet it.
        return bsp_quorum(self.num_workers, self.backup_workers, clocks.pushing(count_idle=False))

    def is_late(self, versions: Versions, worker: int) -> bool:
        """Computed on parameters that a round closed since (without it) replaced? Pulls do not
        count: with several servers a follower may have served one with parameters older than
        the leader's."""
        return versions.pushed_on[worker] < versions.version
