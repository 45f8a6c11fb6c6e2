"""Tier 1: the parameter server's arithmetic and wire layout, without MPI."""

import math

import numpy as np
import pytest

from hvdtrain.config import ConfigError
from hvdtrain.layout import Topology
from hvdtrain.ps.protocol import (H_CLOCK, H_FLAGS, H_KIND, H_LR, H_SIZE, H_WORKER, HEADER_LEN,
                                  WANT_PARAMS, Kind, Tag, chunk_bounds, chunk_elements,
                                  make_header, shard_bounds, word_to_lr)
from hvdtrain.rules.dc_asgd import delay_compensate
from hvdtrain.rules.ssp import may_proceed


@pytest.mark.parametrize("total, servers", [(10, 1), (10, 3), (7, 7), (1_000_003, 4)])
def test_shards_are_contiguous_balanced_and_cover_everything(total, servers):
    bounds = shard_bounds(total, servers)
    assert len(bounds) == servers
    assert bounds[0][0] == 0 and bounds[-1][1] == total
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))  # contiguous, no gaps
    sizes = [b - a for a, b in bounds]
    assert max(sizes) - min(sizes) <= 1


def test_impossible_shards_and_topologies_show_the_arithmetic():
    with pytest.raises(ConfigError, match="cannot split 3 parameters across 4 servers"):
        shard_bounds(3, 4)
    with pytest.raises(ConfigError, match="3 - 3 = 0 workers.*at least 4 processes"):
        Topology(world_size=3, num_servers=3)
    with pytest.raises(ConfigError, match="2 - 5 = -3 workers"):
        Topology(world_size=2, num_servers=5)
    t = Topology(world_size=5, num_servers=2)
    assert t.num_workers == 3 and t.worker_ranks() == [0, 1, 2] and t.server_ranks() == [3, 4]
    assert t.is_server(3) and not t.is_server(0) and t.server_index(4) == 1


def test_chunks():
    assert chunk_bounds(10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert chunk_bounds(4, 4) == [(0, 4)]
    assert chunk_elements(1.0) == 262_144  # 1 MiB of float32


def test_header_layout_is_fixed():
    header = make_header(Kind.PUSH, clock=7, lr=0.0123, flags=WANT_PARAMS, size=64, worker=2)
    assert header.dtype == np.int64 and header.shape == (HEADER_LEN,)
    assert header[H_KIND] == Kind.PUSH and header[H_CLOCK] == 7 and header[H_SIZE] == 64
    assert header[H_FLAGS] == WANT_PARAMS and header[H_WORKER] == 2
    assert word_to_lr(header[H_LR]) == 0.0123  # the float64 travels bit for bit
    assert len({t.value for t in Tag}) == len(Tag)  # tags are distinct


@pytest.mark.parametrize("clock, clocks, bound, expected", [
    (3, [3, 3], 0, True),            # lock-step: level with everyone
    (4, [4, 3], 0, False),           # lock-step: one ahead must wait
    (5, [5, 3], 2, True),            # SSP: exactly at the bound
    (6, [6, 3], 2, False),           # SSP: past the bound
    (100, [100, 0], math.inf, True),  # fully asynchronous
    (9, [9, math.inf], 0, True),     # a finished worker never holds anyone back
])
def test_staleness_rule(clock, clocks, bound, expected):
    assert may_proceed(clock, clocks, bound) is expected


def test_delay_compensation_moves_the_gradient_along_the_missed_update():
    grad = np.array([2.0, -1.0, 0.5], dtype=np.float32)
    now = np.array([1.0, 1.0, 1.0], dtype=np.float32)
    pulled = np.array([0.0, 3.0, 1.0], dtype=np.float32)
    delay_compensate(grad, 0.5, now, pulled)
    # g + 0.5 * g^2 * (now - pulled): 2 + 0.5*4*1, -1 + 0.5*1*(-2), 0.5 + 0
    assert grad.tolist() == [4.0, -2.0, 0.5]


def test_server_optimizer_matches_torch_optimizers_chunk_by_chunk():
    import torch

    from hvdtrain.config import OptimConfig
    from hvdtrain.ps.shard_optimizer import ShardOptimizer

    for cfg in [OptimConfig(optimizer="sgd", momentum=0.9, weight_decay=0.01),
                OptimConfig(optimizer="adam"), OptimConfig(optimizer="adamw", weight_decay=0.1)]:
        torch.manual_seed(0)
        start = torch.randn(10)
        reference = torch.nn.Parameter(start.clone())
        opt = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[
            cfg.optimizer]
        kwargs = {"momentum": cfg.momentum} if cfg.optimizer == "sgd" else {}
        opt = opt([reference], lr=0.1, weight_decay=cfg.weight_decay, **kwargs)
        shard = start.clone()
        server = ShardOptimizer(shard, chunk_bounds(10, 4), cfg)
        for _ in range(3):
            grad = torch.randn(10)
            reference.grad = grad.clone()
            opt.step()
            for i, (a, b) in enumerate(server.chunks):
                server.apply(i, grad[a:b].clone(), lr=0.1)
        assert torch.allclose(shard, reference.detach(), atol=1e-6), cfg.optimizer
