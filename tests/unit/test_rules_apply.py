"""rules/apply.py, rules/staleness_lr.py, rules/dc_asgd.py and rules/statistics.py: what one
gradient does to the parameters, without a server."""

from __future__ import annotations

import numpy as np
import torch

from hvdtrain.config import OptimConfig
from hvdtrain.ps.protocol import chunk_bounds
from hvdtrain.ps.shard_optimizer import ShardOptimizer
from hvdtrain.rules.apply import ApplyStep
from hvdtrain.rules.dc_asgd import DelayCompensation, delay_compensate
from hvdtrain.rules.staleness_lr import StalenessWeight, staleness_lr_factor
from hvdtrain.rules.statistics import RuleStatistics


def optimizer(values, chunk: int = 2) -> ShardOptimizer:
    params = torch.tensor(values, dtype=torch.float32)
    return ShardOptimizer(params, chunk_bounds(params.numel(), chunk),
                          OptimConfig(optimizer="sgd", momentum=0.0, weight_decay=0.0))


def test_staleness_lr_factor_is_one_over_staleness_and_full_when_fresh():
    assert [staleness_lr_factor(s) for s in (0, 1, 2, 4)] == [1.0, 1.0, 0.5, 0.25]
    assert ApplyStep([StalenessWeight()]).rate(0.2, 4) == (0.05, 0.25)
    assert ApplyStep().rate(0.2, 4) == (0.2, 1.0)


def test_dc_correction_formula():
    grad = np.array([1.0, -2.0, 0.5], np.float32)
    now, pulled = np.array([1.0, 1.0, 1.0], np.float32), np.array([0.0, 2.0, 1.0], np.float32)
    expected = grad + 0.1 * grad * grad * (now - pulled)
    delay_compensate(grad, 0.1, now, pulled)
    np.testing.assert_allclose(grad, expected)


def test_the_apply_step_corrects_a_worker_s_gradient_against_what_it_received():
    dc = DelayCompensation(0.5)
    step = ApplyStep([dc])
    opt = optimizer([0.0, 0.0, 0.0, 0.0])
    step.received(1, opt.params.numpy())  # worker 1 received zeros
    opt.params += 1.0                       # then another update moved them to ones
    grad = np.ones(4, np.float32)
    step.apply_all(opt, grad, lr=1.0, worker=1)
    # g + 0.5 * g * g * (1 - 0) = 1.5 per element: 1 - 1.5
    np.testing.assert_allclose(opt.params.numpy(), -0.5)
    assert step.rewrites_gradient
    step.apply_all(opt, np.ones(4, np.float32), lr=1.0)  # a round's mean: nobody's, uncorrected
    np.testing.assert_allclose(opt.params.numpy(), -1.5)
    step.apply_all(opt, np.ones(4, np.float32), lr=1.0, worker=0)  # received nothing: as it is
    np.testing.assert_allclose(opt.params.numpy(), -2.5)


def test_chunk_by_chunk_is_one_step_over_the_whole():
    whole, chunked = optimizer([1.0, 2.0, 3.0], chunk=3), optimizer([1.0, 2.0, 3.0], chunk=1)
    grad = np.array([0.5, -1.0, 2.0], np.float32)
    ApplyStep().apply_all(whole, grad.copy(), 0.1)
    ApplyStep().apply_all(chunked, grad.copy(), 0.1)
    np.testing.assert_array_equal(whole.params.numpy(), chunked.params.numpy())


def test_statistics_record_what_the_rules_did():
    stats = RuleStatistics()
    stats.pushed(False)
    stats.applied(2, 0.5)
    stats.applied(0, 1.0)
    stats.round_closed(3)
    stats.dropped()
    report = stats.report(lock_step=True, staleness_lr=True)
    assert report["staleness_histogram"] == {0: 4, 2: 1}
    assert report["gradients_per_round"] == {3: 1}
    assert report["dropped_gradients"] == 1 and report["pushes_without_gradient"] == 1
    assert report["mean_lr_factor"] == round(1.5 / 5, 6)
    assert "gradients_per_round" not in stats.report(lock_step=False, staleness_lr=False)
