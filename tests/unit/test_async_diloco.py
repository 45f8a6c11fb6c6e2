"""Asynchronous DiLoCo (--mode async --local-steps H): the server's outer step (Nesterov and
Delayed Nesterov, ps/shard_optimizer.py) against a hand computation, the worker's rounds
(engines/async_rounds.py) against a fake server, its options and its registry family.
tests/multiproc/test_async_diloco_multiproc.py trains it across real ranks."""

import re

import pytest
import torch

from hvdtrain.config import Config, ConfigError
from hvdtrain.config.model_options import OptimConfig
from hvdtrain.engines.async_rounds import AsyncRounds
from hvdtrain.ps.shard_optimizer import ShardOptimizer
from hvdtrain.rules.local_sgd import OuterStep, dynamic_local_steps, outer_step_of
from hvdtrain.rules.registry import modes
from hvdtrain.rules.staleness_lr import divergence_hint


def outer_optimizer(params: torch.Tensor, momentum: float, every: int) -> ShardOptimizer:
    # two chunks, as a server applies a push chunk by chunk
    return ShardOptimizer(params, [(0, 2), (2, 3)], OptimConfig(), OuterStep(momentum, every))


def push(optimizer: ShardOptimizer, grad: torch.Tensor, lr: float) -> None:
    for i, (a, b) in enumerate(optimizer.chunks):
        optimizer.apply(i, grad[a:b].clone(), lr)


PUSHES = [torch.tensor([0.5, -1.0, 0.25]), torch.tensor([0.1, 0.2, -0.3]),
          torch.tensor([-0.4, 0.6, 0.05]), torch.tensor([0.3, 0.3, 0.3]),
          torch.tensor([0.2, -0.1, 0.7])]


def test_the_outer_step_is_torch_nesterov_sgd_on_each_push():
    start = torch.tensor([1.0, -2.0, 0.5])
    params = start.clone()
    optimizer = outer_optimizer(params, 0.9, every=1)
    reference = start.clone().requires_grad_(True)
    torch_sgd = torch.optim.SGD([reference], lr=0.7, momentum=0.9, nesterov=True)
    buf, theta = torch.zeros(3), start.clone()
    for g in PUSHES:
        push(optimizer, g, 0.7)
        reference.grad = g.clone()
        torch_sgd.step()
        buf = 0.9 * buf + g  # by hand: m <- beta m + g; theta <- theta - lr (g + beta m)
        theta = theta - 0.7 * (g + 0.9 * buf)
    assert torch.allclose(params, reference.detach(), atol=1e-6)
    assert torch.allclose(params, theta, atol=1e-6)


def test_delayed_nesterov_updates_the_momentum_every_n_pushes_with_their_mean():
    params = torch.tensor([1.0, -2.0, 0.5])
    optimizer = outer_optimizer(params, 0.9, every=2)
    theta, m, pending = params.clone(), torch.zeros(3), torch.zeros(3)
    for t, g in enumerate(PUSHES, start=1):
        push(optimizer, g, 0.7)
        pending = pending + g
        if t % 2:  # in between: a plain outer SGD step, the momentum untouched
            theta = theta - 0.7 * g
        else:
            m = 0.9 * m + pending / 2
            pending = torch.zeros(3)
            theta = theta - 0.7 * (g + 0.9 * m)
        assert torch.allclose(params, theta, atol=1e-6), t
    assert torch.allclose(optimizer.vectors["momentum_buffer"], m, atol=1e-6)
    assert torch.allclose(optimizer.vectors["delayed_sum"], pending, atol=1e-6)


@pytest.mark.parametrize("every, gain", [(1, 7.0), (2, 3.85), (4, 2.275), (8, 1.4875)])
def test_the_outer_steps_gain_is_what_a_steady_push_moves_the_server(every, gain):
    """The workers divide their inner rate by OuterStep.gain, so it must be what the server's
    outer step really does to a steady pseudo-gradient, Delayed Nesterov's cycle included: once
    the momentum has built up, a cycle of N pushes moves lr (N + beta / (1 - beta)) times g.
    Before, every N was taken for plain Nesterov's 7, and the default N = 4 trained at a third
    of the rate meant."""
    step = OuterStep(0.9, every, 0.7)
    assert step.gain == pytest.approx(gain)
    params = torch.zeros(3)
    optimizer = outer_optimizer(params, 0.9, every)
    g = torch.tensor([0.5, -1.0, 0.25])
    for _ in range(120 * every):  # the momentum builds up (0.9 a cycle)
        push(optimizer, g, 0.7)
    before = params.clone()
    for _ in range(8 * every):  # whole cycles
        push(optimizer, g, 0.7)
    assert torch.allclose((before - params) / (8 * every), g * gain, rtol=1e-4)


