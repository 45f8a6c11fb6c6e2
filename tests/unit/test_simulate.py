"""The simulated cluster (hvdtrain/compare/sim/): its virtual clock against closed forms
and hand-built timelines, its arithmetic against an independent computation of sync training,
and each mode's rule (SSP's bound, backup workers' dropped gradients, local SGD's averaging)."""

from __future__ import annotations

import math
import statistics
from itertools import pairwise

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DistributedSampler

from hvdtrain.compare.plan import Mode, modes
from hvdtrain.compare.sim import timing as sim_timing
from hvdtrain.compare.sim.flat_model import config_from_train_args
from hvdtrain.compare.sim.simulation import Simulation
from hvdtrain.compare.sim.sweep import simulate_run, strong_scaling_args, sweep
from hvdtrain.compare.sim.timing import Timing, measure_timing
from hvdtrain.config import ConfigError, DataConfig, ModelConfig
from hvdtrain.data.builtin import load_dataset
from hvdtrain.models import build_model
from hvdtrain.ps.dispatch import SlotPlan
from hvdtrain.stragglers import parse_straggler

SYNC = Mode("sync", scheme="sync")
ASYNC = Mode("async")
# Small and single-threaded: dozens of tiny steps run fastest on one core.
DIGITS = ["--dataset", "digits", "--model", "mlp", "--hidden", "32", "--threads", "1"]
ONE_SECOND_STEPS = Timing(step_seconds=1.0)


def simulation(mode: Mode, workers: int, *flags: str, straggler: str = "", seed: int = 0,
               timing: Timing = ONE_SECOND_STEPS, target: float = 0.9,
               eval_every_steps: int | None = None) -> Simulation:
    sim = Simulation(mode, workers, straggler, seed, [*DIGITS, *flags], target, timing,
                     eval_every_steps)
    sim.result = sim.run()
    return sim


def steps(epochs: int, per_epoch: int) -> tuple[str, ...]:
    return ("--epochs", str(epochs), "--max-steps-per-epoch", str(per_epoch))


# --- the virtual clock -------------------------------------------------------------------------
def test_sync_rounds_under_exponential_delays_take_the_expected_maximum_of_n_draws():
    n, mean = 8, 0.05
    sim = simulation(SYNC, n, "--batch-size", "2", *steps(2, 89), straggler="exp:50ms",
                     timing=Timing(step_seconds=0.0))
    rounds = sim.round_seconds
    assert len(rounds) == 2 * 89
    # Draw for draw, every round (an epoch's end included): each lasts the longest of the N
    # delays a real run would sleep.
    model = parse_straggler("exp:50ms")

    def longest(k: int) -> float:
        return max(model.delay(w, n, k, 0.0, 0) for w in range(n))
    assert rounds == pytest.approx([longest(k) for k in range(len(rounds))])
    assert sim.result.wall_seconds == pytest.approx(sum(rounds))
    # So the clock's rounds are these maxima, and their mean is checked on as many rounds as a
    # few percent need, drawn as the rounds above were (simulating each round trains all N
    # workers: seconds). The maximum of N exponentials with mean m has mean H_N * m and
    # variance m^2 * sum(1/i^2), i = 1..N: allow four standard errors of the mean.
    maxima = [longest(k) for k in range(17 * 89)]
    harmonic = sum(1 / i for i in range(1, n + 1))
    sd = mean * math.sqrt(sum(1 / i ** 2 for i in range(1, n + 1)))
    tolerance = 4 * sd / math.sqrt(len(maxima))
    assert abs(statistics.fmean(maxima) - harmonic * mean) < tolerance
    assert tolerance / (harmonic * mean) < 0.05  # "within a few percent"


def test_sync_under_a_persistent_straggler_takes_its_time_every_round():
    sim = simulation(SYNC, 4, *steps(2, 5), straggler="3x", timing=Timing(step_seconds=0.1))
    assert sim.round_seconds == pytest.approx([0.3] * 10)
    assert sim.result.wall_seconds == pytest.approx(3.0)
    assert sim.result.samples_per_sec == pytest.approx(10 * 4 * 32 / 3.0)


