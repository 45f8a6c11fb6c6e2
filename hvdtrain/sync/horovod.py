"""Sync over Horovod, the default backend: Horovod's ring-allreduce behind the user's own torch
optimizer. This is the Horovod recipe, wrapped rather than rewritten: ``hvd.DistributedOptimizer``
around the optimizer (its backward hooks start the allreduce while backward runs), parameters
broadcast from rank 0 at the start, and optimizer state broadcast from rank 0 after a resume.
The step's order (average, clip the mean, step) is the sync engine's (engines/sync_step.py);
what is Horovod's own stays here: the optimizer wrapper, the zero-copy gradient buffer
(flat_gradients.py), Adasum's scaling, SyncBatchNorm.
"""

from __future__ import annotations

import contextlib
import sys

import torch

from ..config import Config
from ..engines.sync_step import ReplicaLearner, SyncStep
from ..optim import build_optimizer
from ..replica import Replica
from ..runtime import Runtime
from .collective import CollectiveSync
from .flat_gradients import FlatGradients
from .horovod_port import HorovodPort


def to_sync_batchnorm(model: torch.nn.Module) -> torch.nn.Module:
    """--sync-batchnorm: every BatchNorm layer becomes Horovod's SyncBatchNorm (statistics over
    the global batch), keeping its parameters and running statistics."""
    import horovod.torch as hvd

    if isinstance(model, torch.nn.modules.batchnorm._BatchNorm) and \
            not isinstance(model, hvd.SyncBatchNorm):
        synced = hvd.SyncBatchNorm(model.num_features, model.eps, model.momentum, model.affine,
                                   model.track_running_stats)
        synced.load_state_dict(model.state_dict())
        synced.train(model.training)
        return synced
    for name, child in model.named_children():
        setattr(model, name, to_sync_batchnorm(child))
    return model


def gradient_groups(runtime: Runtime) -> int | None:
    """``hvd.DistributedOptimizer``'s ``groups``: one group where Horovod starts each collective
    as it is enqueued (CPU ranks, runtime.py), else Horovod's per-gradient allreduces."""
    return 1 if runtime.horovod_wakes else None


class HorovodSync(CollectiveSync):
    """The sync update scheme over Horovod: every step is one allreduce of every worker's
    gradients. ``HorovodSync(cfg, runtime)``; ``port`` only where a test stands in for
    Horovod."""

    def __init__(self, cfg: Config, runtime: Runtime, port: HorovodPort | None = None):
        port = port if port is not None else HorovodPort()
        super().__init__(cfg, runtime, port)
        self.hvd = port.hvd
        self._flat_gradients: FlatGradients | None = None

    @property
    def lr_scale(self) -> float:
        """How many times one worker's learning rate the combined update can take."""
        if self.cfg.sync.reduce_op == "adasum":
            # Adasum adds orthogonal gradients instead of averaging them, so it needs no scaling
            # across hosts; on GPUs with NCCL it still averages within a host (Horovod docs).
            return float(self.hvd.local_size()) if self.hvd.nccl_built() and \
                self.runtime.device.type == "cuda" else 1.0
        return float(self.hvd.size())

    def attach(self, replica: Replica) -> None:
        hvd = self.hvd
        self.replica = replica
        compression = hvd.Compression.fp16 if self.cfg.sync.compression == "fp16" else hvd.Compression.none
        op = hvd.Adasum if self.cfg.sync.reduce_op == "adasum" else hvd.Average
        optimizer = build_optimizer(replica.parameters(), self.cfg.optim)
        groups = gradient_groups(self.runtime)
        # Horovod: allreduce each gradient as soon as backward produces it, overlapping
        # communication with the rest of the backward pass (on GPUs). Where Horovod starts each
        # collective as it is enqueued (CPU ranks, runtime.py), one group instead: all gradients
        # in one allreduce that starts when backward ends. On CPUs the overlap bought nothing (the
        # cores compute either way), and per-gradient enqueues would each start their own.
        self.optimizer = hvd.DistributedOptimizer(
            optimizer, named_parameters=replica.model.named_parameters(),
            compression=compression, op=op,
            backward_passes_per_step=self.accumulation * replica.backward_passes,
            groups=groups)
        self.port.optimizer = self.optimizer  # average_gradients waits for its allreduce
        if groups == 1 and compression is hvd.Compression.none and \
                op == hvd.Average and hvd.size() > 1:
            # The one group's order is the optimizer's (Horovod's _register_hooks); gradients
            # laid out in that order are allreduced where they are (flat_gradients.py). A
            # compressed gradient is a copy anyway, and Adasum has an optimizer of its own. One
            # rank reduces nothing, and zeroing and adding into the buffer cost it (0.87 of the
            # samples/s at np=1).
            self._flat_gradients = FlatGradients(
                p for group in self.optimizer.param_groups for p in group["params"])
        # Once the average is in, the step must not allreduce again: skip_synchronize. Adasum's
        # optimizer refuses that context; its step is where it combines (its synchronize is a
        # no-op).
        stepping = contextlib.nullcontext if op == hvd.Adasum else self.optimizer.skip_synchronize
        zero = self._flat_gradients.zero if self._flat_gradients is not None else None
        self.engine = SyncStep(self.port, ReplicaLearner(replica, self.optimizer, zero, stepping),
                               self.accumulation)

    def _share_optimizer_state(self) -> None:
        # Horovod's own broadcast of the optimizer state (momentum, Adam moments).
        self.hvd.broadcast_optimizer_state(self.optimizer, root_rank=0)

    def close(self) -> dict | None:
        release_gradient_hooks(self.optimizer)
        return super().close()


def release_gradient_hooks(optimizer) -> None:
    """Make the hooks that Horovod's DistributedOptimizer put on every parameter's gradient do
    nothing from now on. Horovod keeps no handle to remove them, and they outlive the training:
    the model fit() returns could not be trained again, by a second fit() (two allreduces of one
    name: Horovod refused) or by hand (Horovod's count of backward passes ran out). A count that
    never runs out never starts an allreduce; the hook is then a dictionary update."""
    delays = getattr(optimizer, "_allreduce_delay", None)
    if delays is None:  # not Horovod's optimizer (a unit test's stand-in)
        return
    for p in delays:
        delays[p] = sys.maxsize
    optimizer._handles.clear()
