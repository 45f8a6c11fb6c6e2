"""The sync and local-rounds engines (hvdtrain/engines/sync_step.py, local_rounds.py) in one
process: N workers, one thread each, on a fake collective (fake_collective.py), against hand
computations. The backends that run them (sync/, compare/sim/) are tested elsewhere."""

from __future__ import annotations

import ast
import copy
from pathlib import Path

import pytest
import torch

from hvdtrain.engines.local_rounds import LocalRounds, optimizer_tensors
from hvdtrain.engines.sync_step import ReplicaLearner, SyncStep
from hvdtrain.precision import Precision
from hvdtrain.replica import Replica
from hvdtrain.rules.local_sgd import OuterNesterov, RoundRule

from fake_collective import run_workers

ENGINES = Path(__file__).resolve().parents[2] / "hvdtrain" / "engines"


def model(batchnorm: bool = True) -> torch.nn.Module:
    torch.manual_seed(0)  # every worker starts from the same parameters
    layers = [torch.nn.Linear(4, 6)] + ([torch.nn.BatchNorm1d(6)] if batchnorm else []) + \
        [torch.nn.Linear(6, 3)]
    return torch.nn.Sequential(*layers)


def batches(workers: int, steps: int = 1, size: int = 8) -> list[list[tuple]]:
    """Each worker's own batches: different data on every worker."""
    torch.manual_seed(1)
    return [[(torch.randn(size, 4), torch.randint(0, 3, (size,))) for _ in range(steps)]
            for _ in range(workers)]


def replica(clip: float = 0.0, batchnorm: bool = True) -> Replica:
    return Replica(model(batchnorm), torch.device("cpu"),
                   precision=Precision("32", [torch.device("cpu")], clip_grad_norm=clip))


def params(r: Replica) -> list[torch.Tensor]:
    return [p.detach().clone() for p in r.model.parameters()]


def same(a: list[torch.Tensor], b: list[torch.Tensor], atol: float = 1e-6) -> bool:
    return all(torch.allclose(x, y, atol=atol) for x, y in zip(a, b))


# --- sync ----------------------------------------------------------------------------------
def sync_workers(n: int, clip: float = 0.0, accumulation: int = 1, lr: float = 0.5):
    """Each worker's replica after one engine step on its own batch, and the batches."""
    data = batches(n)
    replicas = [replica(clip, batchnorm=False) for _ in range(n)]

    def work(port):
        r = replicas[port.rank]
        optimizer = torch.optim.SGD(r.model.parameters(), lr=lr)
        engine = SyncStep(port, ReplicaLearner(r, optimizer), accumulation)
        [(x, y)] = data[port.rank]
        stats = engine.step(x, y)
        return stats, port.names

    return replicas, data, run_workers(n, work)


def one_process_step(data, clip: float = 0.0, lr: float = 0.5) -> list[torch.Tensor]:
    """One process's step on the workers' batches together: sync's update by definition."""
    r = replica(clip, batchnorm=False)
    x = torch.cat([x for [(x, _)] in data])
    y = torch.cat([y for [(_, y)] in data])
    optimizer = torch.optim.SGD(r.model.parameters(), lr=lr)
    r.forward_backward(x, y, grad_scale=1.0)
    r.update(optimizer)
    return params(r)


def test_sync_step_averages_the_gradients_into_one_process_step():
    replicas, data, results = sync_workers(3)
    expected = one_process_step(data)
    for r in replicas:
        assert same(params(r), expected)
    for stats, names in results:
        assert names == ["gradients"] and stats.count == 8  # one collective per step


def test_sync_step_clips_the_mean_gradient_not_each_workers():
    clip = 0.05
    replicas, data, _ = sync_workers(2, clip=clip)
    expected = one_process_step(data, clip=clip)  # the global batch's gradient, clipped
    for r in replicas:
        assert same(params(r), expected)
    # clipping each worker's own gradient first gives another update: the test can tell
    apart = []
    for [(x, y)] in data:
        r = replica(batchnorm=False)
        r.forward_backward(x, y, grad_scale=1.0)
        torch.nn.utils.clip_grad_norm_(list(r.model.parameters()), clip)
        apart.append([p.grad.clone() for p in r.model.parameters()])
    start = params(replica(batchnorm=False))
    clipped_apart = [s - 0.5 * (a + b) / 2 for s, a, b in zip(start, *apart)]
    assert not same(clipped_apart, expected)


def test_sync_step_accumulation_is_the_whole_batch_gradient():
    replicas, data, results = sync_workers(2, accumulation=2)
    assert same(params(replicas[0]), one_process_step(data), atol=1e-5)
    assert [names for _, names in results] == [["gradients"]] * 2  # once, after both passes