def test_a_straggler_stretches_the_update_but_not_the_loop_around_it():
    # A real straggler sleeps (k-1) times scheme.step's time (loop/hooks.py): the loop's own
    # time per step is added once, in every mode.
    timing = Timing(step_seconds=0.1, loop_seconds=0.02)
    sync = simulation(SYNC, 4, *steps(2, 5), straggler="3x", timing=timing)
    assert sync.round_seconds == pytest.approx([0.02 + 0.3] * 10)
    local = simulation(Mode("local4", scheme="sync", local_steps=4), 2, *steps(1, 8),
                       straggler="3x", timing=timing)
    assert local.round_seconds == pytest.approx([4 * (0.02 + 0.3)] * 2)
    slow_async = simulation(ASYNC, 2, *steps(1, 4), straggler="3x", timing=timing)
    # worker 1: the loop, the update, then twice the update asleep; worker 0 never sleeps. The
    # job's 8 batches go to whoever asks (pushes at .12 .12 .24 .36 .44 .48 hand out the last
    # six): the fast worker trains 5, the straggler 3.
    assert [p.time for p in slow_async.pushes if p.worker == 1] == pytest.approx(
        [0.12 + 0.32 * k for k in range(3)])
    assert [p.time for p in slow_async.pushes if p.worker == 0] == pytest.approx(
        [0.12 * (k + 1) for k in range(5)])


def expected_staleness(order: list[int], workers: int) -> dict[int, int]:
    """The staleness histogram of pushes by these workers, in this order, at an instant server:
    each worker's next gradient is computed on the weights right after its own update."""
    pulled, hist = [0] * workers, {}
    for version, w in enumerate(order):
        staleness = version - pulled[w]
        hist[staleness] = hist.get(staleness, 0) + 1
        pulled[w] = version + 1
    return hist


def handed_out(push_times: list[list[float]], batches: int) -> list[int]:
    """How many of the job's ``batches`` each worker trains when every worker holds one from
    the start and each push, in time order, hands the next one to its worker (ps/dispatch.py)."""
    left = batches - len(push_times)
    trained, running = [0] * len(push_times), set(range(len(push_times)))
    for _, w in sorted((t, w) for w, times in enumerate(push_times) for t in times):
        if w in running:
            trained[w] += 1
            if left:
                left -= 1
            else:
                running.discard(w)
    return trained


def test_async_with_a_3x_straggler_the_fast_worker_takes_three_steps_per_slow_one():
    per_worker = 10
    sim = simulation(ASYNC, 2, *steps(1, per_worker), straggler="3x")
    # Steps of 1 s; the straggler sleeps 2 s after each of its own: it pushes at 1, 4, 7, ...
    # The job's 20 batches go to whoever asks next, so the fast worker trains more of them.
    n_fast, n_slow = handed_out([[1.0 + k for k in range(20)], [1.0 + 3 * k for k in range(20)]],
                                2 * per_worker)
    assert (n_fast, n_slow) == (14, 6)
    fast = [1.0 + k for k in range(n_fast)]
    slow = [1.0 + 3 * k for k in range(n_slow)]
    assert [p.time for p in sim.pushes if p.worker == 0] == fast
    assert [p.time for p in sim.pushes if p.worker == 1] == slow
    # The server applies them in time order (pushes at the same time in either order).
    times = [p.time for p in sim.pushes]
    assert times == sorted(times)
    assert sim.result.staleness_histogram == expected_staleness(
        [p.worker for p in sim.pushes], 2)
    # The slow worker's gradients, but its first, are 3 updates stale (give or take the order
    # at a tie), the fast worker's at most 1.
    slow_staleness = [p.staleness for p in sim.pushes if p.worker == 1 and p.time <= fast[-1]]
    assert all(s in (2, 3, 4) for s in slow_staleness[1:])
    assert max(p.staleness for p in sim.pushes if p.worker == 0) <= 1
    # while both run, three fast pushes between two slow ones
    between = [sum(1 for t in fast if a < t <= b) for a, b in pairwise(slow) if b <= fast[-1]]
    assert between and set(between) == {3}
    hist = sim.result.staleness_histogram
    assert sim.result.mean_staleness == pytest.approx(
        sum(k * v for k, v in hist.items()) / sum(hist.values()))


def test_async_workers_sleep_the_draws_of_their_own_steps():
    # Each worker sleeps after its k-th step the delay a real worker draws for (itself, k).
    model, per_worker = parse_straggler("exp:50ms"), 8
    sim = simulation(ASYNC, 2, *steps(1, per_worker), straggler="exp:50ms", seed=5,
                     timing=Timing(step_seconds=0.1))
    schedules = []
    for w in range(2):
        expected, t = [], 0.0
        for k in range(2 * per_worker):
            t += 0.1
            expected.append(t)
            t += model.delay(w, 2, k, 0.1, 5)
        schedules.append(expected)
    trained = handed_out(schedules, 2 * per_worker)  # the job's batches, to whoever asks
    assert len(sim.pushes) == 2 * per_worker
    for w in range(2):
        assert [p.time for p in sim.pushes if p.worker == w] == pytest.approx(
            schedules[w][:trained[w]])


