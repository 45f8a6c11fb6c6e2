"""The replica's trained parameters as one flat float32 buffer, which the async messages carry:
float32 parameters on the replica's first device become views into it, so a pull receives
straight into the model's weights; the others (another dtype, another pipeline stage's device)
are copied in and out of it. Gradients are gathered into the flat gradient buffer the same way.
"""

from __future__ import annotations

import torch

from ..flat_views import shaped_views


class FlatParameters:
    """The parameters of ``model`` that require a gradient, laid out in ``copies``'s buffers
    (device_copies.py: the same buffer on a CPU, a host and a device one on a GPU)."""

    def __init__(self, model: torch.nn.Module):
        # Frozen parameters stay out: the server's optimizer (momentum, weight decay) would move
        # them.
        self.trained = [p for p in model.parameters() if p.requires_grad]
        for p in self.trained:
            if not p.is_floating_point():
                raise ValueError(f"async mode trains floating-point parameters; this model has "
                                 f"a {p.dtype} parameter that requires a gradient")
        self.total = sum(p.numel() for p in self.trained)
        self.copied: list[tuple[torch.nn.Parameter, torch.Tensor]] = []  # not views of it

    def bind(self, weights: torch.Tensor) -> None:
        """Move the parameters into ``weights`` (what the model computes with)."""
        for p, view in zip(self.trained, shaped_views(weights, self.trained)):
            view.copy_(p.data)
            if p.dtype == torch.float32 and p.device == view.device:
                p.data = view  # the weights live in the buffer
            else:
                self.copied.append((p, view))

    def gather_gradients(self, views: list[torch.Tensor]) -> None:
        """Each parameter's gradient into its view of the flat gradient; zeros for a parameter
        unused in this step's graph."""
        for p, view in zip(self.trained, views):
            if p.grad is None:
                view.zero_()
            else:
                view.copy_(p.grad)

    def copy_out(self) -> None:
        """After a pull: the parameters that are not views of the buffer."""
        for p, view in self.copied:
            p.data.copy_(view)

    def copy_in(self) -> None:
        """After the model's non-float32 parameters changed (a checkpoint), refresh the buffer."""
        for p, view in self.copied:
            view.copy_(p.data)
