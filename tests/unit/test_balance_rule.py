"""--balance: the share rule (rules/balance.py), the unequal slices of each global batch
(data/builtin.py share_batches, both batch sources, the epoch plan), and the flags' checks."""

import numpy as np
import pytest
import torch

from hvdtrain.config import Config, ConfigError
from hvdtrain.data.builtin import epoch_batches, share_batches
from hvdtrain.data.in_memory import InMemoryBatches
from hvdtrain.data.loader import LoaderBatches
from hvdtrain.loop.epoch_plan import EpochPlan
from hvdtrain.rules.balance import (FixedCost, apportion, equal_shares, gradient_weight,
                                   plan_shares)
from hvdtrain.scheme import Batches, Progress, UpdateScheme


# --- the rule ----------------------------------------------------------------------------------
def test_equal_shares_split_the_remainder_over_the_first_workers():
    assert equal_shares(64, 2) == [32, 32]
    assert equal_shares(10, 3) == [4, 3, 3]


def test_shares_follow_throughput_all_the_way_without_damping():
    # Worker 1 takes 3x as long for the same samples: a third of worker 0's speed.
    assert plan_shares(64, [32, 32], [0.01, 0.03], floor=1, damping=1.0) == [48, 16]


def test_damping_moves_part_of_the_way():
    assert plan_shares(64, [32, 32], [0.01, 0.03], floor=1, damping=0.5) == [40, 24]


def test_the_floor_keeps_a_very_slow_worker_in():
    shares = plan_shares(64, [32, 32], [0.01, 1.0], floor=8, damping=1.0)
    assert shares == [56, 8]


def test_granularity_makes_every_share_a_multiple():
    shares = plan_shares(64, [32, 32], [0.01, 0.03], floor=5, granularity=4, damping=0.7)
    assert sum(shares) == 64 and all(s % 4 == 0 and s >= 8 for s in shares), shares


def test_equal_speeds_keep_equal_shares():
    assert plan_shares(96, [32, 32, 32], [0.02, 0.02, 0.02]) == [32, 32, 32]


def test_a_worker_without_a_figure_keeps_the_shares():
    assert plan_shares(64, [40, 24], [0.01, 0.0]) == [40, 24]


def test_the_fixed_part_of_a_step_is_not_taken_for_slowness():
    # Issue 41: worker 1 recovered at a share of 14, and both now take 0.005 ms a sample plus a
    # fixed 0.6 ms a step. From the whole step times its speed looks like 14 / 0.67 against
    # 50 / 0.85, and the shares crept back a sample an epoch; per sample the two are equal.
    compute = [0.0006 + 0.000005 * s for s in (50, 14)]
    assert plan_shares(64, [50, 14], compute, floor=8, damping=1.0) == [47, 17]
    assert plan_shares(64, [50, 14], compute, floor=8, damping=1.0, fixed=0.0006) == [32, 32]
    # an estimate at or above a step's time is capped: the speeds stay finite and positive
    assert sum(plan_shares(64, [50, 14], compute, floor=8, fixed=1.0)) == 64


def test_the_fixed_cost_is_learned_from_a_worker_measured_at_two_shares():
    cost = FixedCost(min_move=4)
    assert cost.update([32, 32], [0.00076, 0.00228]) == 0.0  # one epoch: no line yet
    # worker 0 at 32 then 40 samples: the line through both meets 0 samples at 0.6 ms;
    # worker 1's time fell with its share, at its own (slower) pace: 0.6 ms as well
    assert cost.update([40, 24], [0.0008, 0.00186]) == pytest.approx(0.0006)
    # shares that did not move keep the estimate; a line that falls as its share grows (the
    # device got faster in between) tells nothing
    assert cost.update([40, 24], [0.0008, 0.0007]) == pytest.approx(0.0006)
    assert cost.update([48, 16], [0.0007, 0.0007]) == pytest.approx(0.0006)
    # a line that meets 0 samples below 0 (noise) tells nothing either: as the smallest it
    # had set the fixed cost to 0 for the rest of the run
    assert cost.update([56, 8], [0.00175, 0.0009]) == pytest.approx(0.0006)
    cost.update([32, 32], [0.001, 0.001])  # another world size forgets the estimates
    assert cost.update([32, 32, 32], [0.001] * 3) == 0.0


