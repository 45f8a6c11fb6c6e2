"""What the parameter server's messages carry (``--wire-dtype``): float32, or a 16-bit float
(bf16, fp16) that halves the bytes of every push and of its reply.

The master copy stays float32 on the server, and so does its optimizer state: a worker rounds
its gradient to the wire dtype chunk by chunk as it sends it, the server widens each chunk back
to float32 before the update, and rounds each updated chunk for the reply, which the worker
widens into its float32 buffer. MPI has no bfloat16 datatype (and mpi4py no half float): a
16-bit payload travels as its raw 16-bit words, an int16 view of the tensor given to MPI as a
buffer, never through pickle.

What stays float32 whatever the wire: INIT's parameters, a checkpoint's (SAVE: the lead asks
for them where its last reply was a push's, rounded), and the replies to a PULL (the start, an
evaluation), so that what is evaluated and saved is the server's master copy itself; and the
same-host shared-memory window, where nothing travels on a wire (the worker reads the float32
shard in place).
"""

from __future__ import annotations

import time

import numpy as np
import torch

from ..rules.wire_dtype import torch_dtype
from .protocol import Kind, Tag

# A push whose gradient came in slower than this (bytes a second, about 1 Gbit/s) marks its
# worker's link as slow: the server then takes that worker's next gradients in the background
# (ShardWire.stage) rather than wait in a receive that holds every other worker's push.
SLOW_LINK_BYTES_PER_S = 125e6


def words(t: torch.Tensor) -> np.ndarray:
    """The buffer that MPI sends or receives for ``t``: float32 as it is, a 16-bit float as its
    raw 16-bit words."""
    return t.numpy() if t.dtype == torch.float32 else t.view(torch.int16).numpy()


class WorkerWire:
    """A worker's side: float32 travels from and into the flat buffers in place; a 16-bit wire
    keeps one 16-bit copy of each (half the model's size), rounded chunk by chunk as it is sent
    and widened chunk by chunk as it arrives."""

    def __init__(self, name: str, total: int):
        self.dtype = torch_dtype(name)
        narrow = self.dtype != torch.float32
        self.grads = torch.empty(total if narrow else 0, dtype=self.dtype)
        self.params = torch.empty(total if narrow else 0, dtype=self.dtype)
        # The reply in flight, and once it has come the last reply, is float32 (not a push's):
        # a checkpoint's model is the last reply's where it is (ParameterServerClient.state_dict)
        self.exact = True

    @property
    def exact_dtype(self) -> bool:
        return self.dtype == torch.float32

    def reply_kind(self, kind: Kind) -> None:
        """The request about to go: only a push's reply travels in the wire dtype."""
        self.exact = kind != Kind.PUSH or self.dtype == torch.float32

    def gradient(self, grads: torch.Tensor, a: int, b: int) -> np.ndarray:
        """The buffer that sends elements [a, b) of the flat gradient ``grads``."""
        if self.dtype == torch.float32:
            return grads.numpy()[a:b]
        self.grads[a:b].copy_(grads[a:b])
        return words(self.grads[a:b])

    def params_target(self, params: torch.Tensor, a: int, b: int) -> np.ndarray:
        """The buffer that receives elements [a, b) of the parameters."""
        return params.numpy()[a:b] if self.exact else words(self.params[a:b])

    def params_arrived(self, params: torch.Tensor, a: int, b: int) -> None:
        if not self.exact:
            params[a:b].copy_(self.params[a:b])