def test_a_single_server_saturates():
    # 8 workers whose steps take as long as one update: the server, a queue, is the bottleneck.
    timing = Timing(step_seconds=0.01, apply_seconds=0.01)
    sim = simulation(ASYNC, 8, *steps(1, 5), timing=timing)
    pushes = 8 * 5
    assert sim.result.wall_seconds >= pushes * timing.apply_seconds
    assert sim.result.wall_seconds < (pushes + 2) * timing.apply_seconds
    finished = [p.time for p in sim.pushes]
    assert finished == sorted(finished)
    assert min(b - a for a, b in pairwise(finished)) == pytest.approx(0.01)


# --- the modes' rules --------------------------------------------------------------------------
def test_ssp_never_lets_a_worker_run_more_than_the_bound_ahead():
    bound = 1
    ssp = simulation(Mode("ssp1", staleness=float(bound)), 2, *steps(1, 12), straggler="3x")
    free = simulation(ASYNC, 2, *steps(1, 12), straggler="3x")

    def leads(sim):  # the fast worker's clock ahead of the slow one's, at each of its pushes
        return [p.ahead for p in sim.pushes if p.worker == 0]
    # A worker at clock c starts a step only while c - slowest <= bound, so it pushes at most
    # bound + 1 ahead; without a bound it runs far ahead.
    assert max(leads(ssp)) == bound + 1
    assert max(leads(free)) > bound + 1
    assert ssp.result.wall_seconds >= free.result.wall_seconds
    assert ssp.result.mean_staleness < free.result.mean_staleness


@pytest.mark.parametrize("workers", [2, 3])
def test_backup_workers_drop_the_straggler_gradients(workers):
    per_worker = 9
    backup = workers - 1
    sim = simulation(Mode(f"backup{backup}", staleness=0.0, bsp=True, backup_workers=backup),
                     workers, *steps(1, per_worker), straggler="3x")
    straggler = workers - 1
    fast_done = max(p.time for p in sim.pushes if p.worker != straggler)
    late = [p for p in sim.pushes if p.worker == straggler]
    # Steps of 1 s; the straggler sleeps 2 s after each of its own: it pushes at 1, 4, 7, ...
    # (a dropped push is answered at once). The job's batches go to whoever asks next, so it
    # trains fewer of them than a fixed share would give it.
    times = [[1.0 + k for k in range(workers * per_worker)]] * (workers - 1)
    trained = handed_out([*times, [1.0 + 3 * k for k in range(workers * per_worker)]],
                         workers * per_worker)
    assert len(late) == trained[straggler] < per_worker
    assert [p.time for p in late] == [1.0 + 3 * k for k in range(len(late))]
    # A push at t carries a gradient of the weights it received at t - 3. While the others
    # run, a round has closed since then: dropped. Only a push computed after they are done
    # could be applied, in a round of its own, and the job's batches leave it at most one.
    # (Its first push, at 1 s with everyone's, may make the first round: all were computed
    # on the initial weights.)
    fresh = [p.time - 3 >= fast_done for p in late[1:]]
    assert [p.staleness == 0 for p in late[1:]] == fresh
    assert [p.staleness is None for p in late[1:]] == [not f for f in fresh]
    assert fresh.count(False) >= 3 and fresh.count(True) <= 1
    applied = sum(1 for p in sim.pushes if p.staleness is not None)
    assert sim.result.staleness_histogram == {0: applied}
    assert sim.result.mean_staleness == 0


def test_backup_rounds_take_the_first_n_minus_b_and_drop_the_rest():
    # No straggler: all finish together, and at a tie the server's order is a seeded draw.
    n, b, per_worker = 4, 1, 8
    sim = simulation(Mode("backup1", staleness=0.0, bsp=True, backup_workers=b), n,
                     *steps(1, per_worker))
    dropped = [p.worker for p in sim.pushes if p.staleness is None]
    rounds = sum(1 for p in sim.pushes if p.staleness is not None) // (n - b)
    assert len(dropped) == per_worker * n - rounds * (n - b)
    assert rounds == per_worker  # every step, one round of N-b; its b late gradients dropped
    assert len(set(dropped)) > 1  # not always the same rank: no shard is left out for good


def test_backup_workers_share_the_jobs_batches_so_no_worker_trains_on_alone():
    # One backup among 3 workers, the last 3x slower: its gradients are dropped while the
    # others push. With a fixed share per worker it still held two thirds of its batches
    # when they had finished, and trained them alone in rounds of one gradient at lr x (N-b)
    # (issue 25: 2 points of test accuracy). From the job's batches, all end together.
    per_epoch = 12
    sim = simulation(Mode("backup1", staleness=0.0, bsp=True, backup_workers=1), 3,
                     *steps(1, per_epoch), straggler="3x")
    assert len(sim.pushes) == 3 * per_epoch  # the job's batches, each trained once
    fast_done = max(p.time for p in sim.pushes if p.worker != 2)
    alone = [p for p in sim.pushes if p.time > fast_done]
    assert len(alone) <= 1, [(p.worker, p.clock, p.staleness) for p in alone]
    assert sum(p.worker == 2 for p in sim.pushes) < per_epoch  # the fast ones took more
    assert sorted(p.slot for p in sim.pushes) == list(range(3 * per_epoch))


