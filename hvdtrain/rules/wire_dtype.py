"""--wire-dtype: the dtype of what travels between the processes, the parameter server's pushes
and replies (ps/wire.py) and the averages of local SGD's and DiLoCo's rounds
(engines/local_rounds.py). This module names the dtypes and checks the combinations; torch is
imported only where a dtype is asked for, so the config's checks stay light."""

from __future__ import annotations

from typing import Any

from ..config.values import UnreadOption
from ..errors import ConfigError

NAMES = ("fp32", "bf16", "fp16")


def torch_dtype(name: str):
    """The torch dtype of ``name`` (fp32, bf16, fp16)."""
    import torch

    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[name]


def narrow_dtype(name: str):
    """The dtype a round's average travels in, or None for float32 (sent as the tensors are)."""
    return None if name == "fp32" else torch_dtype(name)


def check_options(cfg: Any) -> None:
    """--wire-dtype rounds what the server's messages and local SGD's rounds carry; plain sync
    averages every step's gradients, which --compression fp16 compresses (Horovod's
    Compression.fp16), and Horovod has no bfloat16 allreduce."""
    wire, s = cfg.ps.wire_dtype, cfg.sync
    if wire == "fp32" or cfg.run.mode != "sync":
        return
    if s.local_steps == 1:
        raise UnreadOption(f"--wire-dtype {wire} rounds what the parameter server's messages "
                           "(--mode async) and local SGD's rounds (--local-steps H) carry; plain "
                           "sync averages every step's gradients, which --compression fp16 "
                           "compresses: use --compression fp16, or add --local-steps H (e.g. 8)",
                           "wire_dtype")
    if wire == "bf16" and s.collective == "horovod":
        raise ConfigError("--wire-dtype bf16 with --local-steps: Horovod has no bfloat16 "
                          "allreduce; use --wire-dtype fp16, or --collective torch (Gloo and "
                          "NCCL reduce bfloat16)")