class ShardWire:
    """A server's side, for the workers that reach it by messages: the receive of a push's
    gradient chunks into a buffer of one chunk, the send of parameter chunks, and the bytes
    both put on the wire (``report``)."""

    def __init__(self, comm, name: str, params: torch.Tensor, chunks: list[tuple[int, int]],
                 pin: bool = False):
        self.comm, self.params, self.chunks = comm, params, chunks
        self.dtype = torch_dtype(name)
        self.name = name
        longest = max(b - a for a, b in chunks)
        # pin: a GPU shard (--server-device) copies the received chunk to the device from here
        self.pin = pin
        self.incoming = torch.empty(longest, dtype=self.dtype, pin_memory=pin)
        self.widened = torch.empty(longest if self.dtype != torch.float32 else 0,
                                   pin_memory=pin)
        self.outgoing = torch.empty(params.numel() if self.dtype != torch.float32 else 0,
                                    dtype=self.dtype)
        self.exact: dict[int, bool] = {}  # worker -> its reply travels in float32
        self.bytes_pushed = self.bytes_pulled = 0
        # worker -> the buffer its staged gradient arrives in (stage), and the free buffers
        self.staged: dict[int, torch.Tensor] = {}
        self._spare: list[torch.Tensor] = []
        self.slow: set[int] = set()  # workers whose last push came in below the slow rate
        self.pushes_staged = 0
        self._arriving: dict[int, list[float]] = {}  # worker -> [seconds, elements] this push

    def request(self, worker: int, kind: int) -> None:
        """A request of ``kind`` arrived from ``worker``: what its reply will carry."""
        self.exact[worker] = kind != Kind.PUSH

    def gradient(self, worker: int, a: int, b: int) -> np.ndarray:
        """Elements [a, b) of ``worker``'s gradient, in float32. One chunk at a time: posting
        the next chunks' receives ahead let them share the link with this one, which delayed
        the first updated chunk's reply and lowered a push's throughput on a throttled link
        (see docs/async.md). A worker whose link is slow sends its whole gradient into a
        buffer of its own in the background instead (stage, ps/arrivals.py)."""
        staged = self.staged.get(worker)
        if staged is not None:  # it came in the background (stage)
            received = staged[a:b]
        else:
            received = self.incoming[:b - a]
            started = time.perf_counter()
            self.comm.Recv(words(received), source=worker, tag=Tag.GRAD)
            self._timed(worker, time.perf_counter() - started, b - a, b == self.chunks[-1][1])
        self.bytes_pushed += (b - a) * self.dtype.itemsize
        if self.dtype == torch.float32:
            return received.numpy()
        self.widened[:b - a].copy_(received)
        return self.widened[:b - a].numpy()

    def _timed(self, worker: int, seconds: float, elements: int, last: bool) -> None:
        """A chunk of ``worker``'s push took ``seconds`` to come in; at the push's last chunk,
        whether its link is slow."""
        arriving = self._arriving.setdefault(worker, [0.0, 0])
        arriving[0] += seconds
        arriving[1] += elements
        if last:
            self._classify(worker, *self._arriving.pop(worker))

    def _classify(self, worker: int, seconds: float, elements: int) -> None:
        if elements * self.dtype.itemsize < SLOW_LINK_BYTES_PER_S * seconds:
            self.slow.add(worker)
        else:
            self.slow.discard(worker)

    def stages(self, worker: int) -> bool:
        """Whether ``worker``'s next gradient should come in the background: its link was slow
        at its last push."""
        return worker in self.slow and worker not in self.staged

    def stage(self, worker: int) -> list:
        """Post the receives of ``worker``'s whole gradient into a buffer of its own; returns
        them. gradient() reads it from there once they are complete, until unstage(). Buffers
        are reused: ps/arrivals.py stages one gradient at a time, so two are ever made."""
        buffer = self._spare.pop() if self._spare else \
            torch.empty(self.params.numel(), dtype=self.dtype, pin_memory=self.pin)
        self.staged[worker] = buffer
        self.pushes_staged += 1
        return [self.comm.Irecv(words(buffer[a:b]), source=worker, tag=Tag.GRAD)
                for a, b in self.chunks]

    def unstage(self, worker: int, seconds: float) -> None:
        """``worker``'s staged push was served; its gradient took ``seconds`` to come in."""
        self._spare.append(self.staged.pop(worker))
        self._classify(worker, seconds, self.params.numel())

    def send(self, worker: int, k: int):
        """Start sending chunk ``k`` of the parameters to ``worker``; returns the request."""
        a, b = self.chunks[k]
        if self.exact.get(worker, True) or self.dtype == torch.float32:
            self.bytes_pulled += (b - a) * 4
            return self.comm.Isend(self.params.numpy()[a:b], dest=worker, tag=Tag.PARAMS)
        # One reply is in flight at a time (each is completed before the next request is
        # served), so one shard-sized buffer is enough.
        self.outgoing[a:b].copy_(self.params[a:b])
        self.bytes_pulled += (b - a) * self.dtype.itemsize
        return self.comm.Isend(words(self.outgoing[a:b]), dest=worker, tag=Tag.PARAMS)

    def report(self) -> dict:
        """The bytes that pushes and replies put on the wire (none for a same-host worker)."""
        return {"wire_dtype": self.name, "wire_bytes_pushed": self.bytes_pushed,
                "wire_bytes_pulled": self.bytes_pulled, "pushes_staged": self.pushes_staged}
