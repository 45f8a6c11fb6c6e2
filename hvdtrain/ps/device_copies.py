"""How an async worker's weights and gradients move between the device it computes on and the
host buffers that the parameter-server messages use.

The client (client.py) is one piece of code for CPUs and GPUs; it calls the methods below at
fixed points of a step, and only what they do differs:

- :class:`HostCopies` (a CPU worker): the model's float32 weights are views into the host buffer
  that replies are received into, and gradients are gathered straight into the host gradient
  buffer, so every method is a no-op.
- :class:`StagedCopies` (a GPU worker): the weights are views into a flat buffer on the device,
  the host buffers are pinned, and every chunk the messages carry is copied on its own with a
  non-blocking copy on a side stream: chunk i of the gradient goes to the host while chunk i-1
  is already on the wire, and chunk i of the fresh parameters goes to the device while chunk
  i+1 is still arriving (or, on a server's host, while the server updates it). The two
  directions use two streams, as the bus carries both at once. A plain async step's gradient
  chunks start for the host during backward, as soon as each is complete (early_gradients.py).

Between a worker and a server on the same host the gradient goes into the MPI shared-memory
window, and the fresh parameters come out of the server's segment of it. A GPU worker registers
the window's pages with CUDA (host_pinning.py), so both are DMA on the copy streams: the gradient
is copied straight into the window and each parameter chunk straight out of it to the device,
with no copy by the CPU in between. Were the registration refused, the same copies run from
pageable memory (CUDA stages them itself, and they end before the call returns).
"""

from __future__ import annotations

import time

import numpy as np
import torch

from .early_gradients import EarlyGradients
from .host_pinning import HostPinning


class HostCopies:
    """A CPU worker: the host buffers are the model's own, nothing moves."""

    def __init__(self, total: int):
        self.host_params = torch.empty(total, dtype=torch.float32)
        self.device_params = self.host_params

    def new_host_gradients(self, total: int) -> torch.Tensor:
        return torch.zeros(total, dtype=torch.float32)

    def gradient_target(self, host_gradients: torch.Tensor) -> torch.Tensor:
        """Where the parameters' .grad are gathered: the host buffer itself."""
        return host_gradients

    def early_gradients(self, trained: list, views: list[torch.Tensor],
                        chunks: list[tuple[int, int]]):
        """Hooks that start each chunk's copy to the host during backward
        (early_gradients.py); None: a CPU worker has nothing to copy."""
        return None

    def gradients_to_host(self, chunks: list[tuple[int, int]]) -> None:
        """Start moving the gathered gradient into the host buffer, chunk by chunk."""

    def wait_gradient(self, index: int) -> None:
        """Return once chunk ``index`` of the gradient is in the host buffer."""

    def before_parameters(self) -> None:
        """Before replies are received into the host buffer: the previous copies out of it are
        done, and the device's queued work no longer reads the weights about to change."""

    def parameters_to_device(self, a: int, b: int) -> None:
        """Elements [a, b) of the host parameters arrived: start moving them to the device."""

    def parameters_from_window(self, chunk: np.ndarray, a: int, b: int) -> None:
        """Elements [a, b) of the parameters are ``chunk``, in a same-host server's segment of
        the shared window: into the weights (a CPU worker's are the host buffer itself)."""
        self.host_params.numpy()[a:b] = chunk

    def pin_window(self, segments: list[np.ndarray]) -> None:
        """The window's segments this worker copies to and from its device."""

    def release(self) -> None:
        """Before the window is freed."""

    def parameters_done(self) -> None:
        """The next kernel on the compute stream sees every parameter that arrived."""

    def parameters_to_host(self) -> None:
        """The device's weights into the host buffer, now (the initial weights for the servers)."""

    def take_epoch_metrics(self) -> dict:
        return {}


