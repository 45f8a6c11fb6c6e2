"""The options of what is trained: the network and its loss, and the optimizer."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import ConfigError, require
from .values import opt, refuse_unread


DEFAULT_SHAPES = {"hidden": (256, 128), "channels": (32, 64)}


def metric_specs(text: str) -> dict[str, str]:
    """``"top3=m.py:top3,f1=m.py:f1"`` -> {"top3": "m.py:top3", "f1": "m.py:f1"}; ValueError
    saying the format for anything else."""
    specs: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in (text or "").split(","))):
        name, eq, spec = (s.strip() for s in part.partition("="))
        if not eq or not name.isidentifier() or ":" not in spec:
            raise ValueError(f"{part!r} is not NAME=MODULE:CALLABLE; e.g. top3=metrics.py:top3")
        if name == "loss" or name in specs:
            taken = "the loss's" if name == "loss" else "given twice"
            raise ValueError(f"the name {name!r} is {taken}; give each metric a name of its own")
        if name.startswith(("test_", "train_")):  # the log adds those: test_test_x
            raise ValueError(f"the name {name!r} would be logged as train_{name} and "
                             f"test_{name}; name it {name.partition('_')[2]!r}, and its test "
                             "value is test_" + name.partition("_")[2])
        specs[name] = spec
    return specs


@dataclass
class ModelConfig:
    """Which network to train. Input and output sizes come from the dataset."""

    model: str = opt("mlp", "a built-in model (the registry in hvdtrain/models.py) "
                     "or your own MODULE:CALLABLE returning an nn.Module; MODULE is a dotted "
                     "import path or a .py file, and the callable also receives input_shape "
                     "and num_classes when its signature names them")
    model_args: str = opt("", "keyword arguments for your --model callable, as a JSON object, "
                          "e.g. '{\"width\": 64}'")
    loss: str = opt("cross_entropy", "cross_entropy, nll, token_cross_entropy (classes on the "
                    "last axis: a language model's (N, T, V) logits against (N, T) token ids, "
                    "-100 not scored), mse, l1, bce_with_logits, or your own MODULE:CALLABLE "
                    "computing loss(output, target) -> scalar mean; accuracy is reported for "
                    "cross_entropy and nll on (N, C) outputs, and over the tokens for "
                    "token_cross_entropy")
    metrics: str = opt("", "your own metrics besides the loss, as NAME=MODULE:CALLABLE, "
                       "comma-separated, e.g. top3=metrics.py:top3: each metric(output, target) "
                       "returns (sum, count), summed over batches and workers, and is logged as "
                       "NAME (training) and test_NAME (evaluation), which --stop-at and "
                       "hvdtrain compare --target can name")
    hidden: tuple[int, ...] = opt(DEFAULT_SHAPES["hidden"], "hidden layer widths of the MLP, e.g. 1024,1024")
    channels: tuple[int, ...] = opt(DEFAULT_SHAPES["channels"], "convolution channels of the CNN, one per block")

    def validate(self) -> None:
        m = self
        try:
            metric_specs(m.metrics)
        except ValueError as e:
            raise ConfigError(f"--metrics: invalid value {m.metrics!r}; {e}") from None
        require(len(m.hidden) >= 1 and all(n >= 1 for n in m.hidden), "--hidden", m.hidden,
                "give positive layer widths, e.g. --hidden 256,128")
        require(len(m.channels) >= 1 and all(n >= 1 for n in m.channels), "--channels",
                m.channels, "give positive channel counts, e.g. --channels 32,64")
        # Each built-in model reads its own shape flag; another's was ignored without a word.
        for flag, owner in (("hidden", "mlp"), ("channels", "cnn")):
            refuse_unread(m, (flag,), m.model == owner,
                          f"it shapes --model {owner}, not --model {m.model}: drop it"
                          + (" (your own model takes its sizes in --model-args)"
                             if ":" in m.model else ""))
        refuse_unread(m, ("model_args",), ":" in m.model,
                      f"it is for your own --model MODULE:CALLABLE; the built-in {m.model} would "
                      "ignore it. Its sizes are flags (--hidden for mlp, --channels for cnn): use "
                      "those, or drop {flag}")


@dataclass
class OptimConfig:
    """The optimizer and its learning-rate schedule."""

    optimizer: str = opt("sgd", "sgd (with --momentum), adam or adamw",
                         choices=("sgd", "adam", "adamw"))
    lr: float = opt(0.05, "learning rate of one worker; sync and async --bsp scale it by "
                    "the number of workers whose gradients an update averages (see "
                    "--lr-scaling); plain async applies each worker's gradient alone, at --lr")
    momentum: float = opt(0.9, "SGD momentum")
    weight_decay: float = opt(0.0, "L2 penalty (decoupled for adamw)")
    lr_scaling: str = opt("linear", "linear: multiply --lr by the number of workers an "
                          "update averages (Goyal et al. 2017; none in plain async, where each "
                          "update is one worker's); none: use --lr as is",
                          choices=("linear", "none"))
    warmup_epochs: float = opt(1.0, "epochs over which the learning rate ramps from --lr to "
                               "the scaled rate (no ramp where that is --lr: plain async, "
                               "--lr-scaling none); 0 disables warmup")
    lr_schedule: str = opt("constant", "after warmup: constant, or cosine decay to 0",
                           choices=("constant", "cosine"))
    clip_grad_norm: float = opt(0.0, "clip the gradient to this total L2 norm before each "
                                "update (0: no clipping): sync the averaged one, async each "
                                "worker's own; see docs/gpu.md")

    def validate(self) -> None:
        o = self
        require(math.isfinite(o.lr) and o.lr > 0, "--lr", o.lr,
                "pass a positive learning rate, e.g. --lr 0.05")
        require(0 <= o.momentum < 1, "--momentum", o.momentum, "use a value in [0, 1), e.g. 0.9")
        refuse_unread(o, ("momentum",), o.optimizer == "sgd",
                      f"SGD's momentum; --optimizer {o.optimizer} keeps its own running averages "
                      "(torch's betas) and would ignore it: drop {flag}, or use --optimizer sgd")
        require(o.weight_decay >= 0, "--weight-decay", o.weight_decay, "use 0 or a positive value")
        require(o.warmup_epochs >= 0, "--warmup-epochs", o.warmup_epochs,
                "use 0 (no warmup) or a positive number of epochs")
        require(o.clip_grad_norm >= 0, "--clip-grad-norm", o.clip_grad_norm,
                "use 0 (no clipping) or a positive norm, e.g. 1")