def test_delayed_nesterov_state_round_trips_through_a_checkpoint():
    # A resume continues the cycle of N pushes where the checkpoint left it.
    params = torch.tensor([1.0, -2.0, 0.5])
    straight = outer_optimizer(params.clone(), 0.9, every=3)
    for g in PUSHES[:2]:
        push(straight, g, 0.7)
    vectors = {k: v.clone() for k, v in straight.vectors.items()}
    scalars = straight.scalars()
    assert scalars == {"outer_pushes": 2.0}
    resumed = outer_optimizer(straight.params.clone(), 0.9, every=3)
    resumed.load(vectors, scalars)
    for g in PUSHES[2:]:
        push(straight, g, 0.7)
        push(resumed, g, 0.7)
    assert torch.equal(straight.params, resumed.params)


def test_a_checkpoint_of_another_step_resumes_with_fresh_optimizer_state_and_says_why(capsys):
    """A changed setting crashed the server's resume with a traceback (ValueError), and plain
    async's momentum resumed as DiLoCo's outer momentum, another quantity, without a word."""
    delayed = outer_optimizer(torch.zeros(3), 0.9, every=4)
    push(delayed, PUSHES[0], 0.7)
    plain = outer_optimizer(torch.zeros(3), 0.9, every=1)
    plain.load({k: v.clone() for k, v in delayed.vectors.items()}, delayed.scalars())
    assert "delayed_sum, which the outer step with --outer-momentum 0.9, " \
           "--outer-momentum-every 1 does not keep" in capsys.readouterr().out
    assert not plain.vectors["momentum_buffer"].any()  # fresh
    sgd = ShardOptimizer(torch.zeros(3), [(0, 3)], OptimConfig(momentum=0.9))
    sgd.apply(0, PUSHES[1].clone(), 0.1)
    outer = outer_optimizer(torch.zeros(3), 0.9, every=1)
    outer.load({k: v.clone() for k, v in sgd.vectors.items()}, sgd.scalars())
    assert "the checkpoint's server ran --optimizer sgd on every push, and this run's runs " \
           "async DiLoCo's outer step" in capsys.readouterr().out
    assert not outer.vectors["momentum_buffer"].any()
    same = outer_optimizer(torch.zeros(3), 0.9, every=4)
    same.load({k: v.clone() for k, v in delayed.vectors.items()}, delayed.scalars())
    assert torch.equal(same.vectors["delayed_sum"], delayed.vectors["delayed_sum"])
    assert capsys.readouterr().out == ""


class FakeServer:
    """The port: applies each push as plain outer SGD at lr 1 and sends its parameters back;
    ``drift`` stands for the other workers' pushes in between."""

    def __init__(self, weights: torch.Tensor, buffer: torch.Tensor):
        self.weights, self.buffer = weights, buffer
        self.server = weights.clone()
        self.pushes: list[tuple[int, torch.Tensor]] = []
        self.pulls = 0
        self.drift = torch.zeros_like(weights)

    def push_round(self, steps: int) -> None:
        self.pushes.append((steps, self.buffer.clone()))
        self.server -= self.buffer
        self.server += self.drift
        self.weights.copy_(self.server)

    def pull(self) -> None:
        self.pulls += 1
        self.weights.copy_(self.server)


