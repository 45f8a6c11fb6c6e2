"""The Python API: ``hvdtrain.fit(model, train_data, test_data, loss=..., **options)``.

A script that calls it runs under ``horovodrun -np N python train.py``, ``mpirun -np N python
train.py`` or plain ``python train.py``, in every mode, with no other change::

    import torch, hvdtrain

    x, y = torch.randn(1024, 20), torch.randint(0, 3, (1024,))
    result = hvdtrain.fit(lambda: torch.nn.Linear(20, 3), (x[:800], y[:800]), (x[800:], y[800:]),
                          epochs=5, batch_size=32, lr=0.05)
    print(result.final)  # {'epoch': 5, 'train_loss': ..., 'test_acc': ..., ...}
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch.nn as nn

from .config import Config, ConfigError


@dataclass
class FitResult:
    """What ``fit`` returns, the same on every rank (parameter servers included)."""

    history: list[dict[str, Any]] = field(default_factory=list)
    """One entry per epoch: epoch, train_loss, test_loss (None when not evaluated), train_<metric>
    and test_<metric> for each metric, samples_per_sec (all workers), epoch_seconds,
    wall_seconds (since training started) and lr."""
    run_dir: Path | None = None
    log_path: Path | None = None         # the JSONL log: a header, then a line per epoch
    checkpoint_path: Path | None = None  # the last checkpoint (resume with resume=run_dir)
    model: nn.Module | None = None
    """This rank's replica; None on a server rank. Sync: the same trained model on every rank.
    Async: worker 0's holds the servers' final parameters (it pulls them for the last
    evaluation and checkpoint); the other workers' hold what they last pulled."""
    preempted: str | None = None
    """The signal (SIGTERM, SIGUSR1, SIGINT) that stopped training after a step checkpoint; call
    fit again with ``auto_resume=True`` and the same ``run_dir`` to continue. None otherwise."""

    @property
    def final(self) -> dict[str, Any] | None:
        return self.history[-1] if self.history else None


def fit(model: nn.Module | Callable[[], nn.Module], train_data: Any, test_data: Any = None, *,
        loss: str | Callable = "cross_entropy",
        metrics: dict[str, Callable] | None = None, config: Config | None = None,
        **options: Any) -> FitResult:
    """Train ``model`` on ``train_data`` with hvdtrain's sync or async schemes. Every rank calls it.

    model: an ``nn.Module``, or a callable with no arguments that returns one. A callable is
        called on every rank after seeding with ``seed``, so every replica starts from the same
        weights (sync mode also broadcasts rank 0's weights and buffers).
    train_data, test_data: a map-style ``torch.utils.data.Dataset`` (read through a DataLoader,
        each worker a disjoint shard of every epoch), an ``IterableDataset`` (split round-robin,
        see hvdtrain/data/loader.py; without ``__len__`` pass ``max_steps_per_epoch``), or a pair
        of tensors ``(x, y)`` (kept in memory, no DataLoader). A sample is ``(input, target)``;
        either may be a tensor, or a tuple or dict of tensors (the model then gets ``model(*x)``
        or ``model(**x)``). ``test_data`` may be None.
    loss: ``cross_entropy``, ``nll``, ``mse``, ``l1``, ``bce_with_logits``, ``"MODULE:CALLABLE"``
        or a callable ``loss(output, target) -> scalar mean``.
    metrics: ``{name: metric(output, target) -> (sum, count)}``; sums and counts add across
        micro-batches and workers. By default, accuracy ("acc") for cross_entropy and nll on
        (N, C) outputs, and nothing else.
    config: a ``hvdtrain.config.Config``; ``options`` override its fields.
    options: the command line's options with underscores: ``mode="async"``, ``epochs=8``,
        ``batch_size=16``, ``optimizer="adam"``, ``lr=3e-3``, ``run_dir=...``, ``staleness=2``,
        ``stages=2``, ``data_workers=2``... (``hvdtrain train --help`` lists them all). A bad
        value raises the same ConfigError, with the same message, as the flag would.

    Errors: bad input raises ConfigError (or DataError, CheckpointError) on every rank before
    training. A failure during async training ends the whole MPI job (MPI_Abort, with the
    message printed), because the other ranks would otherwise wait for this one.
    """
    from . import launch
    from .workload import workload_from_objects

    cfg = _config(config, options)
    workload = workload_from_objects(model, train_data, test_data, loss, metrics)
    finished = launch.run(cfg, workload)
    run_dir = Path(finished.run_dir) if finished.run_dir is not None else None
    return FitResult(
        history=[epoch.as_record() for epoch in finished.history],
        run_dir=run_dir,
        log_path=run_dir / "metrics.jsonl" if run_dir else None,
        checkpoint_path=finished.trainer.checkpointer.path if finished.trainer else (
            run_dir / "checkpoint.pt" if run_dir else None),
        model=finished.trainer.replica.model if finished.trainer else None,
        preempted=finished.preempted)


def _config(config: Config | None, options: dict[str, Any]) -> Config:
    if config is not None and not isinstance(config, Config):
        raise ConfigError(f"config: got {type(config).__name__}; pass a hvdtrain.config.Config "
                          "or give the options as keyword arguments")
    for name in ("model", "dataset", "loss", "model_args", "dataset_args"):
        if name in options:
            raise ConfigError(f"{name}=: fit() takes the model, the data and the loss as "
                              "objects (its first arguments and loss=), not as option names")
    if config is None:
        return Config.from_overrides(options).validate()
    import copy
    import dataclasses

    cfg = copy.deepcopy(config)
    owners = {f.name: section for section in dataclasses.fields(cfg)
              for f in dataclasses.fields(getattr(cfg, section.name))}
    merged = {name: getattr(getattr(cfg, owners[name].name), name) for name in owners}
    merged.update(options)
    return Config.from_overrides(merged).validate()
