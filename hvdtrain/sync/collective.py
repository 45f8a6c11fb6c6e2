"""Sync's update scheme over any collective port (engines/ports.py): the sync engine
(engines/sync_step.py) steps, and everything the trainer asks of the other workers (sums,
broadcasts, the stop vote, barriers: the scheme's group, collective_group.py) goes through the
same port. horovod.py adds Horovod's own optimizer wrapper on top; ``--collective torch``
runs this class over sync/torch_collective.py.

``--local-steps H`` (H > 1), local SGD and DiLoCo, is its own scheme built on this one
(local_rounds_scheme.py).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from ..config import Config
from ..engines.ports import CollectivePort
from ..engines.sync_step import ReplicaLearner, SyncStep
from ..optim import build_optimizer, set_learning_rate
from ..replica import BatchStats, Replica
from ..runtime import Runtime
from ..scheme import UpdateScheme
from .collective_group import CollectiveGroup


def to_cpu(obj: Any) -> Any:
    """``obj`` with every tensor in it on the CPU: an object broadcast from rank 0 is unpickled
    onto the device it was pickled from, which another rank's GPU index may not be."""
    if torch.is_tensor(obj):
        return obj.cpu()
    if isinstance(obj, dict):
        return {k: to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_cpu(v) for v in obj)
    return obj


class CollectiveSync(UpdateScheme):
    """The sync update scheme over ``port``: every step averages every worker's gradients.

    Constructor: ``CollectiveSync(cfg, runtime, port)``; ``port`` is the backend (HorovodPort,
    TorchCollective). A backend with an optimizer wrapper of its own overrides ``attach`` and
    builds ``self.engine`` with its learner (horovod.py)."""

    def __init__(self, cfg: Config, runtime: Runtime, port: CollectivePort):
        self.cfg = cfg
        self.runtime = runtime
        self.port = port
        self.accumulation = cfg.sync.backward_passes_per_step
        self.replica: Replica | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.engine: SyncStep | None = None  # built with the replica in attach()
        self.group = CollectiveGroup(port, cfg.sync.stall_timeout_s)
        self._waited = 0.0  # seconds the last step waited for the average (take_wait_seconds)

    @property
    def lr_scale(self) -> float:
        """How many times one worker's learning rate the combined update can take: N, as the
        update averages N workers' gradients of N times the samples."""
        return float(self.port.size)

    def attach(self, replica: Replica) -> None:
        self.replica = replica
        self.optimizer = build_optimizer(replica.parameters(), self.cfg.optim)
        self.engine = SyncStep(self.port, ReplicaLearner(replica, self.optimizer),
                               self.accumulation)

    def step(self, x: Any, y: Any, lr: float) -> BatchStats:
        assert self.engine is not None, "call attach() first"
        set_learning_rate(self.optimizer, lr)
        stats = self.engine.backward(x, y, self.gradient_scale(y))
        # A backend may average in the background as backward produces gradients (Horovod);
        # the update waits for the result, so its time is the wait for the other ranks.
        started = time.perf_counter()
        self._update()
        self._waited = time.perf_counter() - started
        return stats

    def gradient_scale(self, y: Any) -> float:
        """What this rank's mean-loss gradient of the batch with labels ``y`` is multiplied by
        before the average: 1 where every rank trains an equal share (shares.py weighs unequal
        shares)."""
        return 1.0

    def take_wait_seconds(self) -> float:
        waited, self._waited = self._waited, 0.0
        return waited

    def _update(self) -> None:
        """After the step's backward passes: average, clip the mean, step."""
        self.engine.update()

    def _share_model(self) -> None:
        """Collective: make the model the same on every rank before it is read as the model."""
        self.average_buffers()

    def _share_everything(self) -> None:
        """Collective, at checkpoints (and, for schemes that step apart, epoch ends): what every
        rank continues with. Here every rank already holds the same parameters and optimizer
        state; only the BatchNorm statistics differ."""
        self._share_model()

    def end_of_training(self) -> bool:
        self.group.finish_vote()  # the last step's vote: no rank reads it any more
        return False  # every rank trained every step: a late signal has nothing left to stop

    def eval_replica(self, closing: bool = False) -> Replica:
        self._share_model()
        return self.replica

    def average_buffers(self) -> None:
        """Each rank updates its BatchNorm running statistics from its own batches, so the
        replicas' buffers drift apart. Before every evaluation and checkpoint they are averaged,
        so that the model that is scored, saved and returned is the same on every rank.
        Collective; integer buffers (num_batches_tracked) are equal on every rank already."""
        self.port.average_([(f"buffer.{name}", buffer)
                            for name, buffer in self.replica.model.named_buffers()
                            if buffer.is_floating_point()])

    # --- checkpoints -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        self._share_everything()  # every rank saves alike
        state = {"model": self.replica.model.state_dict(), "optimizer": self.optimizer.state_dict()}
        scale = self.replica.precision.state_dict()
        return {**state, "grad_scaler": scale} if scale is not None else state

    def start(self, state: dict[str, Any] | None, resuming: bool) -> None:
        """Collective: every replica starts from rank 0's weights and buffers (BatchNorm
        statistics). On resume rank 0 passes the checkpoint's state (the others pass None) and
        its optimizer state goes to the others too."""
        if resuming:
            if state is not None:
                self.replica.model.load_state_dict(state["model"])
                self.optimizer.load_state_dict(state["optimizer"])
            self._share_optimizer_state()
            if self.replica.precision.scaler is not None:
                # fp16: every rank must unscale by the same factor, or their updates differ.
                self.replica.precision.load_state_dict(self.port.broadcast_object(
                    state.get("grad_scaler") if state is not None else None))
        # Parameters go last: a backend's optimizer-state broadcast may step the optimizer
        # (Horovod's initialises empty state with a zero-gradient step, which weight decay
        # turns into a change).
        self.port.broadcast_(list(self.replica.model.state_dict().items()))

    def _share_optimizer_state(self) -> None:
        """Collective, on resume: the other ranks take rank 0's optimizer state (momentum, Adam
        moments)."""
        shared = self.port.broadcast_object(
            to_cpu(self.optimizer.state_dict()) if self.port.rank == 0 else None)
        if self.port.rank != 0:
            self.optimizer.load_state_dict(shared)  # torch moves it to the parameters' device