def test_lock_step_server_rounds_equal_sync_training():
    # --bsp without backups averages every worker's gradient and steps with lr * N, as sync
    # does (ps/client.py lr_scale); the server's fused SGD is torch's arithmetic.
    flags = (*steps(2, 4), "--warmup-epochs", "0.5")
    sync = simulation(SYNC, 4, *flags, straggler="3x")
    bsp = simulation(Mode("bsp", staleness=0.0, bsp=True), 4, *flags, straggler="3x")
    assert torch.allclose(bsp.final_parameters, sync.final_parameters, atol=1e-6)
    assert not torch.equal(sync.final_parameters, initial_parameters(0))


BALANCED = Mode("balanced", scheme="sync", balance=True)
# 10 ms per full batch of 32, all of it in proportion to the samples: a 3x straggler's step then
# takes (1 + 2 * work) times its compute (stragglers.py), and balance can move work off it.
PROPORTIONAL = Timing(step_seconds=0.010, sample_seconds=0.010 / 32)


def test_balanced_under_a_3x_straggler_moves_work_to_the_fast_worker_and_trains_as_sync():
    flags = ("--batch-size", "32", *steps(4, 5))
    sync = simulation(SYNC, 2, *flags, straggler="3x", timing=PROPORTIONAL)
    balanced = simulation(BALANCED, 2, *flags, straggler="3x", timing=PROPORTIONAL)
    # Shares change the time only: the same rounds over the same global batches, the same
    # update (the share-weighted gradient is the global batch's), bit for bit.
    assert torch.equal(balanced.final_parameters, sync.final_parameters)
    assert balanced.curve == [{**p, "wall_seconds": q["wall_seconds"]}
                              for p, q in zip(sync.curve, balanced.curve)]
    # Epoch 1 at equal shares measures 10 ms against 30 ms: the fast worker is 3x as fast, so
    # plan_shares aims at 48/16 and, damped, moves half of the way; then on toward it.
    plans = balanced.clock.plans
    assert plans[:2] == [[32, 32], [40, 24]]
    assert all(a[0] <= b[0] for a, b in pairwise(plans)) and plans[-1][0] > 40
    assert sum(plans[-1]) == 64 and plans[-1][1] >= 1
    assert sync.round_seconds == pytest.approx([0.030] * 20)
    # epoch 2: worker 0 computes 40 samples in 12.5 ms; worker 1, 24 in 7.5 ms, then sleeps
    # 2 * 10 ms * 24/32 = 15 ms more (a whole batch's pace per sample, 10 ms for 32 samples)
    assert balanced.round_seconds[5:10] == pytest.approx([0.0225] * 5)
    assert balanced.result.wall_seconds < 0.8 * sync.result.wall_seconds
    assert balanced.result.samples_per_sec > 1.3 * sync.result.samples_per_sec
    # never past the ceiling: at best 48/16, where both compute 15 ms, half of sync's round
    assert min(balanced.round_seconds) >= 0.015 - 1e-12


def test_balanced_cannot_balance_away_a_fixed_delay_or_an_even_cluster():
    flags = ("--batch-size", "32", *steps(4, 5))
    timing = Timing(step_seconds=0.002, sample_seconds=0.002 / 32)
    sync = simulation(SYNC, 2, *flags, straggler="50ms", timing=timing)
    balanced = simulation(BALANCED, 2, *flags, straggler="50ms", timing=timing)
    # 50 ms a step whatever the share: no round gets shorter than the delay, so at most the
    # straggler's 2 ms of compute are saved
    assert sync.round_seconds == pytest.approx([0.052] * 20)
    assert min(balanced.round_seconds) >= 0.05
    assert balanced.result.wall_seconds > 0.96 * sync.result.wall_seconds
    assert torch.equal(balanced.final_parameters, sync.final_parameters)
    even = simulation(BALANCED, 2, *flags, timing=timing)  # equal speeds: equal shares
    assert even.clock.plans == [[32, 32]] * 5
    assert even.round_seconds == pytest.approx([0.002] * 20)


def test_balanced_is_refused_where_it_has_no_global_batch_to_share():
    with pytest.raises(ConfigError, match="--balance shares sync's global batch"):
        Simulation(Mode("x", balance=True), 2, "", 0, DIGITS, 0.9, Timing(0.01))