class StagedCopies(HostCopies):
    """A worker that computes on ``device``: pinned host buffers and chunked non-blocking copies
    (on CUDA). On a CPU device the same copies run synchronously, which the tests use to check
    the staging arithmetic on machines without a GPU."""

    def __init__(self, total: int, device: torch.device):
        self.device = device
        self.cuda = device.type == "cuda"
        self.host_params = torch.empty(total, dtype=torch.float32, pin_memory=self.cuda)
        self.device_params = torch.empty(total, dtype=torch.float32, device=device)
        self.device_grads = torch.zeros(total, dtype=torch.float32, device=device)
        self.host_grads: torch.Tensor | None = None
        if self.cuda:
            self.to_host = torch.cuda.Stream(device)
            self.to_device = torch.cuda.Stream(device)
        self._grad_events: list = []
        self._params_copied = None  # event: the last parameter copy out of the host buffer
        self._timings: list[tuple] = []  # (start, end) CUDA events of copies not yet counted
        self.copy_seconds = 0.0  # time the copies took on the bus (CUDA) or the CPU
        self.wait_seconds = 0.0  # time this process was blocked waiting for them
        self.bytes = 0
        self.pinning = HostPinning()

    def new_host_gradients(self, total: int) -> torch.Tensor:
        return torch.zeros(total, dtype=torch.float32, pin_memory=self.cuda)

    def gradient_target(self, host_gradients: torch.Tensor) -> torch.Tensor:
        self.host_grads = host_gradients
        return self.device_grads

    def _event(self):
        return torch.cuda.Event(enable_timing=True)

    def early_gradients(self, trained: list, views: list[torch.Tensor],
                        chunks: list[tuple[int, int]]) -> EarlyGradients:
        return EarlyGradients(trained, views, chunks,
                              lambda c: self._gradient_chunk(c, *chunks[c]))

    def begin_gradients(self, count: int) -> None:
        """Before a step's early copies: one event slot per chunk."""
        self._grad_events = [None] * count

    def _gradient_chunk(self, c: int, a: int, b: int) -> None:
        """Chunk ``c`` of the gathered gradient is complete: start its copy to the host, on
        the copy stream after the work that wrote it (the backward pass's stream, which is the
        current one in the hook's thread)."""
        self.bytes += 4 * (b - a)
        host, dev = self.host_grads, self.device_grads
        if not self.cuda:
            t0 = time.perf_counter()
            host[a:b].copy_(dev[a:b])
            self.copy_seconds += time.perf_counter() - t0
            return
        self.to_host.wait_stream(torch.cuda.current_stream(self.device))
        start, end = self._event(), self._event()
        with torch.cuda.stream(self.to_host):
            start.record()
            host[a:b].copy_(dev[a:b], non_blocking=True)
            end.record()
        self._timings.append((start, end))
        self._grad_events[c] = end

    def gradients_to_host(self, chunks: list[tuple[int, int]]) -> None:
        host, dev = self.host_grads, self.device_grads
        self.bytes += 4 * sum(b - a for a, b in chunks)
        if not self.cuda:
            t0 = time.perf_counter()
            for a, b in chunks:
                host[a:b].copy_(dev[a:b])
            self.copy_seconds += time.perf_counter() - t0
            return
        # The gathered gradient was written by the compute stream: copy after it.
        self.to_host.wait_stream(torch.cuda.current_stream(self.device))
        start = self._event()
        self._grad_events = []
        with torch.cuda.stream(self.to_host):
            start.record()
            for a, b in chunks:
                host[a:b].copy_(dev[a:b], non_blocking=True)
                event = torch.cuda.Event()
                event.record()
                self._grad_events.append(event)
            end = self._event()
            end.record()
        self._timings.append((start, end))

    def wait_gradient(self, index: int) -> None:
        if self.cuda:
            t0 = time.perf_counter()
            self._grad_events[index].synchronize()
            self.wait_seconds += time.perf_counter() - t0

    def before_parameters(self) -> None:
        if not self.cuda:
            return
        if self._params_copied is not None:
            self._params_copied.synchronize()  # long done in practice: a step came in between
        self._add_finished_timings()
        # Queued kernels (the last backward, an evaluation) must finish reading the weights
        # before the copies overwrite them.
        self.to_device.wait_stream(torch.cuda.current_stream(self.device))
        self._params_copied = None

    def parameters_to_device(self, a: int, b: int) -> None:
        self._to_device(self.host_params[a:b], a, b)
        self._params_copied = self._timings[-1][1] if self.cuda else None

    def parameters_from_window(self, chunk: np.ndarray, a: int, b: int) -> None:
        # Straight from the server's segment: the CPU copy into the host buffer, which took the
        # worker's thread for the whole model each step, is gone. The host buffer's chunk is
        # stale afterwards, and nothing reads it: the servers' next INIT comes from
        # parameters_to_host, and other replies are received into it afresh.
        self._to_device(torch.from_numpy(chunk), a, b)

    def _to_device(self, source: torch.Tensor, a: int, b: int) -> None:
        self.bytes += 4 * (b - a)
        if not self.cuda:
            t0 = time.perf_counter()
            self.device_params[a:b].copy_(source)
            self.copy_seconds += time.perf_counter() - t0
            return
        # Timed chunk by chunk: the chunks arrive with gaps between them, which are not copying.
        start, end = self._event(), self._event()
        with torch.cuda.stream(self.to_device):
            start.record()
            self.device_params[a:b].copy_(source, non_blocking=True)
            end.record()
        self._timings.append((start, end))

    def pin_window(self, segments: list[np.ndarray]) -> None:
        if self.cuda:
            self.pinning.pin(segments)

    def release(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)  # no copy may still read the window
        self.pinning.release()

    def parameters_done(self) -> None:
        if self.cuda:
            torch.cuda.current_stream(self.device).wait_stream(self.to_device)

    def parameters_to_host(self) -> None:
        self.host_params.copy_(self.device_params)  # blocking: the servers get these next

    def _add_finished_timings(self, wait: bool = False) -> None:
        if wait:
            torch.cuda.synchronize(self.device)
        done = [t[1].query() for t in self._timings]
        self.copy_seconds += sum(s.elapsed_time(e) for (s, e), d in zip(self._timings, done)
                                 if d) / 1000
        self._timings = [t for t, d in zip(self._timings, done) if not d]

    def take_epoch_metrics(self) -> dict:
        """Seconds the copies took and bytes they moved this epoch; then reset."""
        if self.cuda:
            self._add_finished_timings(wait=True)
        out = {"device_copy_seconds": round(self.copy_seconds, 4),
               "device_copy_wait_seconds": round(self.wait_seconds, 4),
               "device_copy_bytes": self.bytes,
               **({"device_copy_pageable_ranges": self.pinning.failed}
                  if self.pinning.failed else {})}
        self.copy_seconds = self.wait_seconds = 0.0
        self.bytes = 0
        return out


def copies_for(device: torch.device, total: int) -> HostCopies:
    return HostCopies(total) if device.type == "cpu" else StagedCopies(total, device)
