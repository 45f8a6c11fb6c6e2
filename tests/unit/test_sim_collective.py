"""The simulator's virtual collective (hvdtrain/compare/sim/virtual_collective.py): virtual workers on
threads of their own that run one at a time in rank order and meet in the collectives of
engines/ports.py, and the engines on it against the threaded fake collective of the engines'
own tests."""

from __future__ import annotations

import threading

import pytest
import torch

from fake_collective import run_workers
from hvdtrain.compare.sim.virtual_collective import CollectiveMismatch, VirtualCluster
from hvdtrain.engines.local_rounds import LocalRounds
from hvdtrain.engines.sync_step import SyncStep
from hvdtrain.rules.local_sgd import round_rule

def on_cluster(size: int, work):
    cluster = VirtualCluster(size)
    try:
        return cluster.run(lambda rank: work(cluster.port(rank)))
    finally:
        cluster.close()


def test_workers_run_one_at_a_time_in_rank_order_and_meet_at_collectives():
    order = []

    def work(port):
        order.append(("before", port.rank, threading.current_thread().name))
        total = port.sum([port.rank, 1.0], name="ranks")
        order.append(("after", port.rank))
        return total

    assert on_cluster(3, work) == [[3.0, 3.0]] * 3
    # every worker reaches the collective before any goes on, then they go on in rank order
    assert [o[:2] for o in order] == [("before", 0), ("before", 1), ("before", 2),
                                      ("after", 0), ("after", 1), ("after", 2)]
    assert len({o[2] for o in order if o[0] == "before"}) == 3  # a thread each


def test_every_collective_of_the_port():
    def work(port):
        r = port.rank
        t = torch.tensor([float(r), 10.0 * r])
        port.average_([("t", t)])
        p = torch.zeros(2, requires_grad=True)
        p.grad = torch.tensor([1.0, 2.0]) * (r + 1)
        q = torch.zeros(1, requires_grad=True)  # no gradient: counts as zero
        port.average_gradients([p, q])
        b = torch.tensor([float(r)])
        port.broadcast_([("b", b)])
        own = {"rank": r}
        first = port.broadcast_object(own)
        pending = port.start_sum([r, 1])
        port.barrier()
        return (t.tolist(), p.grad.tolist(), q.grad.tolist(), b.tolist(), first,
                first is own, port.gather_object(r * r), port.agree(r), pending.wait())

    results = on_cluster(3, work)
    for rank, (t, g, q, b, first, same, gathered, agreed, summed) in enumerate(results):
        assert t == [1.0, 10.0] and g == [2.0, 4.0] and q == [0.0] and b == [0.0]
        assert first == {"rank": 0} and same == (rank == 0)  # the others get copies
        assert gathered == [0, 1, 4] and agreed == (0, 2) and summed == [3, 3]


def test_a_compressed_allreduce_rounds_the_gradients_as_fp16_carries_them():
    """The simulator priced --compression fp16's bytes but trained on float32 averages."""
    def work(port):
        p = torch.zeros(1, requires_grad=True)
        p.grad = torch.tensor([1.0 + 2.0 ** -13])  # below fp16's resolution at 1: rounds to 1
        port.average_gradients([p])
        return p.grad.item()

    cluster = VirtualCluster(2, torch.float16)
    try:
        assert cluster.run(lambda rank: work(cluster.port(rank))) == [1.0, 1.0]
    finally:
        cluster.close()
    assert on_cluster(2, work) == [1.0 + 2.0 ** -13] * 2  # uncompressed: exact


def test_one_worker_needs_no_other_thread():
    assert on_cluster(1, lambda port: port.agree(7)) == [(7, 7)]


def test_workers_that_join_different_collectives_fail_instead_of_hanging():
    with pytest.raises(CollectiveMismatch, match="different collectives"):
        on_cluster(2, lambda port: port.sum([1.0], name=f"sum{port.rank}"))
    with pytest.raises(CollectiveMismatch, match="never joined"):  # worker 0 skips it
        on_cluster(2, lambda port: port.barrier() if port.rank else None)
    with pytest.raises(CollectiveMismatch, match="finished its work while the others joined"):
        on_cluster(2, lambda port: None if port.rank else port.barrier())


def test_a_failing_worker_ends_the_others_and_the_cluster_goes_on():
    cluster = VirtualCluster(3)
    before = threading.active_count()

    def work(rank):
        cluster.port(rank).barrier()
        if rank == 1:
            raise ValueError("worker 1 failed")
        cluster.port(rank).barrier()  # worker 0 waits here when worker 1 fails
        return rank

    with pytest.raises(ValueError, match="worker 1 failed"):
        cluster.run(work)
    assert cluster.run(lambda rank: cluster.port(rank).agree(rank)) == [(0, 2)] * 3
    cluster.close()
    assert threading.active_count() == before  # every worker's thread ended


def test_the_engines_on_the_virtual_collective_match_the_threaded_fake():
    """LocalRounds (a DiLoCo round and the optimizer state) and SyncStep's average on the
    virtual collective give what the engines' own fake collective gives."""
    def diloco(port):
        draws = torch.Generator().manual_seed(port.rank)  # the fake's threads run at once
        params = [torch.randn(5, generator=draws)]
        state = [("momentum", torch.randn(5, generator=draws))]
        rounds = LocalRounds(port, round_rule(params, 0.7, 0.9), 2,
                             parameters=lambda: [("w", params[0])],
                             optimizer_state=lambda: state)
        rounds.start()
        for _ in range(3):
            with torch.no_grad():
                params[0] -= 0.1 * torch.randn(5, generator=draws)
            rounds.stepped()
        rounds.share_everything()
        return params[0].tolist(), state[0][1].tolist(), rounds.rounds_total

    assert on_cluster(3, diloco) == run_workers(3, diloco)

    class Learner:
        def __init__(self, rank):
            self.p = torch.zeros(3, requires_grad=True)
            self.rank = rank

        def zero_grad(self):
            self.p.grad = None

        def forward_backward(self, x, y, grad_scale):
            (grad_scale * (self.p * x).sum()).backward()
            return 1

        def gradients_of(self):
            return [self.p]

        def apply(self):
            with torch.no_grad():
                self.p -= self.p.grad

    def sync(port):
        learner = Learner(port.rank)
        SyncStep(port, learner).step(torch.tensor([1.0, 2.0, 3.0]) * (port.rank + 1), None)
        return learner.p.tolist()

    virtual = on_cluster(3, sync)
    assert virtual == run_workers(3, sync) == [[-2.0, -4.0, -6.0]] * 3