def test_local_sgd_with_one_local_step_is_sync_and_with_h_averages_every_h():
    flags = steps(1, 8)
    sync = simulation(SYNC, 3, *flags)
    local1 = simulation(Mode("local1", scheme="sync", local_steps=1), 3, *flags)
    # Averaging each worker's momentum step is the step of the averaged momentum (linearity).
    assert torch.allclose(local1.final_parameters, sync.final_parameters, atol=1e-6)
    local4 = simulation(Mode("local4", scheme="sync", local_steps=4), 3, *flags,
                        straggler="3x", timing=Timing(step_seconds=0.5, allreduce_seconds=0.25))
    # two rounds of 4 steps; the straggler's steps take 1.5 s each, then one allreduce
    assert local4.round_seconds == pytest.approx([4 * 1.5 + 0.25] * 2)
    assert not torch.allclose(local4.final_parameters, sync.final_parameters, atol=1e-4)
    # A round also ends where the model is read: at an epoch's end, and at an evaluation.
    cut = simulation(Mode("local4", scheme="sync", local_steps=4), 3, *steps(2, 5),
                     eval_every_steps=3)
    # evaluations at 3, 6, 9 and the epoch ends 5, 10; each average starts a count of H anew
    assert cut.round_seconds == pytest.approx([3, 2, 1, 3, 1])  # ends at 3, 5, 6, 9, 10
    assert [p["step"] for p in cut.curve] == [3, 5, 6, 9, 10]


@pytest.mark.parametrize("name", ["async", "ssp", "async-slr", "dcasgd", "backup"])
def test_one_async_worker_is_plain_sgd(name):
    # Alone, a worker's gradients are never stale: no scaling, no compensation, no dropping.
    mode = modes([name], [0], [0])[0]
    flags = steps(1, 6)
    alone = simulation(mode, 1, *flags)
    assert torch.allclose(alone.final_parameters, simulation(SYNC, 1, *flags).final_parameters,
                          atol=1e-6)
    assert alone.result.staleness_histogram == {0: 6}


# --- real gradients, real shards ---------------------------------------------------------------
def initial_parameters(seed: int) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in digits_model(seed).parameters()])


def digits_model(seed: int):
    data = load_dataset(DataConfig())
    torch.manual_seed(seed)  # as a real run draws its initial weights
    return build_model("mlp", data.input_shape, data.num_classes, ModelConfig(hidden=(32,)))


