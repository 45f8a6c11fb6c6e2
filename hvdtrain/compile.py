"""--compile: torch.compile around the model (or each pipeline stage), with one clear message
when compilation fails.

torch.compile compiles lazily, at the first call (and again for new shapes or for eval mode), so
a failure shows up in a forward pass, as one of several internal exception types with a long
report. The wrapper below tells a compiler failure from a bug in the model by running the same
call without compiling: if that works, the flag is at fault and the user is told to drop it; if
it fails too, the model's own error is raised, as it would be without --compile.

The backward graph is compiled with the forward one (AOTAutograd would otherwise compile it at the
first backward pass, outside this wrapper, where its failure would be a bare compiler report).
"""

from __future__ import annotations

from typing import Any

import torch
import torch._functorch.config as functorch_config

from .errors import ConfigError


class CompiledModule:
    """Calls torch.compile's wrapper of ``module``; parameters are shared with ``module``."""

    def __init__(self, module: torch.nn.Module, name: str):
        self.module = module
        self.name = name
        if hasattr(functorch_config, "force_non_lazy_backward_lowering"):  # private to torch
            functorch_config.force_non_lazy_backward_lowering = True
        self.compiled = torch.compile(module)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return self.compiled(*args, **kwargs)
        except Exception as compile_error:  # noqa: BLE001  sorted out below
            try:
                self.module(*args, **kwargs)
            except Exception as model_error:  # noqa: BLE001
                # A bug in the model: its own error points at the user's line, where dynamo's
                # report of it (a fake-tensor failure, say) points into torch.
                raise model_error from None
            first = next((line for line in str(compile_error).splitlines() if line.strip()),
                         type(compile_error).__name__)
            raise ConfigError(f"--compile: torch.compile could not compile {self.name} "
                              f"({type(compile_error).__name__}: {first}); the model runs "
                              "without compiling, so drop --compile") from compile_error


def compile_module(module: torch.nn.Module, name: str) -> CompiledModule:
    return CompiledModule(module, name)
