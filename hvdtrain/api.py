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

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch.nn as nn

from .config import Config, ConfigError


@dataclass
class FitResult:
    """What ``fit`` returns, the same on every rank (parameter servers included)."""

    history: list[dict[str, Any]] = field(default_factory=list)
    """One entry per epoch this call trained: epoch, train_loss, test_loss (None when not
    evaluated), train_<metric> and test_<metric> for each metric, samples_per_sec (all
    workers), epoch_seconds (the epoch's training time: an evaluation inside it is left out, as
    from samples_per_sec), wall_seconds (since training started) and lr. A resumed call holds
    the epochs it trained (the earlier ones are in log_path), and one that found nothing left
    to train holds none (``final`` is then None)."""
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
        metrics: dict[str, Callable] | None = None, collate: Callable | str | None = None,
        config: Config | None = None, **options: Any) -> FitResult:
    """Train ``model`` on ``train_data`` with hvdtrain's sync or async schemes. Every rank calls it.

    model: an ``nn.Module``, or a callable with no arguments that returns one, called on every
        rank after seeding with ``seed`` (sync also broadcasts rank 0's weights and buffers).
    train_data, test_data: a map-style ``torch.utils.data.Dataset`` (read through a DataLoader,
        each worker a disjoint shard of every epoch), an ``IterableDataset`` (split round-robin,
        see hvdtrain/data/loader.py; without ``__len__`` pass ``max_steps_per_epoch``), or a pair
        of tensors ``(x, y)`` (kept in memory, no DataLoader). A sample is ``(input, target)``;
        either may be a tensor, or a tuple or dict of tensors (the model then gets ``model(*x)``
        or ``model(**x)``). ``test_data`` may be None.
    loss: a built-in's name (``cross_entropy``, ``mse``...), ``"MODULE:CALLABLE"`` or a callable
        ``loss(output, target) -> scalar mean``.
    metrics: ``{name: metric(output, target) -> (sum, count)}``, summed over micro-batches and
        workers, beside the loss's accuracy ("acc": cross_entropy, nll on (N, C) outputs).
    collate: ``collate(samples) -> (inputs, targets)`` for a Dataset's samples (padding them
        to one length, say), or ``"MODULE:CALLABLE"``; torch's ``default_collate`` by default.
    config: a ``hvdtrain.config.Config``; ``options`` override its fields.
    options: the command line's options with underscores: ``mode="async"``, ``epochs=8``,
        ``batch_size=16``, ``optimizer="adam"``, ``lr=3e-3``, ``run_dir=...``, ``staleness=2``,
        ``stages=2``, ``data_workers=2``... (``hvdtrain train --help`` lists them all). A bad
        value raises the same ConfigError, with the same message, as the flag would; those of
        the built-in models and datasets (hidden, data_path, test_fraction...) are refused. With
        ``data_workers`` above 0 and a Dataset, call fit under ``if __name__ == "__main__":``:
        the loader processes import the script again, and fit refuses an unguarded call.

    Errors (each in hvdtrain): bad input raises ConfigError, DataError or CheckpointError on
    every rank before training. A failure during async training ends the MPI job (MPI_Abort).
    """
    from . import launch
    from .workload import workload_from_objects

    cfg = _config(config, options)
    _check_main_guard(cfg, train_data, test_data)
    workload = workload_from_objects(model, train_data, test_data, loss, metrics,
                                     cfg.data.sparse_labels, collate or cfg.data.collate)
    _record_objects(cfg, workload)
    finished = launch.run(cfg, workload)
    run_dir = Path(finished.run_dir) if finished.run_dir is not None else None
    return FitResult(
        history=[epoch.as_record() for epoch in finished.history],
        run_dir=run_dir,
        log_path=run_dir / "metrics.jsonl" if run_dir else None,
        checkpoint_path=finished.trainer.checkpointer.path if finished.trainer else (
            run_dir / "checkpoint.pt" if run_dir else None),
        model=finished.trainer.replica.model if finished.trainer else None,
        preempted=finished.verdict.preempted)


def _record_objects(cfg: Config, workload: Any) -> None:
    """Record fit's own model, data and loss in the run's config, which had carried the command
    line's defaults (digits, mlp, cross_entropy) into the log's header and the checkpoints."""
    cfg.model.model, cfg.data.dataset = FIT_MODEL, FIT_DATA
    cfg.model.loss = workload.loss_name
    if workload.collate is not None and not cfg.data.collate:
        cfg.data.collate = getattr(workload.collate, "__qualname__", "(a callable)")


