"""rules/bsp.py, rules/backup.py and rules/accumulator.py: when a round closes, which pushes are
late, what the round averages, and whose workers keep fixed shares, without a server."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hvdtrain.config import ConfigError
from hvdtrain.rules.accumulator import RoundSum
from hvdtrain.rules.backup import BackupWorkers
from hvdtrain.rules.bsp import LockStepRounds
from hvdtrain.rules.clocks import Versions, WorkerClocks
from hvdtrain.rules.registry import Mode, server_rules
from hvdtrain.rules.ssp import StalenessBound


def test_plain_bsp_waits_for_every_running_worker():
    rounds, clocks = LockStepRounds(3), WorkerClocks(3)
    assert not rounds.closes(clocks, 2) and rounds.closes(clocks, 3)
    clocks.done(2)  # finished mid-round: the round closes without it
    assert rounds.closes(clocks, 2)
    clocks.idle.add(1)  # idle workers still count for plain BSP
    assert not rounds.closes(clocks, 1)
    assert not rounds.closes(clocks, 0)  # an empty round never closes
    assert rounds.lr_scale(3) == 3.0 and not rounds.is_late(Versions(3), 0)


def test_backup_quorum_closes_with_n_minus_b_and_drops_the_late_push():
    rounds, clocks, versions = BackupWorkers(3, 1), WorkerClocks(3), Versions(3)
    assert rounds.lr_scale(3) == 2.0
    assert not rounds.closes(clocks, 1) and rounds.closes(clocks, 2)  # N - b = 2
    # workers 0 and 1 made the round: the version moves on and they get its reply
    versions.updated()
    versions.replied_to_push(0)
    versions.replied_to_push(1)
    assert not rounds.is_late(versions, 0)
    assert rounds.is_late(versions, 2)  # computed on version 0: dropped
    versions.received(2)  # a pull does not make its next gradient fresh
    assert rounds.is_late(versions, 2)
    versions.replied_to_push(2)  # the drop's reply does
    assert not rounds.is_late(versions, 2)


def test_backup_quorum_leaves_idle_workers_out():
    rounds, clocks = BackupWorkers(4, 1), WorkerClocks(4)
    clocks.idle |= {1, 2}
    assert rounds.quorum(clocks) == 2  # min(N - b, the 2 still pushing)
    clocks.idle.add(3)
    assert rounds.closes(clocks, 1)


def test_backup_workers_leave_at_least_one_gradient_per_round():
    with pytest.raises(ConfigError, match="at most 1 backup"):
        BackupWorkers(2, 2)


def test_the_round_averages_the_gradients_that_came():
    total = RoundSum(4)
    g1, g2 = np.arange(4, dtype=np.float32), np.full(4, 2.0, np.float32)
    total.add(0, 2, g1[:2])  # a server adds chunk by chunk
    total.add(2, 4, g1[2:])
    total.join(True)
    total.join(False)  # a skipped fp16 step: counts for the quorum, adds nothing
    total.add(0, 4, g2)
    total.join(True)
    assert (total.pushes, total.gradients) == (3, 2)
    np.testing.assert_array_equal(total.mean(), (g1 + g2) / 2)
    total.clear()
    assert (total.pushes, total.gradients) == (0, 0) and not total.total.any()
    total.join(False)
    assert total.mean() is None  # nothing to apply


def test_only_plain_lock_step_rounds_keep_a_fixed_share_per_worker():
    # Every plain --bsp round takes one batch of each worker. With backup workers a straggler's
    # dropped gradients would leave it most of a fixed share to train alone at the end (issue
    # 25), so they, like async workers, take the job's batches (ps/dispatch.py).
    assert LockStepRounds(3).fixed_shares
    assert not BackupWorkers(3, 1).fixed_shares
    assert not StalenessBound(math.inf).fixed_shares and not StalenessBound(2).fixed_shares
    for backups, fixed in ((0, True), (1, False)):  # what the client and the simulator ask
        ps = Mode("m", staleness=0.0, bsp=True, backup_workers=backups)
        assert server_rules(ps, 3).policy.fixed_shares == fixed
