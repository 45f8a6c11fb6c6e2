"""A small MLP whose evaluation forward passes sleep, so that an evaluation takes long against a
training step: the --eval-pauses-workers test measures what the other workers do meanwhile."""

import time

import torch


class SlowEvalMLP(torch.nn.Module):
    def __init__(self, input_shape, num_classes, eval_sleep=0.2, once=False):
        super().__init__()
        self.eval_sleep, self.once = eval_sleep, once
        features = 1
        for size in input_shape:
            features *= size
        self.net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(features, 32),
                                       torch.nn.ReLU(), torch.nn.Linear(32, num_classes))

    def forward(self, x):
        if not self.training and not torch.is_grad_enabled():
            time.sleep(self.eval_sleep)  # per evaluation batch
            if self.once:  # only the first evaluation batch is slow
                self.eval_sleep = 0.0
        return self.net(x)


def build(input_shape, num_classes, eval_sleep=0.2, once=False):
    return SlowEvalMLP(input_shape, num_classes, eval_sleep, once)