def _check_main_guard(cfg: Config, *datasets: Any) -> None:
    """Refuse data_workers > 0 when the script calls fit() at its top level, unguarded.

    Loader processes start with forkserver, and each imports the script as ``__mp_main__``
    before it can unpickle the dataset. Without ``if __name__ == "__main__":`` every one of
    them ran fit() again: a stray run folder each, then a traceback from multiprocessing."""
    if not cfg.data.data_workers or all(d is None or isinstance(d, (tuple, list))
                                        for d in datasets):
        return  # in-memory tensors never use a DataLoader
    frame = _script_frame()
    if frame is None:
        return  # not called from a script's top level (a function, a notebook, python -c)
    name, path, line = frame
    if name == "__mp_main__":  # this is a loader process importing the script
        raise ConfigError(_unguarded_message(cfg, path, line))
    if not _guarded(path, line):
        raise ConfigError(_unguarded_message(cfg, path, line))


def _script_frame() -> tuple[str, str, int] | None:
    """(module name, file, line) of the top-level statement of the main script that led to this
    call, or None when no script's top level is on the stack."""
    import inspect

    for info in inspect.stack(context=0)[::-1]:  # outermost first
        module = info.frame.f_globals.get("__name__")
        if (info.function == "<module>" and module in ("__main__", "__mp_main__")
                and os.path.isfile(info.filename)):
            return module, info.filename, info.lineno
    return None


def _guarded(path: str, line: int) -> bool:
    """Whether ``line`` of the script is inside an ``if __name__ == "__main__":`` block."""
    import ast

    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return True  # cannot tell: let it run, as before
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_main_test(node.test) and node.body and (
                node.body[0].lineno <= line <= node.body[-1].end_lineno):
            return True
    return False


def _is_main_test(test: Any) -> bool:
    import ast

    if not (isinstance(test, ast.Compare) and len(test.ops) == 1
            and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    names = [s.id for s in sides if isinstance(s, ast.Name)]
    values = [s.value for s in sides if isinstance(s, ast.Constant)]
    return names == ["__name__"] and values == ["__main__"]


def _unguarded_message(cfg: Config, path: str, line: int) -> str:
    return (f"data_workers={cfg.data.data_workers}: {path} calls fit() at line {line} without "
            "an `if __name__ == \"__main__\":` guard; the loader processes start by importing "
            "the script again (forkserver), so each of them would run fit() once more. Put the "
            "script's work under `if __name__ == \"__main__\":` (as in the README's example), "
            "or pass data_workers=0")


# The command line's names of what fit() takes as objects: its first arguments and loss=.
OBJECT_OPTIONS = ("model", "dataset", "loss", "model_args", "dataset_args")
# What shapes the command line's built-in models and datasets, and the split it holds out: fit()
# trains the objects it is given, so these were ignored (hidden=) or refused as if the model
# were the built-in mlp (channels=).
BUILT_IN_ONLY = ("hidden", "channels", "data_path", "test_fraction", "data_seed",
                 "synthetic_samples", "synthetic_shape", "synthetic_classes")
# What a fit() run records for its objects (the log's header, checkpoints, trackers), where the
# command line's defaults (digits, mlp) had stood.
FIT_MODEL, FIT_DATA = "(the model passed to fit)", "(the data passed to fit)"


def _config(config: Config | None, options: dict[str, Any]) -> Config:
    if config is not None and not isinstance(config, Config):
        raise ConfigError(f"config: got {type(config).__name__}; pass a hvdtrain.config.Config "
                          "or give the options as keyword arguments")
    for name in OBJECT_OPTIONS:
        if name in options:
            raise ConfigError(f"{name}=: fit() takes the model, the data and the loss as "
                              "objects (its first arguments and loss=), not as option names")
    for name in BUILT_IN_ONLY:
        if name in options:
            raise ConfigError(
                f"{name}=: it shapes the command line's built-in models and datasets, and fit() "
                "trains the model and data you pass: drop it"
                + (" (split the data yourself and pass test_data)"
                   if name in ("test_fraction", "data_seed") else ""))
    if config is None:
        return Config.from_overrides(options, unlisted=OBJECT_OPTIONS).validate()
    import copy
    import dataclasses

    cfg = copy.deepcopy(config)
    owners = {f.name: section for section in dataclasses.fields(cfg)
              for f in dataclasses.fields(getattr(cfg, section.name))}
    merged = {name: getattr(getattr(cfg, owners[name].name), name) for name in owners}
    merged.update(options)
    return Config.from_overrides(merged, unlisted=OBJECT_OPTIONS).validate()
