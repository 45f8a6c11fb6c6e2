"""A small MLP whose evaluation forward passes sleep, so that an evaluation takes long against a
training step: the --eval-pauses-workers test measures what the other workers do meanwhile."""

import time

import torch


class SlowEvalMLP(torch.nn.Module):
    def __init__(self, input_shape, num_classes):
        super().__init__()
        features = 1
        for size in input_shape:
            features *= size
        self.net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(features, 32),
                                       torch.nn.ReLU(), torch.nn.Linear(32, num_classes))

    def forward(self, x):
        if not self.training and not torch.is_grad_enabled():
            time.sleep(0.2)  # per evaluation batch
        return self.net(x)


def build(input_shape, num_classes):
    return SlowEvalMLP(input_shape, num_classes)
