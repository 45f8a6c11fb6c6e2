"""An async GPU worker's gradient leaves for the host while backward still runs.

Without this, the worker gathers every parameter's gradient into the flat device buffer once
backward has ended, and only then copies the buffer to the host, chunk by chunk: the bus is idle
for the whole backward pass, and the step waits for the whole copy. Backward produces the
gradients layer by layer, last layer first, so a hook on each parameter (torch's post-accumulate
-grad hook, which runs once the parameter's gradient for this backward pass is complete) gathers
it at once, and a chunk of the flat buffer starts for the host as soon as every parameter that
overlaps it has been gathered: the copies of the last layers run on the copy stream while the
first layers' gradients are still being computed.

Only where that is exact: one backward pass per step (not a pipeline's micro-batches, whose
gradients add up over several passes), and a gradient that is pushed as backward left it (not
under fp16's loss scale or --clip-grad-norm, which change it after backward; the client does
not arm the hooks then). A parameter whose hook runs twice in one step falls back to the
ordinary gather and copy. CPU workers never get here: their gradient is gathered straight into
the host buffer (device_copies.HostCopies).
"""

from __future__ import annotations

from collections.abc import Callable

import torch


class EarlyGradients:
    """Hooks on ``trained`` that gather each gradient into its view of ``views`` (the flat
    device gradient) and call ``start_chunk(c)`` once chunk ``c`` of ``chunks`` (flat element
    ranges) holds its whole gradient."""

    def __init__(self, trained: list[torch.nn.Parameter], views: list[torch.Tensor],
                 chunks: list[tuple[int, int]], start_chunk: Callable[[int], None]):
        self.views, self.start_chunk = views, start_chunk
        self.chunks_of: list[list[int]] = []  # parameter -> the chunks it overlaps
        offset = 0
        for p in trained:
            end = offset + p.numel()
            self.chunks_of.append([c for c, (a, b) in enumerate(chunks) if a < end and offset < b])
            offset = end
        self.needs = [0] * len(chunks)  # chunk -> the parameters that overlap it
        for overlapped in self.chunks_of:
            for c in overlapped:
                self.needs[c] += 1
        self.armed = self.broken = False
        self.left: list[int] = []
        self.gathered: list[bool] = []
        self.handles = [p.register_post_accumulate_grad_hook(self._hook(i))
                        for i, p in enumerate(trained)]

    def arm(self) -> None:
        """Before the step's backward pass."""
        self.left, self.gathered = list(self.needs), [False] * len(self.views)
        self.armed, self.broken = True, False

    def _hook(self, i: int):
        def gathered(p: torch.Tensor) -> None:
            if not self.armed:
                return
            if self.gathered[i]:  # a second pass over it: its gradient is not final yet
                self.broken = True
                return
            self.views[i].copy_(p.grad)
            self._done(i)
        return gathered

    def _done(self, i: int) -> None:
        self.gathered[i] = True
        for c in self.chunks_of[i]:
            self.left[c] -= 1
            if self.left[c] == 0:
                self.start_chunk(c)

    def finish(self) -> bool:
        """After backward: zeros for the parameters that got no gradient, and the copies of the
        chunks they held back. False: the hooks saw more than one pass, and the caller gathers
        and copies the gradient the ordinary way."""
        self.armed = False
        if self.broken:
            return False
        for i, done in enumerate(self.gathered):
            if not done:
                self.views[i].zero_()
                self._done(i)
        return True