def test_a_worker_pushes_its_pseudo_gradient_every_h_steps_and_goes_on_from_the_reply():
    weights, buffer = torch.tensor([1.0, 1.0]), torch.zeros(2)
    server = FakeServer(weights, buffer)
    rounds = AsyncRounds(server, 3, lambda: weights, lambda: buffer)
    rounds.start()
    server.drift = torch.tensor([0.5, 0.0])  # another worker pushed meanwhile
    pushed = []
    for _ in range(3):
        weights -= 0.1  # an inner step
        pushed.append(rounds.stepped())
    assert pushed == [False, False, True]
    steps, pseudo = server.pushes[0]
    assert steps == 3 and torch.allclose(pseudo, torch.tensor([0.3, 0.3]))
    # the reply is the live weights and the next round's start
    assert torch.allclose(weights, torch.tensor([1.2, 0.7]))
    assert torch.equal(rounds.pulled, weights)
    assert rounds.unshared_steps == 0 and rounds.rounds_total == 1


def test_where_the_model_is_read_a_round_ends_early_or_the_worker_pulls():
    weights, buffer = torch.tensor([1.0]), torch.zeros(1)
    server = FakeServer(weights, buffer)
    rounds = AsyncRounds(server, 8, lambda: weights, lambda: buffer)
    rounds.start()
    weights -= 0.25
    rounds.stepped()
    rounds.refresh()  # one step unshared: an early push of it
    assert [s for s, _ in server.pushes] == [1] and server.pulls == 0
    server.server += 1.0  # the others moved the server
    rounds.refresh()  # nothing unshared: a pull
    assert server.pulls == 1 and torch.equal(rounds.pulled, weights)
    assert rounds.take_epoch_rounds() == 1 and rounds.take_epoch_rounds() == 0


def test_worker_0s_evaluation_inside_an_epoch_scores_its_rounds_start_and_sends_nothing():
    from types import SimpleNamespace

    from hvdtrain.ps.diloco_client import DiLoCoClient

    weights, buffer = torch.tensor([1.0, 2.0]), torch.zeros(2)
    server = FakeServer(weights, buffer)
    scored, copied_out = [], []
    client = DiLoCoClient.__new__(DiLoCoClient)  # only what eval_replica reads
    client.rounds = AsyncRounds(server, 8, lambda: weights, lambda: buffer)
    client.copies = SimpleNamespace(device_params=weights)
    client.flat = SimpleNamespace(copy_out=lambda: copied_out.append(weights.clone()))
    client.replica = SimpleNamespace(evaluate=lambda batches: scored.append(weights.clone()))
    client.lock_step = False
    client.rounds.start()
    assert client.eval_replica() is client.replica  # at the round's start: the live weights
    for _ in range(3):
        weights -= 0.25
        client.rounds.stepped()
    client.eval_replica().evaluate([])
    assert [w.tolist() for w in scored] == [[1.0, 2.0]]  # the round's start
    assert torch.equal(weights, torch.tensor([0.25, 1.25]))  # its own weights, back
    assert [w.tolist() for w in copied_out] == [[1.0, 2.0], [0.25, 1.25]]  # into the model, back
    assert server.pushes == [] and server.pulls == 0 and client.rounds.unshared_steps == 3
    # at an epoch's end (closing), and under lock-step rounds, the round ends there
    client.eval_replica(closing=True)
    assert [s for s, _ in server.pushes] == [3] and client.rounds.unshared_steps == 0
    client.lock_step = True
    weights -= 0.25
    client.rounds.stepped()
    client.eval_replica()
    assert [s for s, _ in server.pushes] == [3, 1]


def test_a_push_outside_a_step_is_not_the_next_steps_wait():
    """An epoch's closing evaluation or a checkpoint pushes the round between two steps: that
    wait belonged to no step, and the next step's compute (its time less its wait) read
    negative in the lab's epoch lines (worker 0: -0.13 s mean)."""
    from types import SimpleNamespace

    from hvdtrain.ps.diloco_client import DiLoCoClient

    client = DiLoCoClient.__new__(DiLoCoClient)  # only what step reads
    client.trained, client.feed, client.round_samples = [], None, 0
    client._last_start, client._intervals, client._pushed_s = None, [], 0.0
    client.replica = SimpleNamespace(forward_backward=lambda x, y, grad_scale: SimpleNamespace(
        count=4), update=lambda optimizer: None)
    client.optimizer = SimpleNamespace(param_groups=[{}])
    client.flat = SimpleNamespace(copy_in=lambda: None)
    client.stops = SimpleNamespace(wants=False, after_push=lambda: None)
    client.peers = SimpleNamespace(regroup=lambda: False)
    pushes_in_step = []
    client.rounds = SimpleNamespace(stepped=lambda: bool(pushes_in_step))
    client._waited = 0.8  # what push_round left after the epoch's closing push
    client.step(None, None, 0.1)
    assert client.take_wait_seconds() == 0.0
    # a step that ends a round: its push is its wait
    pushes_in_step.append(True)
    client.rounds = SimpleNamespace(stepped=lambda: setattr(client, "_waited",
                                                            client._waited + 0.3) or True)
    client.step(None, None, 0.1)
    assert client.take_wait_seconds() == pytest.approx(0.3)


