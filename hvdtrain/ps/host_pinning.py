"""Page-locking host memory that torch did not allocate: the MPI shared-memory window between a
server and the workers of its host (shared_memory.py).

CUDA copies pageable memory through a staging buffer of its own, at a fraction of the bus's
speed, and a "non-blocking" copy from or to pageable memory blocks the calling thread until it
ends. The window is pageable: a GPU worker's gradient went into it that way (the GPU check on an
H200 measured the async worker's copies at 5 times their bandwidth bound). Registering the
window's pages with cudaHostRegister makes it pinned memory for this process, so those copies
run as DMA on the copy streams, overlapped with the rest of the step, at the pinned rate.

A registration that fails (a driver or a container that refuses to lock the pages) leaves the
memory pageable: the copies stay correct, only slower, and ``failed`` says so in the metrics.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable, Iterable

import numpy as np

PAGE = mmap.PAGESIZE


def page_spans(arrays: Iterable[np.ndarray]) -> list[tuple[int, int]]:
    """The page-aligned address ranges [start, end) that cover ``arrays``, overlapping or
    touching ranges merged: CUDA refuses to register a page twice, and two segments of one
    window may share a page."""
    spans = sorted((a.ctypes.data // PAGE * PAGE, -(-(a.ctypes.data + a.nbytes) // PAGE) * PAGE)
                   for a in arrays if a.nbytes)
    merged: list[tuple[int, int]] = []
    for start, end in spans:
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


def _cuda_register(address: int, nbytes: int) -> bool:
    import torch

    if int(torch.cuda.cudart().cudaHostRegister(address, nbytes, 0)) == 0:
        return True
    _clear_cuda_error()
    return False


def _cuda_unregister(address: int) -> None:
    import torch

    if int(torch.cuda.cudart().cudaHostUnregister(address)) != 0:
        _clear_cuda_error()


def _clear_cuda_error() -> None:
    """A failed CUDA call stays the thread's last error until something reads it, and torch
    reads it after its next kernel launch, which would then fail the run with this error. torch
    binds no cudaGetLastError: a launch of our own reads it off (and fails, here) instead."""
    import torch

    try:
        torch.ones(1, device=torch.device("cuda", torch.cuda.current_device())).add_(1)
    except RuntimeError:
        pass


class HostPinning:
    """The ranges this process registered, to release before the window is freed (memory that
    is unmapped while registered stays locked in the driver's books)."""

    def __init__(self, register: Callable[[int, int], bool] = _cuda_register,
                 unregister: Callable[[int], None] = _cuda_unregister):
        self.register, self.unregister = register, unregister
        self.pinned: list[tuple[int, int]] = []
        self.failed = 0  # ranges left pageable

    def pin(self, arrays: Iterable[np.ndarray]) -> None:
        for start, end in page_spans(arrays):
            if any(s < end and start < e for s, e in self.pinned):
                continue  # already registered (the same window, asked again)
            if self.register(start, end - start):
                self.pinned.append((start, end))
            else:
                self.failed += 1

    def release(self) -> None:
        for start, _ in self.pinned:
            self.unregister(start)
        self.pinned = []