def recovery(fixed_cost: bool, epochs=14, slow=range(1, 7)):
    """Shares of worker 1 over the epochs of a run whose worker 1 is a 3x straggler (as
    --straggler 3x stretches a step) for epochs 1-6, then recovers: a small model, where
    0.6 ms of a 0.76 ms step is fixed."""
    fixed, per_sample, batch = 0.0006, 0.000005, 32
    shares, cost, history = [32, 32], FixedCost(min_move=4), []
    for epoch in range(1, epochs + 1):
        slowdown = 2 * (fixed + per_sample * batch) / batch if epoch in slow else 0.0
        compute = [fixed + per_sample * shares[0],
                   fixed + (per_sample + slowdown) * shares[1]]
        known = cost.update(shares, compute) if fixed_cost else 0.0
        shares = plan_shares(64, shares, compute, floor=8, damping=0.5, fixed=known)
        history.append(shares[1])
    return history


def test_a_recovered_worker_gets_its_share_back():
    before, after = recovery(fixed_cost=False), recovery(fixed_cost=True)
    assert before[5] < 16 and max(before[6:11]) < 16  # the old plan: still under half after 5
    assert after[5] == 8 and after[10] >= 28 and after[-1] >= 30, after


@pytest.mark.parametrize("args", [
    dict(global_batch=64, samples=[32, 32], compute=[0.1]),          # lengths differ
    dict(global_batch=10, samples=[5, 5], compute=[1, 1], floor=5, granularity=2),  # 2 x 6 > 10
    dict(global_batch=63, samples=[32, 31], compute=[1, 1], granularity=2),  # not a multiple
    dict(global_batch=64, samples=[32, 32], compute=[1, 1], damping=0),
])
def test_impossible_plans_are_refused(args):
    with pytest.raises(ValueError):
        plan_shares(**args)


