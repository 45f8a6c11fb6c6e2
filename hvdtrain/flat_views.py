"""Tensors laid out in one flat buffer, so that one message or one collective moves them all
(the async worker's parameters and gradients, torch_collective's averages, the simulator's flat
model): each tensor's piece of the buffer, in order, shaped as the tensor."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def shaped_views(flat: torch.Tensor, like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Views of consecutive pieces of the 1-D ``flat``, one per tensor of ``like``, each shaped
    as that tensor: writing a view writes the buffer. ``flat`` may be longer than they need."""
    views, offset = [], 0
    for t in like:
        views.append(flat[offset:offset + t.numel()].view_as(t))
        offset += t.numel()
    return views