def test_async_local_steps_configure_the_servers_outer_step():
    cfg = Config.from_overrides({"mode": "async", "local_steps": 8, "outer_lr": 0.7,
                                 "outer_momentum": 0.9, "outer_momentum_every": 2}).validate()
    assert outer_step_of(cfg) == OuterStep(0.9, 2, 0.7)
    assert outer_step_of(Config.from_overrides({"mode": "async"}).validate()) is None
    plain = Config.from_overrides({"mode": "async", "local_steps": 4}).validate()
    assert outer_step_of(plain) == OuterStep(0.0, 4, 1.0)  # each round's progress, as is


def test_dynamic_local_steps_follow_the_speed_relative_to_the_fastest():
    assert dynamic_local_steps(8, own_s=0.010, fastest_s=0.010) == 8  # the fastest: the base
    assert dynamic_local_steps(8, own_s=0.020, fastest_s=0.010) == 4  # half the speed: half
    assert dynamic_local_steps(8, own_s=0.030, fastest_s=0.010) == 3  # a 3x straggler
    assert dynamic_local_steps(8, own_s=1.0, fastest_s=0.010) == 1    # at least one step
    assert dynamic_local_steps(8, own_s=0.005, fastest_s=0.010) == 8  # never above the base
    assert dynamic_local_steps(8, own_s=0.0, fastest_s=0.010) == 8    # not measured yet
    assert dynamic_local_steps(8, own_s=0.020, fastest_s=0.0) == 8    # nobody's known yet


def test_a_worker_whose_h_changes_pushes_at_the_new_h():
    weights, buffer = torch.tensor([1.0]), torch.zeros(1)
    server = FakeServer(weights, buffer)
    rounds = AsyncRounds(server, 8, lambda: weights, lambda: buffer)
    rounds.start()
    rounds.local_steps = 3  # --dynamic-local-steps, after a push measured this worker slow
    assert [rounds.stepped() for _ in range(6)] == [False, False, True] * 2


