"""Backup workers (``--bsp --backup-workers b``, Chen et al. 2016, "Revisiting distributed
synchronous SGD"): a round closes as soon as N-b of the N workers have pushed a gradient computed
on the current parameters. Which round a push belongs to is the parameter version in its
worker's last push reply (Versions.pushed_on): a push made on an older version arrives after its
round closed, so its gradient is dropped and its worker gets the current parameters at once.
Every applied gradient is therefore fresh."""

from __future__ import annotations

from typing import Any

from ..config.values import UnreadOption
from ..errors import ConfigError, require
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


def check_options(cfg: Any) -> None:
    """--backup-workers in a config: the combinations it cannot run (the worker count is
    check_backup_workers's, once the job's size is known); the config's validation calls it."""
    ps = cfg.ps
    if not ps.backup_workers:
        return
    if cfg.run.mode != "async" or not ps.bsp:
        add = "--bsp" if cfg.run.mode == "async" else "--mode async --bsp"
        raise UnreadOption(f"--backup-workers: invalid value {ps.backup_workers}; backup "
                           "workers close the lock-step rounds of the parameter server early; "
                           f"add {add}, or drop --backup-workers", "backup_workers")
    # A late gradient is dropped and its worker continues from the parameters of its
    # reply, so every reply must carry them.
    require(ps.pull_every == 1, "--pull-every", ps.pull_every,
            "--backup-workers drops late gradients and sends their workers the new "
            "parameters, which needs a pull with every push; use --pull-every 1")
