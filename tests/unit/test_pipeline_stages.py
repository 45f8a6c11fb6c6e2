"""Stages that hold no trainable parameters (issue 14 item 8): a Flatten or ReLU alone, a frozen
layer, or a stage that hands on integers. Each still forwards, passes gradients back when an
earlier stage trains, and the split model's loss and gradients equal the unsplit model's."""

import copy

import pytest
import torch
import torch.nn as nn

from hvdtrain.config import ModelConfig, PipelineConfig
from hvdtrain.models import build_model
from hvdtrain.pipeline import PipelineReplica
from hvdtrain.replica import Replica


def _assert_split_matches_unsplit(model, cfg, x, y, devices=None):
    whole, split = model, copy.deepcopy(model)
    a = Replica(whole, torch.device("cpu")).forward_backward(x, y, 1.0)
    piped = PipelineReplica(split, devices or ["cpu"] * cfg.stages, cfg)
    b = piped.forward_backward(x, y, 1.0)
    assert abs(a.loss_sum.item() - b.loss_sum.item()) < 1e-5
    for (name, p), q in zip(whole.named_parameters(), split.parameters()):
        if p.grad is None:
            assert q.grad is None, name
        else:
            assert torch.allclose(p.grad, q.grad, atol=1e-6), name
    return piped


def _mlp():
    torch.manual_seed(0)  # Flatten, Linear, ReLU, Linear, ReLU, Linear
    return build_model("mlp", (64,), 10, ModelConfig())


def _batch(n=12, shape=(64,)):
    torch.manual_seed(1)
    return torch.randn(n, *shape), torch.randint(0, 10, (n,))


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "sequential"])
@pytest.mark.parametrize("micro", [1, 3])
@pytest.mark.parametrize("stages,points", [
    (2, (1,)),               # Flatten | the rest: the first stage has no parameters
    (3, (1, 2)),             # Flatten | Linear | the rest
    (3, (2, 3)),             # a ReLU alone in the middle
    (6, (1, 2, 3, 4, 5)),    # one layer per stage
    (4, ()), (5, ()), (6, ()),  # --stages 4..6 balanced by parameter count
])
def test_stages_without_parameters_train_like_the_unsplit_model(stages, points, schedule, micro):
    x, y = _batch()
    cfg = PipelineConfig(stages=stages, split_points=points, micro_batches=micro,
                         schedule=schedule)
    piped = _assert_split_matches_unsplit(_mlp(), cfg, x, y)
    assert any(not any(p.numel() for p in s.parameters()) for s in piped.stages)


def test_a_users_model_with_flatten_first_splits_after_it():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 8), nn.Tanh(), nn.Linear(8, 3))
    x, y = torch.randn(8, 4, 4), torch.randint(0, 3, (8,))
    _assert_split_matches_unsplit(model, PipelineConfig(stages=2, split_points=(1,),
                                                         micro_batches=2), x, y)


def test_a_frozen_first_stage_gets_no_gradient_and_the_rest_trains():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    model[0].requires_grad_(False)
    x, y = torch.randn(8, 6), torch.randint(0, 3, (8,))
    piped = _assert_split_matches_unsplit(model, PipelineConfig(stages=3, split_points=(1, 2),
                                                                micro_batches=2), x, y)
    assert piped.stages[0][0].weight.grad is None and piped.stages[2][0].weight.grad is not None


class Clamp(nn.Module):
    """Maps out-of-range token ids to the last one: integers in, integers out."""

    def forward(self, x):
        return x.clamp(max=9)


def test_a_stage_that_hands_on_integers_feeds_an_embedding():
    torch.manual_seed(0)
    model = nn.Sequential(Clamp(), nn.Embedding(10, 4), nn.Flatten(), nn.Linear(12, 3))
    x, y = torch.randint(0, 20, (8, 3)), torch.randint(0, 3, (8,))
    _assert_split_matches_unsplit(model, PipelineConfig(stages=3, split_points=(1, 2),
                                                        micro_batches=2), x, y)
