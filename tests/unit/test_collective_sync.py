"""The sync schemes over any collective port (hvdtrain/sync/collective.py CollectiveSync and
sync/local_rounds_scheme.py LocalSGDSync), each worker a thread on the fake collective of
fake_collective.py: the start, steps, the stop vote and a local-SGD checkpoint inside a round
resumed by as many workers; and HorovodSync's step, whose Horovod calls are counted (one wait
for the allreduce a step, as before the engine). The rest of Horovod's part is
test_local_sgd.py's and the multiproc tests'."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch

from hvdtrain.config import Config
from hvdtrain.replica import Replica
from hvdtrain.scheme import Progress
from hvdtrain.sync.collective import CollectiveSync
from hvdtrain.sync.local_rounds_scheme import LocalSGDSync

from fake_collective import run_workers


def worker_model(rank: int) -> torch.nn.Module:
    torch.manual_seed(rank)  # every worker starts elsewhere: start() must align them
    return torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.BatchNorm1d(6),
                               torch.nn.Linear(6, 3))


def batch(rank: int, step: int):
    g = torch.Generator().manual_seed(100 * rank + step)
    return torch.randn(8, 4, generator=g), torch.randint(0, 3, (8,), generator=g)


def flat(scheme) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1) for t in scheme.replica.model.state_dict().values()
                      if t.is_floating_point()])


def test_collective_sync_starts_from_rank_0_and_steps_alike():
    cfg = Config.from_overrides({"optimizer": "sgd", "momentum": 0.9}).validate()
    models = [worker_model(r) for r in range(3)]
    rank0 = [p.detach().clone() for p in models[0].parameters()]

    def work(port):
        scheme = CollectiveSync(cfg, None, port)
        scheme.attach(Replica(models[port.rank], torch.device("cpu")))
        scheme.start(None, resuming=False)
        started = [p.detach().clone() for p in scheme.replica.model.parameters()]
        for step in range(3):
            scheme.step(*batch(port.rank, step), lr=0.1)
        scheme.eval_replica()  # averages the BatchNorm statistics
        votes = [scheme.group.agree_to_stop(port.rank == 2) for _ in range(2)]
        assert scheme.end_of_training() is False
        return started, flat(scheme), votes, scheme.group.workers(), scheme.lr_scale

    results = run_workers(3, work)
    for rank, (started, weights, votes, workers, scale) in enumerate(results):
        assert all(torch.equal(a, b) for a, b in zip(started, rank0))
        assert torch.allclose(weights, results[0][1], atol=1e-6)
        assert votes == [False, True]  # rank 2's wish, read by all at the next vote
        assert workers == (rank, 3) and scale == 3.0


def test_collective_sync_resume_takes_rank_0s_optimizer_state():
    cfg = Config.from_overrides({"optimizer": "adam"}).validate()
    saved = CollectiveSync(cfg, None, None)
    saved.attach(Replica(worker_model(0), torch.device("cpu")))
    saved.optimizer.zero_grad()
    saved.replica.forward_backward(*batch(0, 0), grad_scale=1.0)
    saved.optimizer.step()
    state = {"model": saved.replica.model.state_dict(), "optimizer": saved.optimizer.state_dict()}

    def work(port):
        scheme = CollectiveSync(cfg, None, port)
        scheme.attach(Replica(worker_model(port.rank + 5), torch.device("cpu")))
        scheme.start(state if port.rank == 0 else None, resuming=True)
        return flat(scheme), scheme.optimizer.state_dict()["state"][0]["exp_avg"]

    for weights, exp_avg in run_workers(2, work):
        assert torch.equal(weights, flat(saved))
        assert torch.equal(exp_avg, saved.optimizer.state_dict()["state"][0]["exp_avg"])


def test_local_sgd_checkpoint_inside_a_round_resumes_each_worker_exactly():
    cfg = Config.from_overrides({"local_steps": 4, "optimizer": "sgd", "momentum": 0.9,
                                 "lr": 0.05, "outer_lr": 0.7,
                                 "outer_momentum": 0.9}).validate()

    # Drawn here, not in the workers' threads: two threads seeding and drawing from torch's one
    # global generator at once would start the two runs compared below from different weights.
    initial = worker_model(0).state_dict()

    def scheme_on(port, state=None, resuming=False) -> LocalSGDSync:
        scheme = LocalSGDSync(cfg, type("Runtime", (), {"rank": port.rank})(), port)
        model = worker_model(0)
        model.load_state_dict(initial)
        scheme.attach(Replica(model, torch.device("cpu")))
        scheme.start(state, resuming)
        return scheme

    def train(scheme, port, steps):
        for step in steps:
            scheme.step(*batch(port.rank, step), lr=0.05)
            scheme.step_done(Progress(epoch=0, step=step + 1, global_step=step + 1))

    def uninterrupted(port):
        scheme = scheme_on(port)
        train(scheme, port, range(10))
        return flat(scheme)

    def interrupted(port):
        scheme = scheme_on(port)
        train(scheme, port, range(6))  # a round after step 4, two steps into the next
        state = scheme.state_dict()
        assert state["local_round"]["steps"] == 2 and "outer" in state
        resumed = scheme_on(port, state if port.rank == 0 else None, resuming=True)
        train(resumed, port, range(6, 10))
        return flat(resumed)

    for straight, resumed in zip(run_workers(2, uninterrupted), run_workers(2, interrupted)):
        assert torch.allclose(straight, resumed, atol=1e-6)


# --- Horovod's calls per step ---------------------------------------------------------------
class CountingHorovod:
    """The parts of horovod.torch that HorovodSync's step reaches, for rank 0 of 2, recording
    every call that would reach Horovod."""

    Average, Adasum, Sum = "average", "adasum", "sum"

    class Compression:
        none, fp16 = "none", "fp16"

    def __init__(self):
        self.calls: list[str] = []

    def size(self):
        return 2

    def rank(self):
        return 0

    def DistributedOptimizer(self, optimizer, **settings):  # noqa: N802 (Horovod's name)
        hvd = self

        class Distributed:
            param_groups, state = optimizer.param_groups, optimizer.state
            skipping = False

            def synchronize(self):
                hvd.calls.append("synchronize")

            @contextlib.contextmanager
            def skip_synchronize(self):
                self.skipping = True
                yield
                self.skipping = False

            def step(self):
                hvd.calls.append("step" if self.skipping else "step+synchronize")
                optimizer.step()

            def zero_grad(self):
                optimizer.zero_grad()

        return Distributed()


@pytest.mark.parametrize("clip", [0.0, 1.0])
def test_a_horovod_step_waits_once_for_the_allreduce_and_steps_without_another(clip):
    from hvdtrain.precision import Precision
    from hvdtrain.sync.horovod import HorovodSync
    from hvdtrain.sync.horovod_port import HorovodPort

    cfg = Config.from_overrides({"optimizer": "sgd"}).validate()
    hvd = CountingHorovod()
    runtime = SimpleNamespace(horovod_wakes=True, device=torch.device("cpu"))
    scheme = HorovodSync(cfg, runtime, HorovodPort(hvd))
    scheme.attach(Replica(worker_model(0), torch.device("cpu"),
                          precision=Precision("32", [torch.device("cpu")], clip)))
    assert scheme._flat_gradients is not None  # one group, uncompressed, averaged: zero-copy
    for step in range(3):
        scheme.step(*batch(0, step), lr=0.1)
    assert hvd.calls == ["synchronize", "step"] * 3  # as optimizer.step() did: one wait a step