def test_sync_step_weight_scales_this_workers_gradient():
    data = batches(1)
    r = replica(batchnorm=False)

    def work(port):
        optimizer = torch.optim.SGD(r.model.parameters(), lr=1.0)
        engine = SyncStep(port, ReplicaLearner(r, optimizer))
        engine.backward(*data[0][0], weight=0.25)
        return [p.grad.clone() for p in r.model.parameters()]

    [weighted] = run_workers(1, work)
    plain = replica(batchnorm=False)
    plain.forward_backward(*data[0][0], grad_scale=1.0)
    assert same(weighted, [0.25 * p.grad for p in plain.model.parameters()])


# --- local rounds ---------------------------------------------------------------------------
def local_worker(port, r: Replica, rule: RoundRule | None = None, local_steps: int = 3,
                 momentum: float = 0.9):
    optimizer = torch.optim.SGD(r.model.parameters(), lr=0.1, momentum=momentum)
    live = lambda: [(n, p.data) for n, p in r.model.named_parameters()]  # noqa: E731
    buffers = lambda: [(n, b) for n, b in r.model.named_buffers()  # noqa: E731
                       if b.is_floating_point()]
    rule = rule if rule is not None else RoundRule()
    engine = LocalRounds(port, rule, local_steps, live, buffers,
                         lambda: optimizer_tensors(optimizer))
    engine.start()
    return engine, optimizer


def local_step(r: Replica, optimizer, x, y) -> None:
    optimizer.zero_grad()
    r.forward_backward(x, y, grad_scale=1.0)
    r.update(optimizer)


PARAM_NAMES = ["0.weight", "0.bias", "1.weight", "1.bias", "2.weight", "2.bias"]
BUFFERS = ["local_sgd.buffer.1.running_mean", "local_sgd.buffer.1.running_var"]


def test_a_round_every_h_steps_averages_parameters_and_float_buffers():
    data = batches(2, steps=3)
    replicas = [replica(), replica()]

    def work(port):
        r = replicas[port.rank]
        engine, optimizer = local_worker(port, r, local_steps=3)
        seen = []
        for x, y in data[port.rank]:
            local_step(r, optimizer, x, y)
            before = params(r)
            seen.append(list(port.names))
            engine.stepped()
        return seen, before, engine

    results = run_workers(2, work)
    for seen, _, engine in results:
        assert seen == [[], [], []]  # no collective inside a round
        assert engine.rounds == engine.rounds_total == 1 and engine.unshared_steps == 0
    (_, a, _), (_, b, _) = results
    assert not same(a, b)  # the workers had moved apart...
    for r in replicas:  # ...and go on from their mean
        assert same(params(r), [(x + y) / 2 for x, y in zip(a, b)])
    assert replicas[0].model[1].running_mean.equal(replicas[1].model[1].running_mean)
    names = results[0][2].port.names
    assert names == [f"local_sgd.param.{n}" for n in PARAM_NAMES] + BUFFERS


def test_reading_the_model_ends_a_round_early_once_and_the_epoch_end_averages_the_state():
    data = batches(2, steps=2)
    replicas = [replica(), replica()]

    def work(port):
        r = replicas[port.rank]
        engine, optimizer = local_worker(port, r, local_steps=4)
        for x, y in data[port.rank]:
            local_step(r, optimizer, x, y)
            engine.stepped()
        engine.share_model()  # an evaluation inside the round
        evaluated = list(port.names)
        engine.share_model()  # nothing moved since
        again = port.names[len(evaluated):]
        assert engine.take_epoch_rounds() == 1
        engine.share_everything()  # the epoch's end: the optimizer state, once
        momentum = [optimizer.state[p]["momentum_buffer"].clone()
                    for p in r.model.parameters()]
        return evaluated, again, port.names[len(evaluated):], momentum, engine

    results = run_workers(2, work)
    evaluated, again, at_end, _, engine = results[0]
    assert {n.split(".")[1] for n in evaluated} == {"param", "buffer"} and again == []
    assert at_end == ["optim.names"] + [f"local_sgd.optim.{i}.momentum_buffer"
                                        for i in range(6)]
    assert not engine.apart and engine.rounds_total == 1
    assert same(results[0][3], results[1][3])  # every worker continues with the same state
    assert same(params(replicas[0]), params(replicas[1]))


def test_workers_with_different_state_keep_their_own():
    def work(port):
        r = replica()
        engine, optimizer = local_worker(port, r)
        if port.rank == 0:  # one worker has stepped (fp16: the other's steps all overflowed)
            local_step(r, optimizer, torch.randn(8, 4), torch.randint(0, 3, (8,)))
        engine.state_apart = True
        engine.share_state()
        return port.names

    assert run_workers(2, work) == [["optim.names"]] * 2  # no tensor in common: none sent


