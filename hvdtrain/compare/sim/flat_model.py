"""What the simulator trains: the one real replica, its weights one flat vector (_FlatModel),
set up as a real run of the same train flags sets it up (_Setup, config_from_train_args)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ...config import Config, ConfigError
from ...flat_views import shaped_views
from ...loop.evaluator import EVAL_BATCH
from ...precision import Precision
from ...replica import Replica
from ...stragglers import StragglerModel, parse_straggler
from ..plan import Mode


class _FlatModel:
    """The one real replica. Its trainable parameters are views of one flat vector, so loading a
    virtual worker's weights is one copy, and a gradient is one flat vector as the server sees
    it."""

    def __init__(self, replica: Replica, clip_grad_norm: float):
        self.replica = replica
        self.clip_grad_norm = clip_grad_norm
        self.params = [p for p in replica.model.parameters() if p.requires_grad]
        odd = sorted({str(p.dtype) for p in self.params if p.dtype != torch.float32})
        if odd:
            raise ConfigError(f"the simulator trains float32 parameters; this model has "
                              f"{', '.join(odd)} ones: convert the model with .float()")
        self.flat = torch.empty(sum(p.numel() for p in self.params))
        for p, view in zip(self.params, shaped_views(self.flat, self.params)):
            view.copy_(p.data)
            p.data = view  # the weights live in the flat vector

    def gradient(self, x, y, clip: bool = True) -> tuple[torch.Tensor, float, int]:
        """(flat gradient of the batch's mean loss at the loaded weights, loss sum, samples,
        what the loss sum is over: replica.BatchStats.loss_weight).
        With ``clip``, clipped as --clip-grad-norm asks, as an async worker clips before its
        push (sync clips the average instead: :meth:`clip`)."""
        for p in self.params:
            p.grad = None
        stats = self.replica.forward_backward(x, y, grad_scale=1.0)
        if clip:
            self.clip()
        grad = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                          for p in self.params])
        return grad, stats.loss_sum.item(), stats.count, float(stats.loss_weight)

    def clip(self) -> None:
        """--clip-grad-norm on the parameters' gradients, as precision.Precision.update does."""
        if self.clip_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_([p for p in self.params if p.grad is not None],
                                           self.clip_grad_norm)

    def set_gradient(self, flat_grad: torch.Tensor) -> None:
        for p, view in zip(self.params, shaped_views(flat_grad, self.params)):
            p.grad = view

    def evaluate(self, test) -> dict[str, float | None]:
        """The loaded weights' test figures over the whole test split, named as a real run's
        log names them: test_loss, and test_NAME for each of the workload's metrics (test_acc,
        or the user's own; None where it counted nothing). {} without a test split."""
        if test is None:
            return {}
        stats = self.replica.evaluate(test.eval_batches(0, 1, EVAL_BATCH))
        if stats is None or not stats.count:
            return {}
        return {"test_loss": stats.mean_loss(),
                **{f"test_{name}": float(s) / float(c) if float(c) else None
                   for name, (s, c) in stats.metrics.items()}}


@dataclass
class _Setup:
    """The Config a real run of these train flags gets, its workload, and the model with the
    initial weights a real run draws."""

    cfg: Config
    workload: object
    model: _FlatModel
    straggler: StragglerModel

    @classmethod
    def build(cls, train_args: Sequence[str], seed: int, straggler: str, mode: Mode) -> _Setup:
        from ...launch import build_model, ready_replica
        from ...workload import workload_from_config

        cfg = config_from_train_args(train_args, {"seed": seed, "straggler": straggler,
                                                  **mode.config_options()})
        if cfg.run.precision == "fp16":
            raise ConfigError("--precision fp16: the simulator does not model the loss scale; "
                              "use 32 or bf16")
        if not mode.is_async and cfg.sync.reduce_op == "adasum":
            raise ConfigError("--reduce-op adasum: the simulator averages gradients; use average")
        workload = workload_from_config(cfg)
        device = torch.device("cpu")
        module = build_model(cfg, workload)  # as a real run: the weights every replica draws
        replica = Replica(module, device, workload.objective(), Precision(cfg.run.precision,
                                                                          [device]))
        ready_replica(cfg, workload, replica)
        model = _FlatModel(replica, cfg.optim.clip_grad_norm)
        return cls(cfg, workload, model, parse_straggler(straggler))


def config_from_train_args(train_args: Sequence[str], overrides: dict) -> Config:
    """The Config that ``hvdtrain train TRAIN_ARGS`` builds, with ``overrides`` (flag names with
    underscores) set on top. ConfigError for flags that train does not take."""
    from ...config.cross_checks import UNREAD_TUNING
    from ...train_flags import config_from_args, parse_train_flags

    given = parse_train_flags(train_args, "train flags")
    for name, value in overrides.items():
        setattr(given, name, value)
    for name in UNREAD_TUNING[getattr(given, "mode", "sync")]:  # as compare's real runs
        vars(given).pop(name, None)
    given.data_workers = 0  # dozens of virtual workers must not each start loader processes
    return config_from_args(given)

