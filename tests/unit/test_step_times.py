"""Per-worker step times (loop/step_times.py), the slow-rank check (loop/slow_ranks.py) and the
straggler's delay in proportion to a worker's samples (stragglers.py)."""

from __future__ import annotations

import json
import time

import pytest

from hvdtrain.cli import build_parser
from hvdtrain.config import ConfigError
from hvdtrain.loop import hooks
from hvdtrain.loop.run_log import RunLog
from hvdtrain.loop.slow_ranks import SlowRankCheck, persisting, remedy, slow_workers
from hvdtrain.loop.hooks import StepTimer
from hvdtrain.loop.step_times import FIELDS, RankStepTimes, table
from hvdtrain.scheme import Group, PendingSum, Progress
from hvdtrain.stragglers import parse_straggler
from hvdtrain.train_flags import config_from_args

from fake_group import OwnGroup


def _timer(compute, wait, samples=32):
    timer = StepTimer()
    for c, w in zip(compute, wait):
        timer.record(c, w, samples)
    return timer


def test_each_worker_fills_its_own_slots_and_the_sum_is_the_table():
    fast = _timer([0.001, 0.002, 0.003, 0.004, 0.100], [0.01] * 5)
    slow = _timer([0.009] * 4, [0.0] * 4, samples=16)
    summed = [a + b for a, b in zip(fast.vector(0, 2), slow.vector(1, 2))]
    times = table(summed, 2)
    assert times.steps == (5, 4) and times.samples == (160, 64)
    assert times.compute_p50 == pytest.approx((0.003, 0.009))
    assert times.compute_mean == pytest.approx((0.022, 0.009))
    assert times.compute_p90[0] == pytest.approx(0.0616)  # numpy's linear interpolation
    assert times.wait_p50 == pytest.approx((0.01, 0.0))
    # a wait at one step in five: the median and the 90th percentile miss it, the mean does not
    rounds = table(_timer([0.001] * 5, [0.0, 0.0, 0.0, 0.0, 0.05]).vector(0, 1), 1)
    assert rounds.wait_p50 == (0.0,) and rounds.wait_mean == pytest.approx((0.01,))
    assert RankStepTimes.from_record(json.loads(json.dumps(times.as_record()))) == \
        RankStepTimes(**{k: tuple(v) for k, v in times.as_record().items()})
    # a worker that trained nothing in the epoch (async) reports zeros, not an error
    assert StepTimer().vector(1, 3) == [0.0] * (3 * len(FIELDS))


def test_the_timer_counts_the_hooks_before_it_as_compute_and_leaves_out_the_wait():
    timer = StepTimer()
    started = time.perf_counter() - 0.05  # the step began 50 ms ago, 20 ms of it waiting
    timer.after_step(hooks.StepResult(Progress(), 0.5, 0.03, 32, 0.02, started))
    assert timer.wait == [0.02] and 0.03 <= timer.compute[0] < 0.2 and timer.samples == 32


def test_a_worker_whose_larger_share_lengthens_its_steps_is_not_named_slow():
    """--balance after a slow rank recovered: shares 51 and 13 a step, the fast worker's steps
    1.6 times longer and each of its samples 2.5 times faster; it was warned of as slow."""
    compute, steps, wait = (0.0175, 0.0112), (22, 22), (0.0, 0.006)
    assert slow_workers(compute, 1.5, steps, wait, None, (22 * 51, 22 * 13)) == {}
    assert slow_workers(compute, 1.5, steps, wait, None, (22 * 32, 22 * 32)) == {
        0: pytest.approx(1.5625)}  # equal shares: slower per step is slower per sample


def test_slow_workers_are_named_against_the_median_of_the_others():
    assert slow_workers((0.001, 0.0031), 1.5) == {1: pytest.approx(3.1)}
    assert slow_workers((0.001, 0.0012, 0.0011, 0.004), 1.5) == {3: pytest.approx(4 / 1.1)}
    assert slow_workers((0.001, 0.0014), 1.5) == {}  # noise, not a straggler
    assert slow_workers((0.001, 0.01), 0) == {} and slow_workers((0.01,), 1.5) == {}
    # an async worker lost before the epoch measured no step: its zero is no median
    assert slow_workers((0.0, 0.003, 0.0026), 1.5, steps=(0, 40, 44)) == {}
    assert set(slow_workers((0.0, 0.003, 0.0026), 1.5)) == {1, 2}  # false alarms without
    assert slow_workers((0.0, 0.001, 0.004), 1.5, steps=(0, 40, 44)) == {2: pytest.approx(4)}


