"""A server's shard of the flattened parameters, and the chunks it moves: gradients in, updated
parameters out, optimizer state to and from a checkpoint.

Workers on the server's host share its memory (``shared_memory.HostWindow``): the update reads
their gradient in place and they copy each updated chunk out of the shard themselves, so the
server's core spends a push on the update alone. Like the workers of Hogwild and of any
asynchronous PS, a worker copying chunk i may see it half-way through another worker's update
of it: every element is either the old or the new value. Lock-step rounds (``--bsp``) never
write while anyone reads; with ``--backup-workers`` a round may close while a worker left out of
it still copies the last parameters, but the gradient that worker computes on them is then late
by construction (the version moved on) and is dropped."""

from __future__ import annotations

import numpy as np
import torch

from ..config import Config
from ..rules.local_sgd import outer_step_of
from .protocol import Tag, chunk_bounds, chunk_elements, shard_bounds
from .host_pinning import HostPinning
from .shard_device import host_buffer, shard_optimizer_on
from .shared_memory import HostWindow
from .wire import ShardWire


class Shard:
    """``device``: where the master parameters and optimizer state live (--server-device;
    shard_device.py); ``params`` is always the host buffer that the messages carry."""

    def __init__(self, comm, cfg: Config, index: int, num_servers: int, num_workers: int,
                 total: int, copy_gradients: bool, device: torch.device | None = None):
        self.comm = comm
        self.device = device = device or torch.device("cpu")
        start, end = self.bounds = shard_bounds(total, num_servers)[index]
        # Collective with every worker on this host, which create it right after sending INIT.
        self.host = HostWindow(comm, 4 * (end - start), cfg.ps.shared_memory)
        if self.host.shares_host(comm.Get_rank()):
            self.params = torch.from_numpy(self.host.segment(comm.Get_rank()))
        else:
            self.params = host_buffer(end - start, device)
        self.shared_grads = {w: self.host.segment(w)[start:end] for w in range(num_workers)
                             if self.host.shares_host(w)}  # worker -> its gradient, this shard
        self.chunks = chunk_bounds(end - start, chunk_elements(cfg.ps.chunk_mb))
        self.ready_words = np.arange(len(self.chunks), dtype=np.int64)  # READY payloads
        # Chunk i is updated as soon as it has arrived. The update rules are elementwise, so
        # chunked application is the same arithmetic as one step over the whole shard.
        self.optimizer = shard_optimizer_on(device, self.params, self.chunks, cfg.optim,
                                            outer_step_of(cfg))
        self.grad_buffer = np.empty(max(b - a for a, b in self.chunks), dtype=np.float32)
        self.copy_gradients = copy_gradients  # the apply step rewrites them (DC-ASGD)
        self.wire = ShardWire(comm, cfg.ps.wire_dtype, self.params, self.chunks,
                              pin=device.type == "cuda")  # --wire-dtype
        self.pinning = HostPinning()  # a GPU shard's copies to and from the window: DMA
        if device.type == "cuda" and self.host.shares_host(comm.Get_rank()):
            self.pinning.pin([self.params.numpy(), *self.shared_grads.values()])

    def close(self) -> None:
        """Collective with the workers of this host (the window's)."""
        self.pinning.release()
        self.host.close()

    def gradient_chunk(self, worker: int, a: int, b: int) -> np.ndarray:
        shared = self.shared_grads.get(worker)
        if shared is None:
            return self.wire.gradient(worker, a, b)
        if self.copy_gradients:  # a correction rewrites it: work on a copy, not the worker's
            grad = self.grad_buffer[: b - a]
            grad[:] = shared[a:b]
            return grad
        return shared[a:b]

    def discard_gradient(self, worker: int) -> None:
        """A dropped gradient: take its chunks off the wire, if it travels on one."""
        if worker not in self.shared_grads:
            for a, b in self.chunks:
                self.gradient_chunk(worker, a, b)

    def send_chunk(self, worker: int, chunk: int):
        """Start handing chunk ``chunk`` of the parameters to ``worker``; returns the request."""
        if worker in self.shared_grads:  # same host: the worker copies it out of the window
            self.host.sync()
            return self.comm.Isend(self.ready_words[chunk:chunk + 1], dest=worker, tag=Tag.READY)
        return self.wire.send(worker, chunk)

    def send_all(self, MPI, worker: int) -> None:
        MPI.Request.Waitall([self.send_chunk(worker, i) for i in range(len(self.chunks))])

    def receive_params(self, source: int) -> None:
        params = self.params.numpy()
        for a, b in self.chunks:
            self.comm.Recv(params[a:b], source=source, tag=Tag.PARAMS)
        if self.device.type != "cpu":
            self.optimizer.params_received()

    # --- checkpoint state ----------------------------------------------------------------------
    def receive_state(self, source: int) -> dict:
        """On resume (INIT): the checkpoint's server state, and the optimizer state that an
        older checkpoint kept inside it, as named per-element vectors (momentum_buffer for SGD,
        exp_avg and exp_avg_sq for Adam) plus scalars, each sent chunk by chunk; a newer one
        names the files its servers wrote instead (shard_file.py). Returns the metadata."""
        meta = self.comm.recv(source=source, tag=Tag.INFO)
        vectors = {name: torch.empty_like(self.params) for name in meta["vectors"]}
        for name in meta["vectors"]:
            for a, b in self.chunks:
                self.comm.Recv(vectors[name].numpy()[a:b], source=source, tag=Tag.STATE)
        self.optimizer.load(vectors, meta["scalars"])
        return meta
