"""Freed memory stays with the process, so that the next training step reuses it instead of
faulting in fresh pages.

glibc's malloc hands a block of megabytes back to the kernel when it is freed (above its mmap
threshold, or when the free space at the top of the heap passes its trim threshold; both move
at run time). A CPU training step frees and allocates blocks that size every time: gradients,
activations, Horovod's outputs. Each one handed back is faulted in again page by page on the
next step. Measured on 2 cores (scripts/bench_sync.py's MLP of 2.1M parameters, a hand
Horovod loop, np=2 under horovodrun --gloo, one core per rank, 400 steps): 1.08-1.30 million
page faults and 18.9-19.3 ms a step, against 0.21 million and 17.1-17.4 ms with the thresholds
fixed as below. DDP's loop, whose buckets live across steps, took 0.18 million.

The thresholds are fixed with glibc's own ``mallopt``: blocks up to 32 MiB (the largest mmap
threshold glibc accepts) come from the heap, and the heap gives back only what passes 1 GiB
free at its top. The process keeps its peak instead of returning to its floor between steps,
as PyTorch's caching allocator does on GPUs. A larger block is still mapped and unmapped on its
own. Not done where malloc is not glibc's, or where the user tuned it already
(``MALLOC_*_`` variables, ``GLIBC_TUNABLES``, jemalloc, tcmalloc or mimalloc in
``LD_PRELOAD``).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping

M_TRIM_THRESHOLD = -1  # glibc's <malloc.h>
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 * 1024 * 1024  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit
TRIM_THRESHOLD = 1024 * 1024 * 1024


def user_tuned_malloc(environ: Mapping[str, str]) -> bool:
    """Whether the user chose malloc's behaviour already: theirs wins."""
    return (any(name.startswith("MALLOC_") and name.endswith("_") for name in environ)
            or "glibc.malloc" in environ.get("GLIBC_TUNABLES", "")
            or any(allocator in environ.get("LD_PRELOAD", "")
                   for allocator in ("jemalloc", "tcmalloc", "mimalloc")))


def keep_freed_memory() -> bool:
    """Fix glibc's thresholds as above; whether they were set."""
    if user_tuned_malloc(os.environ):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the malloc this process runs on
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    # mallopt returns 1 on success; the mmap threshold goes first, since setting it stops
    # glibc's own adjustment of both.
    return mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and \
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
