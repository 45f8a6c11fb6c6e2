"""hvdtrain: synchronous (Horovod) and asynchronous (MPI parameter server) distributed training
for PyTorch, driven by one trainer loop.

    result = hvdtrain.fit(model, train_data, test_data, loss="cross_entropy", epochs=10)

See hvdtrain.api.fit for the arguments, and ``hvdtrain train --help`` for the options.
"""

from typing import Any

__version__ = "0.1.0"

__all__ = ["CheckpointError", "Config", "ConfigError", "DataError", "FitResult", "TrainingError",
           "fit", "__version__"]

# What fit() raises (hvdtrain.api.fit): bad options and user code (ConfigError), bad data
# (DataError), a checkpoint it cannot resume (CheckpointError), a run that fails while it
# trains (TrainingError: a NaN loss, a stall); each where its own module lives.
_ERRORS = {"ConfigError": "config", "DataError": "data.builtin",
           "CheckpointError": "checkpoint", "TrainingError": "errors"}


def __getattr__(name: str) -> Any:
    # fit and FitResult import torch: only when asked for, so that the command line
    # (hvdtrain.cli) can place the process on its cores before torch loads OpenMP. Config too,
    # so that `hvdtrain run` installs its stop handler within the first tenth of a second.
    if name in ("fit", "FitResult"):
        from . import api
        return getattr(api, name)
    if name == "Config":
        from . import config
        return config.Config
    if name in _ERRORS:
        import importlib
        return getattr(importlib.import_module(f".{_ERRORS[name]}", __name__), name)
    raise AttributeError(f"module 'hvdtrain' has no attribute {name!r}")