def test_diloco_round_is_the_outer_nesterov_step_on_the_mean_pseudo_gradient():
    data = batches(2, steps=2)
    replicas = [replica(batchnorm=False), replica(batchnorm=False)]
    lr, m = 0.7, 0.9
    start = params(replicas[0])

    def work(port):
        r = replicas[port.rank]
        rule = OuterNesterov([p.data for p in r.model.parameters()], lr, m)
        engine, optimizer = local_worker(port, r, rule, local_steps=2, momentum=0.0)
        for x, y in data[port.rank]:
            local_step(r, optimizer, x, y)
            before = params(r)
            engine.stepped()
        return before, port.names

    (a, names), (b, _) = run_workers(2, work)
    assert names == [f"local_sgd.delta.{n}" for n in ["0.weight", "0.bias", "1.weight", "1.bias"]]
    for s, x, y, new in zip(start, a, b, params(replicas[0])):
        delta = s - (x + y) / 2  # first round: the momentum buffer is the delta itself
        assert torch.allclose(new, s - lr * (delta + m * delta), atol=1e-6)
    assert same(params(replicas[0]), params(replicas[1]))


def test_a_checkpoint_inside_a_round_comes_back_to_each_worker():
    data = batches(2, steps=6)
    replicas = [replica(), replica()]

    def save(port):
        r = replicas[port.rank]
        engine, optimizer = local_worker(port, r, local_steps=4)
        for x, y in data[port.rank]:
            local_step(r, optimizer, x, y)
            engine.stepped()
        own = {"model": copy.deepcopy(r.model.state_dict()),
               "optimizer": copy.deepcopy(optimizer.state_dict())}
        average = [(k, v.clone()) for k, v in r.model.state_dict().items()
                   if v.is_floating_point()]
        local = engine.checkpoint_inside_round(own, average)
        return local, own, dict(average), port.names

    saved = run_workers(2, save)
    local, own0, average, names = saved[0]
    assert names[-len(average) - 1] == "local_sgd.ranks"
    assert {n.split(".")[1] for n in names[-len(average):]} == {"checkpoint"}
    assert (local["steps"], local["state_apart"], local["rounds"]) == (2, True, 1)
    assert torch.allclose(average["0.weight"], (own0["model"]["0.weight"] +
                                                saved[1][1]["model"]["0.weight"]) / 2)

    def resume(port):
        engine, _ = local_worker(port, replica(), local_steps=4)
        part = engine.resume_round(local if port.rank == 0 else None)
        return part, engine.counters()

    for rank, (part, counters) in enumerate(run_workers(2, resume)):
        assert counters == {"steps": 2, "state_apart": True, "rounds": 1, "rounds_total": 1}
        assert part["model"]["0.weight"].equal(saved[rank][1]["model"]["0.weight"])

    def resume_with_three(port):
        engine, _ = local_worker(port, replica(), local_steps=4)
        return engine.resume_round(local if port.rank == 0 else None), engine.saved_ranks, \
            engine.unshared_steps

    assert run_workers(3, resume_with_three) == [(None, 2, 0)] * 3  # from the shared model


@pytest.mark.parametrize("steps", [0, -1])
def test_the_engines_refuse_a_count_below_one(steps):
    with pytest.raises(ValueError, match="1 or more"):
        LocalRounds(None, RoundRule(), steps, lambda: [])
    with pytest.raises(ValueError, match="1 or more"):
        SyncStep(None, None, steps)


# --- no transport and no clock in engines/ --------------------------------------------------
FORBIDDEN = ("horovod", "mpi4py", "torch.distributed", "time")


def test_engines_import_no_transport_and_no_clock():
    for path in sorted(ENGINES.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            for name in names:
                assert not any(name == f or name.startswith(f + ".") for f in FORBIDDEN), \
                    f"{path.name} imports {name}"


class Branches(torch.nn.Module):
    """A forward whose branch follows the worker: worker 0 trains ``a``, worker 1 ``b``."""

    def __init__(self, worker: int):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b, self.worker = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2), worker

    def forward(self, x):
        return (self.a if self.worker == 0 else self.b)(x)


def test_optimizer_state_that_only_some_workers_hold_is_left_out_of_the_average():
    """SGD makes a parameter's momentum buffer at its first gradient: workers whose forwards used
    different branches held different state tensors, whose averages waited for each other
    until the stall timeout. The state every worker holds is averaged; the rest stays own."""
    x, y = torch.randn(4, 3), torch.tensor([0, 1, 0, 1])

    def work(port):
        r = Replica(Branches(port.rank), torch.device("cpu"))
        engine, optimizer = local_worker(port, r, local_steps=2)
        for _ in range(2):
            local_step(r, optimizer, x, y)
            engine.stepped()
        held = dict(optimizer_tensors(optimizer))
        engine.share_everything()
        return held, dict(optimizer_tensors(optimizer)), port.names

    results = run_workers(2, work)
    for (before, after, names), own in zip(results, ((0, 1), (2, 3))):
        # its own branch's weight and bias only
        assert set(before) == {f"optim.{i}.momentum_buffer" for i in own}
        assert all(torch.equal(before[k], after[k]) for k in before)  # nothing in common
        assert not any("local_sgd.optim" in n for n in names)