def test_a_difference_too_small_to_matter_is_not_slowness():
    # issue 41: an async run with no straggler named worker 0 on 0.4 ms (0.8 against 0.4 ms)
    assert slow_workers((0.0008, 0.0004, 0.0004), 1.5) == {}
    # 1.1 ms more, but of others' steps of 6.3 ms (5.5 of them waiting): lost in the
    # communication's time (a 5-step epoch on a loaded 2-core machine)
    assert slow_workers((0.00188, 0.00078), 1.5, wait_p50=(0.0017, 0.0055)) == {}
    # the same difference where the others' step is mostly compute: it holds them back
    assert slow_workers((0.00188, 0.00078), 1.5, wait_p50=(0.0, 0.0011)) == {
        0: pytest.approx(0.00188 / 0.00078)}
    # a 3x straggler on a 0.65 ms step: 1.3 ms more, the others wait for it
    assert set(slow_workers((0.00065, 0.00195), 1.5, wait_p50=(0.0014, 0.0001))) == {1}


def test_a_worker_whose_fastest_steps_are_at_full_speed_is_not_slow():
    # A rank that lost its core to another process for most of an epoch: its median is 3x the
    # other's, but its fastest tenth of the steps ran as fast as the other's
    assert slow_workers((0.003, 0.001), 1.5, compute_p10=(0.0009, 0.0009)) == {}
    # a slow device (or --straggler 3x) is slow at every step
    assert set(slow_workers((0.003, 0.001), 1.5, compute_p10=(0.0027, 0.0009))) == {0}


def test_a_log_written_before_compute_p10_and_wait_mean_reads_as_before():
    record = RankStepTimes((10, 10), (320, 320), (0.001, 0.003), (0.001, 0.003),
                           (0.001, 0.003), (0.0, 0.0), (0.0, 0.0)).as_record()
    assert record["compute_p10"] == [] and record["wait_mean"] == []
    del record["compute_p10"], record["wait_mean"]
    times = RankStepTimes.from_record(record)
    assert times.wait_mean == ()
    assert times.compute_p10 == () and slow_workers(times.compute_p50, 1.5, times.steps, None,
                                                    times.compute_p10) == {1: 3.0}


def test_only_a_worker_slow_in_two_epochs_in_a_row_is_named():
    assert persisting({0: 2.4}, set()) == {}  # the first slow epoch: maybe a hiccup
    assert persisting({0: 2.4, 1: 1.6}, {0}) == {0: 2.4}
    assert persisting({}, {0, 1}) == {}


def _times(p50):
    n = len(p50)
    return RankStepTimes((10,) * n, (320,) * n, tuple(p50), tuple(p50), tuple(p50),
                         (0.0,) * n, (0.0,) * n)


def _cfg(*flags):
    return config_from_args(build_parser().parse_args(["train", *flags]))


def test_only_the_slow_worker_warns_with_its_rank_host_pid_and_what_to_do(capsys):
    check = SlowRankCheck(_cfg(), rank=3)
    check.bind_world(1, 2)
    assert check(_times([0.001, 0.003]), 1) == {}  # one slow epoch names nobody
    assert capsys.readouterr().out == ""
    assert check(_times([0.001, 0.003]), 2) == {"slow_workers": {"1": 3.0}}
    out = capsys.readouterr().out
    assert "slow rank 3 (worker 1, host " in out and "pid " in out and "epoch 2" in out
    assert "3.0x" in out and "--balance" in out and "--bsp --backup-workers 1" in out
    assert "--straggler" not in out
    check.bind_world(0, 2)  # the fast worker only notes it in the epoch line
    assert check(_times([0.001, 0.003]), 3) == {"slow_workers": {"1": 3.0}}
    assert capsys.readouterr().out == ""
    assert check(_times([0.001, 0.0011]), 4) == {}
    assert check(_times([0.001, 0.003]), 5) == {}  # slow again: a new streak starts


def test_a_worker_that_stays_slow_is_named_once_a_streak(capsys):
    check = SlowRankCheck(_cfg(), rank=1)
    check.bind_world(1, 2)
    slow, fast = _times([0.001, 0.003]), _times([0.001, 0.0011])
    named = []
    for epoch, times in enumerate([slow, slow, slow, slow, fast, slow, slow, slow], start=1):
        line = check(times, epoch)
        named.append((epoch, bool(line), "warning: slow rank" in capsys.readouterr().out))
    # every epoch line of a streak names it (from its second slow epoch); one warning a streak
    assert named == [(1, False, False), (2, True, True), (3, True, False), (4, True, False),
                     (5, False, False), (6, False, False), (7, True, True), (8, True, False)]