def flat(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def shards(n: int, epoch: int, seed: int, samples: int) -> list[list[int]]:
    """Worker r's sample indices in this epoch, from torch's DistributedSampler itself."""
    out = []
    for rank in range(n):
        sampler = DistributedSampler(range(samples), num_replicas=n, rank=rank, shuffle=True,
                                     seed=seed, drop_last=True)
        sampler.set_epoch(epoch)
        out.append(list(sampler))
    return out


def batch_gradient(model, data, shard: list[int], step: int, batch: int) -> list[torch.Tensor]:
    rows = torch.tensor(shard[step * batch:(step + 1) * batch])
    model.zero_grad()
    F.cross_entropy(model(data.x_train[rows]), data.y_train[rows]).backward()
    return [p.grad.clone() for p in model.parameters()]


def test_sync_final_model_equals_an_independent_computation():
    n, batch, per_epoch, epochs, seed, lr, momentum = 3, 32, 3, 2, 7, 0.05, 0.9
    sim = simulation(SYNC, n, "--batch-size", str(batch), *steps(epochs, per_epoch),
                     "--warmup-epochs", "0", seed=seed)
    data = load_dataset(DataConfig())
    model = digits_model(seed)
    params = list(model.parameters())
    buffers = [torch.zeros_like(p) for p in params]
    for epoch in range(epochs):
        shard = shards(n, epoch, seed, len(data.x_train))
        for step in range(per_epoch):
            grads = [batch_gradient(model, data, shard[r], step, batch) for r in range(n)]
            with torch.no_grad():  # the mean gradient; SGD with momentum at lr * N, no warmup
                for i, (p, buf) in enumerate(zip(params, buffers)):
                    buf.mul_(momentum).add_(sum(g[i] for g in grads) / n)
                    p -= lr * n * buf
    assert torch.allclose(sim.final_parameters, flat(model), atol=1e-5)
    assert not torch.allclose(flat(model), initial_parameters(seed), atol=1e-3)


def average(tensor_groups) -> None:
    """An allreduce with Average: every tensor of each group becomes the group's mean."""
    with torch.no_grad():
        for group in tensor_groups:
            mean = sum(t.detach() for t in group) / len(group)
            for t in group:
                t.copy_(mean)


def test_local_sgd_final_model_equals_an_independent_computation():
    # H = 2 and epochs of 3 steps: rounds of 2 steps, then 1 (a round ends with its epoch).
    # Each worker steps from the average with its own momentum; the momentum is averaged at
    # epoch ends (sync/local_rounds_scheme.py).
    n, batch, per_epoch, epochs, seed, lr, momentum = 2, 16, 3, 2, 1, 0.05, 0.9
    sim = simulation(Mode("local2", scheme="sync", local_steps=2), n, "--batch-size", str(batch),
                     *steps(epochs, per_epoch), "--warmup-epochs", "0", seed=seed)
    data = load_dataset(DataConfig())
    models = [digits_model(seed) for _ in range(n)]
    buffers = [[torch.zeros_like(p) for p in m.parameters()] for m in models]
    for epoch in range(epochs):
        shard = shards(n, epoch, seed, len(data.x_train))
        for steps_in_round in ([0, 1], [2]):
            for model, own, buf in zip(models, shard, buffers):
                for step in steps_in_round:
                    grads = batch_gradient(model, data, own, step, batch)
                    with torch.no_grad():
                        for p, g, b in zip(model.parameters(), grads, buf):
                            b.mul_(momentum).add_(g)
                            p -= lr * n * b
            average(zip(*(m.parameters() for m in models)))
        average(zip(*buffers))
    assert torch.allclose(sim.final_parameters, flat(models[0]), atol=1e-5)
    assert sim.round_seconds == pytest.approx([2.0, 1.0] * epochs)


def test_backup_rounds_apply_their_gradients_at_n_minus_b_times_the_rate():
    # Two workers, one backup: each round applies the one gradient that came first (the
    # server's order at a tie is the simulator's draw, read from its record), at lr * (N - b),
    # computed on the batch of the job's plan that its push carried.
    n, b, batch, per_epoch, seed, lr = 2, 1, 32, 6, 2, 0.05
    sim = simulation(Mode("backup1", staleness=0.0, bsp=True, backup_workers=b), n,
                     "--batch-size", str(batch), *steps(1, per_epoch), "--warmup-epochs", "0",
                     "--momentum", "0", seed=seed)
    applied = [p for p in sim.pushes if p.staleness is not None]
    assert len(applied) == per_epoch
    data = load_dataset(DataConfig())
    model = digits_model(seed)
    plan = SlotPlan(per_epoch, n, 1)  # the job's batches, handed out by server 0
    for push in applied:  # a fresh gradient: computed on the weights of the round before
        epoch, step, part = plan.locate(push.slot)  # batch `step` of part `part`'s share
        shard = shards(n, epoch, seed, len(data.x_train))[part]
        grads = batch_gradient(model, data, shard, step, batch)
        with torch.no_grad():
            for p, g in zip(model.parameters(), grads):
                p -= lr * (n - b) * g
    assert torch.allclose(sim.final_parameters, flat(model), atol=1e-5)


def test_straggler_free_sync_reaches_the_target_and_is_deterministic():
    args = [*DIGITS, "--epochs", "4"]
    def run():
        return simulate_run(SYNC, 4, "none", 3, args, 0.9, Timing(step_seconds=0.01))
    first, second = run(), run()
    assert first.status == "ok" and first.simulated and first.workers == 4
    assert first.final_test_acc >= 0.9 and first.time_to_target is not None
    reached = next(p for p in first.curve if p["test_acc"] >= 0.9)
    assert first.time_to_target == reached["wall_seconds"]
    assert [p["step"] for p in first.curve] == [11, 22, 33, 44]  # one evaluation per epoch
    assert first == second  # the same seed, the same run
    other = simulate_run(SYNC, 4, "none", 4, args, 0.9, Timing(step_seconds=0.01))
    assert other.curve != first.curve


# --- entry points ------------------------------------------------------------------------------
def test_sweep_records_the_workers_and_fails_what_cannot_run():
    # 64 workers of 32 samples are more than the 1437 digits of the training split.
    results = sweep([SYNC, ASYNC], [2, 64], [*DIGITS, *steps(1, 2)], 0.5,
                    lambda n: Timing(step_seconds=0.01, allreduce_seconds=0.001 * n))
    assert [(r.mode, r.workers, r.status) for r in results] == [
        ("sync", 2, "ok"), ("async", 2, "ok"), ("sync", 64, "failed"), ("async", 64, "failed")]
    assert "--batch-size" in results[-1].reason
    assert results[0].name == "sync-n2-seed0"
    assert results[0].wall_seconds == pytest.approx(2 * 0.012)  # the timing for 2 workers


# --- the sweep: strong scaling, runs that stop at the target --------------------------------------
def test_strong_scaling_splits_the_global_batch_and_scales_each_workers_rate_with_it():
    flags = [*DIGITS, "--lr", "0.08"]  # and the default --batch-size 32
    for workers, batch, lr in [(1, 64, 0.16), (2, 32, 0.08), (8, 8, 0.02), (64, 1, 0.0025)]:
        cfg = config_from_train_args(strong_scaling_args(flags, workers, 64), {})
        assert (cfg.run.batch_size, cfg.optim.lr) == (batch, pytest.approx(lr))
        assert cfg.optim.lr * workers == pytest.approx(0.16)  # sync's rate, lr x N: the same
    # --lr-scaling none: sync's rate is --lr at any N, so it is kept
    kept = config_from_train_args(strong_scaling_args([*flags, "--lr-scaling", "none"], 8, 64),
                                  {})
    assert (kept.run.batch_size, kept.optim.lr) == (8, 0.08)
    with pytest.raises(ConfigError, match="3 workers cannot split the global batch of 64"):
        strong_scaling_args(flags, 3, 64)


def test_under_strong_scaling_sync_trains_the_same_model_at_every_number_of_workers():
    # At each step the workers' batches together are the same global batch whatever N
    # (epoch_batches), and sync's rate lr x N is the same: the same training, up to the order
    # of the sums. Without warmup, which ramps from one worker's rate.
    flags = [*DIGITS, *steps(2, 5), "--warmup-epochs", "0"]
    final = {}
    for n in (1, 4, 16):
        sim = Simulation(SYNC, n, "", 0, strong_scaling_args(flags, n, 64), 0.9,
                         ONE_SECOND_STEPS)
        sim.run()
        assert sim.total_steps == 10
        final[n] = sim.final_parameters
    assert torch.allclose(final[4], final[1], atol=1e-5)
    assert torch.allclose(final[16], final[1], atol=1e-5)
    assert not torch.allclose(final[1], initial_parameters(0), atol=1e-3)


def test_a_strong_scaling_sweep_runs_where_weak_scaling_runs_out_of_samples():
    asked = []

    def timing(workers):  # a step's compute as the per-worker batch would have it
        asked.append(workers)
        return Timing(step_seconds=0.001 * 64 / workers)
    results = sweep([SYNC, ASYNC], [2, 64, 3], [*DIGITS, *steps(1, 4)], 0.99, timing,
                    global_batch=64, stop_at_target=True)
    assert [(r.mode, r.workers, r.status) for r in results] == [
        ("sync", 2, "ok"), ("async", 2, "ok"), ("sync", 64, "ok"), ("async", 64, "ok"),
        ("sync", 3, "failed"), ("async", 3, "failed")]
    assert "cannot split the global batch of 64" in results[-1].reason
    assert asked == [2, 64]
    for r in results[:4]:  # the same 4 global steps of 64 samples at every N
        assert r.curve[-1]["step"] == 4 and r.time_to_target is None
    assert results[0].wall_seconds == pytest.approx(4 * 0.032)
    assert results[2].wall_seconds == pytest.approx(4 * 0.001)
    assert results[2].samples_per_sec == pytest.approx(4 * 64 / 0.004)


@pytest.mark.parametrize("mode", [SYNC, ASYNC], ids=["sync", "async"])
def test_a_run_that_stops_at_the_target_ends_at_the_evaluation_that_reached_it(mode):
    args = [*DIGITS, "--epochs", "4"]

    def run(stop):
        return simulate_run(mode, 2, "3x", 3, args, 0.9, Timing(step_seconds=0.01),
                            eval_every_steps=2, stop_at_target=stop)
    full, stopped = run(False), run(True)
    assert full.time_to_target is not None
    assert stopped.time_to_target == full.time_to_target
    assert stopped.wall_seconds == stopped.time_to_target < full.wall_seconds
    assert stopped.curve == full.curve[:len(stopped.curve)]  # the same run, cut short
    assert stopped.curve[-1]["test_acc"] >= 0.9 > max(p["test_acc"] for p in stopped.curve[:-1])
    assert stopped.final_test_acc == stopped.curve[-1]["test_acc"]


def test_a_diverging_run_fails_as_a_real_one_would():
    # A real worker's loss guard (loop/stopping.py) ends the job at the first infinite or NaN loss.
    result = simulate_run(ASYNC, 2, "", 0, [*DIGITS, "--epochs", "1", "--lr", "1e10",
                                            "--warmup-epochs", "0"], 0.9, Timing(0.01))
    assert result.status == "failed" and "loss became" in result.reason
    assert "--staleness-lr (with 2 workers" in result.reason  # the real run's advice
    assert result.curve == [] and result.final_test_acc is None


def test_bad_input_names_the_fix():
    from hvdtrain.config import ConfigError

    with pytest.raises(ConfigError, match="--backup-workers 2 with 2 workers"):
        Simulation(Mode("backup2", staleness=0.0, bsp=True, backup_workers=2), 2, "", 0,
                   DIGITS, 0.9, Timing(0.01))
    with pytest.raises(ConfigError, match="unknown flag"):
        Simulation(SYNC, 2, "", 0, [*DIGITS, "--no-such-flag"], 0.9, Timing(0.01))
    with pytest.raises(ConfigError, match="step_seconds"):
        Simulation(SYNC, 2, "", 0, DIGITS, 0.9, Timing(-1.0))


def test_measure_timing_times_real_steps_on_the_threads_asked_for(monkeypatch):
    threads = []

    def on_threads(measure):
        def timed(*args):  # what the timed work runs on
            threads.append(torch.get_num_threads())
            return measure(*args)
        return timed
    for name in ("_median_seconds", "_compute_line"):  # the server's update; the step's line
        monkeypatch.setattr(sim_timing, name, on_threads(getattr(sim_timing, name)))
    before = torch.get_num_threads()
    timing = measure_timing([*DIGITS, "--threads", "3"], repeats=5, warmup=1,
                            push_seconds=0.002)
    assert 0 < timing.step_seconds < 1 and 0 < timing.apply_seconds < 1
    assert timing.push_seconds == 0.002 and timing.allreduce_seconds == 0.0
    assert threads == [3, 3] and torch.get_num_threads() == before  # the caller's again
    # the step's part per sample, from half batches: at most the whole step's time per sample
    assert 0 <= timing.sample_seconds <= timing.step_seconds / 32
    assert timing.compute_seconds(16, 32) <= timing.step_seconds


def test_a_step_s_compute_time_is_a_fixed_part_and_a_part_per_sample():
    fitted = Timing(step_seconds=0.010, sample_seconds=0.0002)  # 3.6 ms fixed at 32 samples
    assert fitted.compute_seconds(32, 32) == 0.010
    assert fitted.compute_seconds(16, 32) == pytest.approx(0.0068)
    assert fitted.compute_seconds(48, 32) == pytest.approx(0.0132)
    # one figure (old callers, --sim-step-ms): the whole step grows with its samples
    assert Timing(step_seconds=0.010).compute_seconds(8, 32) == pytest.approx(0.0025)
    with pytest.raises(ConfigError, match="Timing.sample_seconds"):
        Timing(0.01, sample_seconds=-1.0).check()


# --- a user's own Dataset ----------------------------------------------------------------------
USER_DATA = '''
import torch
from sklearn.datasets import load_digits
from torch.utils.data import TensorDataset


def tensors():
    x, y = load_digits(return_X_y=True)
    x, y = torch.tensor(x[:600] / 16, dtype=torch.float32), torch.tensor(y[:600])
    return (x[:480], y[:480]), (x[480:], y[480:])


def datasets():
    (a, b), (c, d) = tensors()
    train, test = TensorDataset(a, b), TensorDataset(c, d)
    train.classes = test.classes = list(range(10))
    return train, test
'''


@pytest.mark.parametrize("mode", [SYNC, ASYNC, *modes(["adiloco"], bounds=[], local_steps=[4])])
def test_a_users_dataset_simulates_as_its_tensors_do(tmp_path, monkeypatch, mode):
    """A Dataset is read through a DataLoader, which serves one iteration at a time: every
    virtual worker reads its own (BatchSource.another_reader). Before, the second worker's
    batches ended the first's with a RuntimeError."""
    (tmp_path / "user_data.py").write_text(USER_DATA)
    monkeypatch.chdir(tmp_path)
    results = []
    for loader in ("tensors", "datasets"):
        sim = Simulation(mode, 3, "", 0, ["--dataset", f"user_data.py:{loader}", "--model",
                                          "mlp", "--hidden", "32", "--threads", "1",
                                          *steps(2, 5)], 0.5, ONE_SECOND_STEPS, None)
        result = sim.run()
        assert result.status == "ok", result.reason
        results.append((result.final_test_acc, [p["train_loss"] for p in result.curve]))
    assert results[0] == results[1]


def test_a_step_timed_on_a_loaded_host_is_warned_of(capsys):
    from hvdtrain.compare.sim.timing import _warn_if_loaded

    _warn_if_loaded([0.010, 0.0101, 0.0099, 0.0102, 0.0100, 0.0098])  # a quiet host
    assert capsys.readouterr().err == ""
    _warn_if_loaded([0.010, 0.011, 0.040, 0.045, 0.009, 0.050])  # another job took the cores
    told = capsys.readouterr().err
    assert "a step's compute time varied from" in told and "--sim-step-ms" in told
