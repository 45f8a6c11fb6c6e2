"""compare/share_clock.py: sync rounds on the virtual clock, and balanced's shares re-planned at
epoch ends from each worker's median step (rules/balance.plan_shares)."""

from __future__ import annotations

import pytest

from hvdtrain.compare.share_clock import ShareClock
from hvdtrain.compare.sim.timing import Timing
from hvdtrain.rules.balance import plan_shares
from hvdtrain.stragglers import parse_straggler

TIMING = Timing(step_seconds=0.010, sample_seconds=0.0002, loop_seconds=0.001,
                allreduce_seconds=0.002)


def clock(straggler: str, balance: bool = True, workers: int = 2, **options) -> ShareClock:
    model = parse_straggler(straggler)
    return ShareClock(TIMING, 32, workers,
                      lambda w, step, seconds, work: model.delay(w, workers, step, seconds, 0,
                                                                 work),
                      balance=balance, **options)


def epochs(c: ShareClock, count: int, per_epoch: int = 10) -> list[float]:
    rounds = []
    for e in range(count):
        rounds += [c.round_seconds(e * per_epoch + s) for s in range(per_epoch)]
        c.epoch_ended()
    return rounds


def test_a_round_is_the_loop_the_slowest_share_and_the_allreduce():
    c = clock("3x", balance=False)
    # worker 1: 10 ms of compute, then 2 x 10 ms asleep
    assert epochs(c, 2) == pytest.approx([0.001 + 0.030 + 0.002] * 20)
    assert c.plans == [[32, 32]]  # sync never re-plans


def test_the_shares_follow_the_median_step_so_a_rare_slowdown_moves_nothing():
    steady = clock("3x")
    epochs(steady, 1)
    # 10 ms against 30 ms per step: plan_shares from those medians
    assert steady.plans[1] == plan_shares(64, [32, 32], [0.010, 0.030])
    # one worker in ten slowed 3x at random: every median is the plain step
    rare = clock("3x@0.1")
    epochs(rare, 3)
    assert rare.plans == [[32, 32]] * 4


def test_the_floor_keeps_a_very_slow_worker_in_the_round():
    c = clock("100x", floor=4)
    epochs(c, 12)
    assert c.plans[-1] == [60, 4]
    assert clock("100x", granularity=8).plans[0] == [32, 32]
    coarse = clock("100x", granularity=8)
    epochs(coarse, 12)
    assert all(s % 8 == 0 for plan in coarse.plans for s in plan) and coarse.plans[-1][1] >= 8


def test_the_simulator_takes_the_real_flag_s_floor_and_damping():
    from hvdtrain.rules.balance import balance_settings
    from hvdtrain.compare.sim.flat_model import config_from_train_args

    # the real flag's defaults: a quarter of --batch-size, half way at each re-plan
    assert balance_settings(config_from_train_args(["--batch-size", "32"], {})) == (8, 0.5)
    cfg = config_from_train_args(["--batch-size", "8", "--backward-passes-per-step", "4"], {})
    assert balance_settings(cfg)[0] == 4  # a sample per backward pass at least