@pytest.mark.parametrize("options,message", [
    ({"mode": "async", "local_steps": 8, "pull_every": 2}, "--pull-every"),
    ({"mode": "async", "local_steps": 8, "dc_lambda": 0.04}, "use --staleness-lr"),
    ({"mode": "sync", "local_steps": 8, "outer_lr": 0.7, "outer_momentum_every": 2},
     "use it with --mode async --local-steps H"),
    ({"mode": "async", "outer_momentum_every": 2}, "use it with --mode async --local-steps H"),
    ({"mode": "sync", "local_steps": "auto"}, "--local-steps auto (--dynamic-local-steps): it "
     "sets each async DiLoCo worker's H by its speed: use it with --mode async --local-steps "
     "auto"),
    # an async run was told to add the --mode async it had
    ({"mode": "async", "dynamic_local_steps": True}, "use it with --local-steps auto (or"),
    ({"mode": "async", "local_steps": "auto", "bsp": True}, "--local-steps auto "
     "(--dynamic-local-steps) with --bsp: --bsp rounds take one push of every worker in "
     "lock-step"),
    ({"mode": "async", "local_steps": 8, "outer_lr": 0.7, "outer_momentum_every": -1},
     "use 0 (the default, 4), 1 (plain Nesterov)"),
])
def test_async_diloco_refuses_what_makes_no_sense(options, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        Config.from_overrides(options).validate()


@pytest.mark.parametrize("given,steps", [("auto", 8), ("auto:16", 16), ("AUTO", 8)])
def test_local_steps_auto_is_dynamic_local_steps_with_the_fastest_workers_h(given, steps):
    cfg = Config.from_overrides({"mode": "async", "local_steps": given, "outer_lr": 0.7,
                                 "outer_momentum": 0.9}).validate()
    assert (cfg.sync.local_steps, cfg.sync.dynamic_local_steps) == (steps, True)


@pytest.mark.parametrize("given", ["autox", "auto:", "auto:four", "auto:-2"])
def test_a_bad_local_steps_auto_says_how_to_write_it(given):
    with pytest.raises(ConfigError, match=re.escape("'auto:H', e.g. auto:16")):
        Config.from_overrides({"mode": "async", "local_steps": given})


def test_the_adiloco_family_runs_async_with_the_outer_step():
    [mode] = modes(["adiloco"], bounds=[], local_steps=[8])
    assert mode.name == "adiloco8" and mode.is_async
    flags = mode.train_flags()
    assert flags[:2] == ["--mode", "async"]
    assert flags[flags.index("--local-steps") + 1] == "8"
    assert flags[flags.index("--outer-lr") + 1] == "0.7"
    assert flags[flags.index("--outer-momentum") + 1] == "0.9"
    cfg = Config.from_overrides(mode.config_options()).validate()
    assert outer_step_of(cfg) == OuterStep(0.9, 4, 0.7)  # Delayed Nesterov's default


# --- the simulator --------------------------------------------------------------------------
def test_a_simulated_adiloco_run_pushes_rounds_of_h_batches_through_the_outer_step():
    from hvdtrain.compare.sim.simulation import Simulation
    from hvdtrain.compare.sim.timing import Timing

    [mode] = modes(["adiloco"], bounds=[], local_steps=[4])
    digits = ["--dataset", "digits", "--model", "mlp", "--hidden", "32", "--threads", "1"]
    sim = Simulation(mode, 2, "", 0, [*digits, "--epochs", "2"], 0.9, Timing(step_seconds=1.0))
    sim.result = sim.run()
    # 2 epochs of 22 steps x 2 batches: 88 batches of the job's plan, 4 a push, but for each
    # worker's last round, which may be short
    assert 88 // 4 <= len(sim.pushes) <= 88 // 4 + 2
    assert sorted(p.slot for p in sim.pushes)[0] == 0
    for worker in (0, 1):  # each push is one outer round: the clocks count pushes
        assert [p.clock for p in sim.pushes if p.worker == worker] == \
            list(range(1, 1 + sum(p.worker == worker for p in sim.pushes)))
    assert 40 <= sim.now <= 52  # each worker: about 11 rounds of 4 one-second steps
    assert sim.curve[-1]["test_acc"] > sim.curve[0]["test_acc"]


def test_simulated_dynamic_local_steps_give_the_straggler_its_share_of_h():
    # --dynamic-local-steps in the simulator, as the real workers and server 0 run it: each push
    # reports the worker's time per step, and its next round takes H x fastest / own steps.
    # Under a 3x straggler the slow worker's rounds settle at 2 of H = 6, so both workers push
    # about as often; with a fixed H the straggler pushed a third as often. Until stop 59 the
    # simulator took the flag and ran a fixed H.
    from hvdtrain.compare.sim.simulation import Simulation
    from hvdtrain.compare.sim.timing import Timing

    [mode] = modes(["adiloco"], bounds=[], local_steps=[6])
    digits = ["--dataset", "digits", "--model", "mlp", "--hidden", "32", "--threads", "1",
              "--epochs", "3"]

    def pushes_and_h(*flags):
        sim = Simulation(mode, 2, "3x", 0, [*digits, *flags], 0.99, Timing(step_seconds=1.0))
        sim.result = sim.run()
        counts = [sum(p.worker == w for p in sim.pushes) for w in (0, 1)]
        return counts, [w.engine["local_steps"] for w in sim.workers]

    (fast, slow), h = pushes_and_h("--dynamic-local-steps")
    assert h == [6, 2]
    assert 0.75 <= slow / fast <= 1.34, (fast, slow)
    (fast, slow), h = pushes_and_h()
    assert h == [6, 6]
    assert slow / fast < 0.5, (fast, slow)


def test_async_diloco_weighs_each_round_by_its_staleness_up_to_the_other_workers():
    from hvdtrain.rules.registry import server_rules

    cfg = Config.from_overrides({"mode": "async", "local_steps": 8}).validate()
    assert cfg.ps.round_staleness_weight
    factors = {n: [server_rules(cfg.ps, n, 8).step.rate(1.0, s)[1] for s in (0, 1, 2, 3, 7, 20)]
               for n in (2, 4, 8)}
    assert factors[2] == [1, 1, 1, 1, 1, 1]  # 2 workers: a straggler's rounds count whole
    assert factors[4] == pytest.approx([1, 1, 1 / 2, 1 / 3, 1 / 3, 1 / 3])
    assert factors[8] == pytest.approx([1, 1, 1 / 2, 1 / 3, 1 / 7, 1 / 7])
    # --no-round-staleness-weight, plain async and --bsp rounds: no weight; --staleness-lr:
    # its own, 1/s uncapped
    for options in ({"round_staleness_weight": False}, {"local_steps": 1}, {"bsp": True}):
        plain = Config.from_overrides({"mode": "async", "local_steps": 8, **options}).validate()
        assert server_rules(plain.ps, 8, plain.sync.local_steps).step.rate(1.0, 20)[1] == 1
    slr = Config.from_overrides({"mode": "async", "local_steps": 8,
                                 "staleness_lr": True}).validate()
    assert server_rules(slr.ps, 4, 8).step.rate(1.0, 20)[1] == pytest.approx(1 / 20)


def test_simulated_async_diloco_on_8_workers_trains_with_its_rounds_weighted():
    # 8 workers push whole rounds computed from weights about 7 pushes old, and nothing
    # averages them: unweighted, the digits MLP fell to chance (0.21 after 20 epochs); each
    # round weighted by 1/min(s, 7) (stop 59's default) reached 0.86.
    from dataclasses import replace

    from hvdtrain.compare.sim.simulation import Simulation
    from hvdtrain.compare.sim.timing import Timing

    [mode] = modes(["adiloco"], bounds=[], local_steps=[8])
    assert mode.round_staleness_weight
    unweighted_mode = replace(mode, round_staleness_weight=False)
    assert "--no-round-staleness-weight" in unweighted_mode.train_flags()
    digits = ["--dataset", "digits", "--model", "mlp", "--threads", "1", "--epochs", "20"]

    def final_accuracy(m):
        return Simulation(m, 8, "", 0, digits, 0.99, Timing(step_seconds=1.0)).run() \
            .curve[-1]["test_acc"]

    weighted, unweighted = final_accuracy(mode), final_accuracy(unweighted_mode)
    assert weighted >= 0.75 and unweighted <= weighted - 0.3, (weighted, unweighted)


@pytest.mark.parametrize("options, workers, advice", [
    ({}, 8, "weigh each gradient by its staleness with --staleness-lr (with 8 workers a "
            "gradient is about 7 updates old)"),
    ({}, 2, "(with 2 workers a gradient is about 1 update old)"),
    ({"staleness_lr": True}, 8, "lower --lr or check the data"),
    ({"bsp": True}, 8, "lower --lr or check the data"),
    ({"mode": "sync"}, 8, "lower --lr or check the data"),
    ({"local_steps": 8, "outer_lr": 0.7}, 8, "lower --lr (the inner rate) or --outer-lr, or"),
    ({"local_steps": 8, "outer_lr": 0.7, "round_staleness_weight": False}, 8,
     "or --outer-lr, drop --no-round-staleness-weight, or check the data"),
    # an fp16 wire's overflow (a gradient over 65504) was told to lower --lr, which bf16 cures
    ({"wire_dtype": "fp16"}, 2, "use --wire-dtype bf16: fp16 messages hold values up to 65504"),
    # and sync's fp16 allreduce's (at --lr 1e-9 the advice was to lower --lr)
    ({"mode": "sync", "compression": "fp16"}, 2, "drop --compression fp16: fp16 holds values "
                                                 "up to 65504 only"),
])
def test_an_async_runs_nan_names_the_weight_on_stale_updates_it_lacks(options, workers, advice):
    """The loss guard's message (loop/stopping.py) takes the run's advice: plain async with
    many workers diverges where a fresh gradient of the same rate would not."""
    cfg = Config.from_overrides({"mode": "async", **options}).validate()
    assert advice in divergence_hint(cfg, workers)