@pytest.mark.parametrize("flags, says, not_said", [
    ([], ["--balance gives it", "--mode async --bsp --backup-workers 1"], ["--balance is on"]),
    (["--balance"], ["--balance is on and moves its share"], ["--balance gives it"]),
    (["--mode", "async"], ["--staleness-lr weighs them down", "--bsp --backup-workers 1"],
     ["--local-steps auto"]),
    (["--mode", "async", "--staleness-lr"], ["--staleness-lr already weighs"], []),
    (["--mode", "async", "--bsp"], ["Every --bsp round waits", "--backup-workers 1 drops"],
     ["--staleness-lr"]),
    # its rounds do not wait for it, and the run drops its gradients already
    (["--mode", "async", "--bsp", "--backup-workers", "1"], ["--backup-workers 1 already "
     "closes each --bsp round without its late gradient"], ["--staleness-lr", "waits for it"]),
    (["--mode", "async", "--local-steps", "8"], ["--local-steps auto"], ["--staleness-lr"]),
    (["--mode", "async", "--local-steps", "auto"], ["--dynamic-local-steps already"],
     ["--local-steps auto"]),
    (["--straggler", "3x"], ["--straggler 3x slows a worker on purpose", "--balance"], []),
])
def test_the_remedy_fits_the_scheme_and_leaves_out_what_the_run_does(flags, says, not_said):
    text = remedy(_cfg(*flags))
    assert all(s in text for s in says), text
    assert not any(s in text for s in not_said), text
    assert text.endswith("Or check the device or host it runs on.")


def test_the_slow_rank_factor_is_checked():
    with pytest.raises(ConfigError, match="--slow-rank-factor: invalid value 0.5; use 0"):
        config_from_args(build_parser().parse_args(["train", "--slow-rank-factor", "0.5"]))
    check = SlowRankCheck(_cfg("--slow-rank-factor", "0"), rank=1)
    check.bind_world(1, 2)
    assert check(_times([0.001, 0.01]), 1) == {}


def test_a_factor_stretches_the_samples_computed_and_a_fixed_delay_does_not():
    factor, fixed = parse_straggler("3x"), parse_straggler("50ms")
    assert factor.delay(1, 2, 0, 0.01, 0) == pytest.approx(0.02)
    assert factor.delay(1, 2, 0, 0.01, 0, work=0.25) == pytest.approx(0.005)
    assert fixed.delay(1, 2, 0, 0.01, 0, work=0.25) == pytest.approx(0.05)


def test_the_straggler_hook_gives_the_model_its_share_of_the_batch(monkeypatch):
    slept = []
    monkeypatch.setattr(hooks.time, "sleep", slept.append)
    hook = hooks.Straggler("3x", seed=0, batch_size=32)
    hook.bind_world(1, 2)
    hook.after_step(hooks.StepResult(Progress(), 0.5, 0.01, samples=8))
    hook.after_step(hooks.StepResult(Progress(), 0.5, 0.012, samples=32))
    # a share of 8 stretched at a whole batch's pace per sample, not its own (its fixed costs
    # would count twice): 2 x 12 ms x 8/32, though the step itself computed 9 ms
    hook.after_step(hooks.StepResult(Progress(), 0.5, 0.009, samples=8))
    assert slept == [pytest.approx(0.005), pytest.approx(0.024), pytest.approx(0.006)]


class _Summed(OwnGroup, Group):
    """Two workers' epoch sums: this worker's vector plus the other's, at once."""

    def __init__(self, other):
        self.other = other
        self.heard = []

    def workers(self):
        return 0, 2

    def sum_later(self, values):
        return PendingSum([a + b for a, b in zip(values, self.other + [0.0] * len(values))])

    def step_times_measured(self, times, epoch):
        self.heard.append((times, epoch))
        return {"batch_shares": [40, 24]}


def test_the_epoch_line_carries_every_workers_step_times(tmp_path):
    other = _timer([0.004] * 3, [0.0] * 3).vector(1, 2)
    # the other worker's totals (loss, samples, rate, loss weight, acc's sum and count):
    # nothing but its times
    scheme = _Summed([0.0] * 6 + other)
    timer = _timer([0.001] * 3, [0.003] * 3)
    # The trainer has the scheme hear them (Trainer's build_log); the log only calls its listeners.
    log = RunLog(1, scheme, ["acc"], True, False, False, timer=timer,
                 step_times_listeners=[scheme.step_times_measured])
    log.open(tmp_path, append=False, header={})
    log.end_epoch(0, 3, 0.1, 2, None, 0.1, {})
    log.close()
    line = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()][-1]
    assert line["step_times"]["compute_p50"] == [0.001, 0.004]
    assert line["step_times"]["steps"] == [3, 3]
    assert line["batch_shares"] == [40, 24]  # what the scheme noted
    assert scheme.heard[0][1] == 1 and scheme.heard[0][0].compute_p50 == (0.001, 0.004)


def test_the_run_log_asks_the_scheme_nothing_of_its_own(tmp_path):
    """The trainer asks for the --balance re-plan; the run log only writes lines: without the
    trainer's listeners, the scheme's step_times_measured is never called from the log."""
    other = _timer([0.004] * 3, [0.0] * 3).vector(1, 2)
    scheme = _Summed([0.0] * 5 + other)
    log = RunLog(1, scheme, ["acc"], True, False, False, timer=_timer([0.001] * 3, [0.003] * 3))
    log.open(tmp_path, append=False, header={})
    log.end_epoch(0, 3, 0.1, 2, None, 0.1, {})
    log.close()
    line = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()][-1]
    assert line["step_times"]["compute_p50"] == [0.001, 0.004]
    assert scheme.heard == [] and "batch_shares" not in line
