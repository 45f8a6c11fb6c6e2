"""The model registry. Every model is an ``nn.Sequential``, so the pipeline can split it by layers.

Sizes come from the dataset: ``build_model(name, input_shape, num_classes, cfg)``.
"""

from __future__ import annotations

from typing import Callable

import torch.nn as nn

from .config import ConfigError, ModelConfig

Builder = Callable[[tuple[int, ...], int, ModelConfig], nn.Sequential]
MODELS: dict[str, Builder] = {}


def register(name: str) -> Callable[[Builder], Builder]:
    def add(builder: Builder) -> Builder:
        MODELS[name] = builder
        return builder
    return add


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int,
                cfg: ModelConfig) -> nn.Sequential:
    if name not in MODELS:
        raise ConfigError(f"--model: unknown model {name!r}; choose one of {', '.join(sorted(MODELS))}")
    return MODELS[name](tuple(input_shape), num_classes, cfg)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@register("mlp")
def mlp(input_shape: tuple[int, ...], num_classes: int, cfg: ModelConfig) -> nn.Sequential:
    width = 1
    for n in input_shape:
        width *= n
    layers: list[nn.Module] = [nn.Flatten()]
    for hidden in cfg.hidden:
        layers += [nn.Linear(width, hidden), nn.ReLU()]
        width = hidden
    layers.append(nn.Linear(width, num_classes))
    return nn.Sequential(*layers)


@register("cnn")
def cnn(input_shape: tuple[int, ...], num_classes: int, cfg: ModelConfig) -> nn.Sequential:
    """Conv-ReLU-MaxPool blocks, then a small classifier head."""
    if len(input_shape) != 3:
        raise ConfigError(f"--model cnn: needs image samples shaped (channels, height, width), "
                          f"but the dataset's samples have shape {input_shape}; "
                          "use --model mlp, or --synthetic-shape 1x28x28")
    channels, height, width = input_shape
    layers: list[nn.Module] = []
    for out in cfg.channels:
        layers += [nn.Conv2d(channels, out, kernel_size=3, padding=1), nn.ReLU()]
        if min(height, width) >= 2:  # pool while there is something left to pool
            layers.append(nn.MaxPool2d(2))
            height, width = height // 2, width // 2
        channels = out
    layers += [nn.Flatten(), nn.Linear(channels * height * width, 128), nn.ReLU(),
               nn.Linear(128, num_classes)]
    return nn.Sequential(*layers)
