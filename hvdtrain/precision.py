"""What happens to a gradient between the backward pass and the update, on any replica: mixed
precision (autocast, and a dynamic loss scale for float16), clipping, and skipping a step whose
gradient overflowed.

Both update schemes go through :meth:`Precision.update`; they differ in what the "optimizer" is.
Sync mode hands in Horovod's DistributedOptimizer after ``synchronize()``, so the gradient that
is unscaled, checked and clipped is the average every rank holds, and every rank decides alike.
Async mode hands in a :class:`PushGate`, a stand-in whose ``step()`` only records that the
GradScaler let the step through: the worker then pushes the gradient, or skips the push.

The order is the one torch.amp and Horovod document for loss scaling with a distributed
optimizer: scale the loss and backward, (synchronize), unscale, clip, step (skipped when the
gradient is not finite), update the scale.
"""

from __future__ import annotations

import contextlib
from typing import Iterable

import torch

from .errors import ConfigError, TrainingError

DTYPES = {"32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


class PushGate(torch.optim.Optimizer):
    """An optimizer that updates nothing: GradScaler.step() calls ``step()`` only when the
    gradient is finite, which is the async worker's signal to push it."""

    def __init__(self, params: Iterable[torch.nn.Parameter]):
        super().__init__(list(params), {})
        self.passed = False

    def step(self, closure=None):  # noqa: D102  (torch's signature)
        self.passed = True


# A loss scale below fp16's smallest step (2^-24) shrinks any finite gradient out of overflow
# range, so a step skipped there has a gradient that is NaN or infinite at any scale. From the
# default scale 2^16 it takes 40 skipped steps in a row to get there.
SCALE_FLOOR = 2.0 ** -24


class Precision:
    """--precision and --clip-grad-norm for one replica, whose parameters live on ``devices``."""

    def __init__(self, mode: str, devices: list[torch.device], clip_grad_norm: float = 0.0):
        if mode not in DTYPES:
            raise ConfigError(f"--precision: invalid choice {mode!r}; choose one of 32, bf16, fp16")
        self.mode = mode
        self.dtype = DTYPES[mode]
        self.clip_grad_norm = clip_grad_norm
        kinds = sorted({d.type for d in devices})
        if mode == "bf16" and "cuda" in kinds and not torch.cuda.is_bf16_supported():
            raise ConfigError("--precision bf16: this GPU has no bfloat16 support (it needs "
                              "compute capability 8.0, Ampere, or newer); use --precision fp16")
        # One scaler per replica: a pipeline's stages share the scale of their one loss. torch
        # scales on CPUs too, so fp16 runs there (slowly; see check_devices).
        self.scaler = (torch.amp.GradScaler("cuda" if "cuda" in kinds else "cpu")
                       if mode == "fp16" else None)
        self.skipped_in_a_row = 0
        self._reset_counts()

    def _reset_counts(self) -> None:
        self.steps = 0
        self.skipped = 0
        self.norm_sum: torch.Tensor | float = 0.0  # summed on the device: read once an epoch
        self.clipped: torch.Tensor | float = 0.0
        self.normed: torch.Tensor | float = 0.0  # steps whose norm was finite (fp16 skips)

    @property
    def needs_synchronized_gradients(self) -> bool:
        """Whether the update reads the whole gradient first (sync mode must then synchronize
        before it, and step without synchronizing again)."""
        return self.scaler is not None or self.clip_grad_norm > 0

    def autocast(self, device: torch.device):
        """The context a forward pass on ``device`` runs in. Autocast state is per thread, so a
        pipeline enters it in every stage's thread."""
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device.type, dtype=self.dtype)

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def update(self, optimizer: torch.optim.Optimizer, params: list[torch.nn.Parameter]) -> bool:
        """Unscale, clip and step ``optimizer`` over ``params``; False when the step was skipped
        because the gradient was not finite (fp16 only: without a loss scale an overflow is the
        finite-loss guard's to report)."""
        self.steps += 1
        scaler = self.scaler
        if scaler is not None:
            scaler.unscale_(optimizer)
        if self.clip_grad_norm > 0:
            norm = torch.nn.utils.clip_grad_norm_(params, self.clip_grad_norm).detach()
            # an fp16 step skipped for an overflow has no norm: one made the epoch's mean NaN
            finite = torch.isfinite(norm)
            self.norm_sum = self.norm_sum + torch.where(finite, norm, 0.0)
            self.clipped = self.clipped + (finite & (norm > self.clip_grad_norm))
            self.normed = self.normed + finite
        if scaler is None:
            optimizer.step()
            return True
        before = scaler.get_scale()
        scaler.step(optimizer)
        scaler.update()
        # The scale backs off exactly when the step found an inf or NaN and was skipped.
        stepped = scaler.get_scale() >= before
        self.skipped += not stepped
        self.skipped_in_a_row = 0 if stepped else self.skipped_in_a_row + 1
        if not stepped and scaler.get_scale() < SCALE_FLOOR:
            self._never_finite()
        return stepped

    def _never_finite(self) -> None:
        """The end of a run whose gradient is NaN or infinite at any loss scale: its steps were
        all skipped, its loss never moved, and it ran to the end with exit 0, where a float32
        run of the same model stops at its first NaN loss."""
        raise TrainingError(
            f"--precision fp16: {self.skipped_in_a_row} steps in a row were skipped because the "
            f"gradient was not finite, with the loss scale down to {self.scaler.get_scale():.3g}; "
            "the backward pass gives NaN or infinite gradients at any scale, so the model does "
            "not train. Look for an operation whose gradient is undefined where it is used (a "
            "sqrt or log at 0, a division by 0); --precision 32 stops at the step where the "
            "loss first becomes NaN")

    def take_epoch_metrics(self) -> dict:
        """The epoch's loss scale, skipped steps and clipping figures for its log line; then
        reset. Async: worker 0's own, as every worker keeps its own scale."""
        out: dict = {}
        if self.scaler is not None:
            out["loss_scale"] = self.scaler.get_scale()
            out["skipped_steps"] = self.skipped
        normed = float(self.normed)
        if self.clip_grad_norm > 0 and normed:
            out["grad_norm_mean"] = round(float(self.norm_sum) / normed, 6)
            out["clipped_fraction"] = round(float(self.clipped) / normed, 4)
        self._reset_counts()
        return out

    # --- checkpoints: the loss scale continues where it was -------------------------------------
    def state_dict(self) -> dict | None:
        return self.scaler.state_dict() if self.scaler is not None else None

    def load_state_dict(self, state: dict | None) -> None:
        if self.scaler is not None and state:
            self.scaler.load_state_dict(state)


def check_devices(precision: str, devices: list[torch.device], is_main: bool) -> None:
    """A note for fp16 on CPUs: it works, but CPUs compute float16 slowly."""
    if precision == "fp16" and all(d.type == "cpu" for d in devices) and is_main:
        print("hvdtrain: note: --precision fp16 on CPUs runs, but CPUs compute float16 slowly; "
              "use --precision 32, or bf16 on CPUs with bfloat16 instructions (avx512_bf16 or "
              "amx_bf16 in lscpu)", flush=True)