@pytest.mark.parametrize("seed", range(20))
def test_apportion_always_adds_up_and_respects_floor_and_granularity(seed):
    rng = np.random.default_rng(seed)
    n, g = int(rng.integers(1, 6)), int(rng.integers(1, 4))
    total = g * int(rng.integers(n * 3, n * 20))
    floor = int(rng.integers(1, total // n // 2 + 2))
    wanted = rng.exponential(size=n).tolist()
    least = max(1, -(-floor // g)) * g
    if n * least > total:
        return
    shares = apportion(total, wanted, floor, g)
    assert sum(shares) == total and all(s >= least and s % g == 0 for s in shares), shares


def test_apportion_refuses_wanted_shares_it_cannot_scale():
    for wanted in ([], [0, 0], [-1, 5]):
        with pytest.raises(ValueError):
            apportion(64, wanted)


def test_gradient_weights_average_to_the_global_mean():
    # Horovod's Average of weight_i * mean_i equals the mean over the union.
    rng = np.random.default_rng(0)
    shares = [10, 30, 24]
    values = [rng.normal(size=s) for s in shares]
    total = sum(shares)
    averaged = np.mean([gradient_weight(s, total, 3) * v.mean() for s, v in zip(shares, values)])
    assert averaged == pytest.approx(np.concatenate(values).mean(), rel=1e-12)


# --- the slices ---------------------------------------------------------------------------------
@pytest.mark.parametrize("n, batch, workers", [(1437, 32, 2), (100, 3, 3), (37, 2, 5), (64, 8, 2)])
def test_equal_shares_are_the_equal_split(n, batch, workers):
    for epoch in range(3):
        for w in range(workers):
            assert np.array_equal(share_batches(n, batch, w, [batch] * workers, epoch, 7),
                                  epoch_batches(n, batch, w, workers, epoch, 7))


@pytest.mark.parametrize("shares", [[8, 56], [56, 8], [17, 47], [1, 63]])
def test_unequal_shares_use_every_sample_of_the_global_batch_once(shares):
    n, batch, workers, seed = 1437, 32, 2, 3
    for epoch in (0, 4):
        equal = [epoch_batches(n, batch, w, workers, epoch, seed) for w in range(workers)]
        cut = [share_batches(n, batch, w, shares, epoch, seed) for w in range(workers)]
        assert [c.shape for c in cut] == [(len(equal[0]), s) for s in shares]
        for step in range(len(equal[0])):
            union = np.concatenate([c[step] for c in cut])
            assert len(set(union.tolist())) == len(union) == batch * workers
            assert sorted(union) == sorted(np.concatenate([e[step] for e in equal]))


def test_shares_that_do_not_add_up_are_refused():
    with pytest.raises(ValueError, match="adding up"):
        share_batches(100, 8, 0, [8, 7], 0, 0)


class Shares(UpdateScheme):
    def __init__(self, shares):
        self.batches = FixedShares(shares)


class FixedShares(Batches):
    def __init__(self, shares):
        self.shares = shares

    def batch_shares(self):
        return self.shares


def plan_for(source, worker, shares, batch=8):
    run = Config().run
    run.batch_size = batch
    plan = EpochPlan(run, source)
    plan.bind_world(worker, len(shares))
    plan.ask_for_feed(Shares(shares))
    return plan


def data(n=100):
    x = torch.arange(n, dtype=torch.float32)[:, None]
    return x, torch.arange(n)


class Rows(torch.utils.data.Dataset):
    def __init__(self, n):
        self.x, self.y = data(n)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


@pytest.mark.parametrize("make", [lambda: InMemoryBatches(*data()),
                                  lambda: LoaderBatches(Rows(100))])
def test_both_sources_cut_the_shares_and_resume_mid_epoch(make):
    shares = [4, 12]
    full = [[y.tolist() for _, y in plan_for(make(), w, shares).batches(Progress(epoch=2))]
            for w in range(2)]
    assert [len(b) for b in full[0]] == [4] * 6 and [len(b) for b in full[1]] == [12] * 6
    for step in range(6):
        want = share_batches(100, 8, 0, shares, 2, 0)[step].tolist() + \
            share_batches(100, 8, 1, shares, 2, 0)[step].tolist()
        assert full[0][step] + full[1][step] == want
    # A resume at step 4 of the epoch reads that epoch's last two batches with the same shares.
    resumed = [y.tolist() for _, y in plan_for(make(), 1, shares).batches(
        Progress(epoch=2, step=4))]
    assert resumed == full[1][4:]


class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        x, y = data(100)
        return iter(zip(x, y))


def stream_batches(worker, shares, first=0, data_workers=0):
    source = LoaderBatches(Stream(), stream_steps=6, data_workers=data_workers)
    try:
        return [y.tolist() for _, y in plan_for(source, worker, shares).batches(
            Progress(epoch=1, step=first))]
    finally:
        source.close()


def test_a_stream_cuts_the_same_global_batches_into_the_shares():
    equal = [stream_batches(w, [8, 8]) for w in range(2)]
    assert equal[0][0] == list(range(0, 16, 2)) and equal[1][0] == list(range(1, 16, 2))
    cut = [stream_batches(w, [4, 12]) for w in range(2)]
    assert [len(b) for b in cut[0]] == [4] * 6 and [len(b) for b in cut[1]] == [12] * 6
    for step in range(6):
        assert cut[0][step] + cut[1][step] == equal[0][step] + equal[1][step]
    assert stream_batches(1, [4, 12], first=4) == cut[1][4:]  # resume mid-epoch


class Fixed(InMemoryBatches):
    @property
    def takes_shares(self):
        return False


def test_a_source_that_cannot_cut_shares_refuses_balance():
    with pytest.raises(ConfigError, match="--balance: the training data"):
        plan_for(Fixed(*data()), 0, [4, 12])


# --- the flags ------------------------------------------------------------------------------
@pytest.mark.parametrize("flags, match", [
    (dict(mode="async"), "--balance.*async"),
    (dict(reduce_op="adasum"), "--balance.*adasum"),
    (dict(local_steps=4), "--balance gives.*--local-steps 4"),
    (dict(elastic=True, run_dir="x"), "--balance does not work with --elastic"),
    (dict(balance_floor=0), "--balance-floor"),
    (dict(balance_floor=1.5), "--balance-floor"),
    (dict(balance_damping=0), "--balance-damping"),
])
def test_what_balance_does_not_compose_with_is_refused(flags, match):
    with pytest.raises(ConfigError, match=match):
        Config.from_overrides({"balance": True, **flags}).validate()


@pytest.mark.parametrize("flags, match", [
    (dict(batch_size=1), "--balance: no share can move: every worker's share must be at least "
                         "1 sample .* all of --batch-size 1"),
    (dict(batch_size=4, backward_passes_per_step=4), "at least 4 samples"),
    (dict(batch_size=8, balance_floor=1.0), "--balance-floor 1 of --batch-size 8"),
    (dict(batch_size=4, stages=2, micro_batches=4), "at least 4 samples"),
])
def test_balance_where_no_share_can_move_is_refused(flags, match):
    with pytest.raises(ConfigError, match=match):
        Config.from_overrides({"balance": True, **flags}).validate()


@pytest.mark.parametrize("flags", [dict(balance_floor=0.5), dict(balance_damping=1.0)])
def test_the_balance_options_without_balance_are_refused(flags):
    (name, _), = flags.items()
    flag = "--" + name.replace("_", "-")
    with pytest.raises(ConfigError, match=f"{flag}: .*add --balance, or drop {flag}"):
        Config.from_overrides(flags).validate()
    Config.from_overrides({"balance": True, **flags}).validate()


def test_balance_in_one_process_is_refused(monkeypatch):
    import horovod.torch as hvd

    monkeypatch.setattr(hvd, "size", lambda: 1)
    monkeypatch.setattr(hvd, "rank", lambda: 0)
    from hvdtrain.sync.shares import BalancedSync

    cfg = Config.from_overrides({"balance": True}).validate()
    with pytest.raises(ConfigError, match="this run has one process: start 2 or more"):
        BalancedSync(cfg, runtime=None)


def test_balance_composes_with_accumulation_and_fp16():
    Config.from_overrides({"balance": True, "backward_passes_per_step": 2,
                           "compression": "fp16"}).validate()


# --- the scheme ---------------------------------------------------------------------------------
def balanced_scheme(monkeypatch, **options):
    """A BalancedSync for rank 0 of 2, without a launcher (Horovod's size and rank stood in)."""
    import horovod.torch as hvd

    from hvdtrain.sync.shares import BalancedSync

    monkeypatch.setattr(hvd, "size", lambda: 2)
    monkeypatch.setattr(hvd, "rank", lambda: 0)
    cfg = Config.from_overrides({"balance": True, **options}).validate()
    return BalancedSync(cfg, runtime=None)


def times(samples, compute, steps=(22, 22)):
    from hvdtrain.loop.step_times import RankStepTimes

    return RankStepTimes(steps=steps, samples=tuple(s * n for s, n in zip(samples, steps)),
                         compute_p50=compute, compute_p90=compute, compute_mean=compute,
                         wait_p50=(0, 0), wait_p90=(0, 0))


def test_the_scheme_replans_at_epoch_ends_and_logs_both_shares(monkeypatch):
    scheme = balanced_scheme(monkeypatch, balance_damping=1.0)
    assert scheme.batches.batch_shares() == [32, 32]
    noted = scheme.batches.step_times_measured(times([32, 32], (0.001, 0.003)), epoch=1)
    assert noted == {"batch_shares": [32, 32], "next_batch_shares": [48, 16]}
    assert scheme.batches.batch_shares() == [48, 16]
    # A very slow worker stops at the floor, a quarter of the equal share.
    scheme.batches.step_times_measured(times([48, 16], (0.001, 0.1)), epoch=2)
    assert scheme.batches.batch_shares() == [56, 8]


def test_the_scheme_keeps_its_shares_without_figures(monkeypatch):
    scheme = balanced_scheme(monkeypatch)
    scheme.shares = [40, 24]
    scheme.batches.step_times_measured(times([40, 24], (0.001, 0.003), steps=(0, 0)), epoch=3)
    assert scheme.batches.batch_shares() == [40, 24]


def test_shares_are_multiples_of_the_backward_passes(monkeypatch):
    scheme = balanced_scheme(monkeypatch, backward_passes_per_step=4, balance_floor=0.1,
                             balance_damping=1.0)
    scheme.batches.step_times_measured(times([32, 32], (0.001, 0.05)), epoch=1)
    shares = scheme.batches.batch_shares()
    assert all(s % 4 == 0 for s in shares) and min(shares) == 4
    assert scheme._fits([56, 8]) and not scheme._fits([58, 6]) and not scheme._fits([32, 32, 0])


def test_a_stream_with_loader_processes_cuts_the_same_shares():
    assert stream_batches(1, [4, 12], data_workers=2) == stream_batches(1, [4, 12])


def test_a_model_with_batchnorm_keeps_two_samples_per_backward_pass():
    """A straggler's share at the floor of a sample per micro-batch crashed a BatchNorm model
    in its second epoch (torch trains BatchNorm on 2 or more samples)."""
    import torch.nn as nn

    from hvdtrain.rules.balance import batchnorm_floor

    normed = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    assert batchnorm_floor(4, normed, passes=4) == 8
    assert batchnorm_floor(4, nn.Sequential(nn.Linear(4, 4)), passes=4) == 4
    assert batchnorm_floor(12, normed, passes=4) == 12  # the --balance-floor is higher already
