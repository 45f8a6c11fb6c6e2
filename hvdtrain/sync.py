"""Synchronous data parallelism: Horovod's ring-allreduce behind the user's own torch optimizer.

Every line here exists because training is distributed; the arithmetic of a step lives in
replica.py and the loop in trainer.py. This is the Horovod recipe, wrapped rather than rewritten:
``hvd.DistributedOptimizer`` around the optimizer, parameters broadcast from rank 0 at the start,
and optimizer state broadcast from rank 0 after a resume.

``--local-steps H`` (H > 1), local SGD and DiLoCo, is its own scheme built on this one
(local_sgd.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Any, Callable, TypeVar

import torch

from .config import Config
from .flat_gradients import FlatGradients
from .optim import build_optimizer, set_learning_rate
from .replica import BatchStats, Replica, split_batch
from .runtime import Runtime
from .requeue import rank_started
from .scheme import Progress, UpdateScheme

T = TypeVar("T")


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


class HorovodSync(UpdateScheme):
    """The sync update scheme: every step is one allreduce of every worker's gradients."""

    def __init__(self, cfg: Config, runtime: Runtime):
        import horovod.torch as hvd

        self.hvd = hvd
        self.cfg = cfg
        self.runtime = runtime
        self.accumulation = cfg.sync.backward_passes_per_step
        self.replica: Replica | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self._stop_vote = None  # the handle of the stop vote started at the previous vote
        self._voted_at: float | None = None  # when this rank started it (time.perf_counter)
        self._waited = 0.0  # seconds the last step waited for the allreduce (take_wait_seconds)
        self._flat_gradients: FlatGradients | None = None

    @property
    def stall_timeout_s(self) -> float:
        return self.cfg.sync.stall_timeout_s

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
        if groups == 1 and compression is hvd.Compression.none and \
                op == hvd.Average and hvd.size() > 1:
            # The one group's order is the optimizer's (Horovod's _register_hooks); gradients
            # laid out in that order are allreduced where they are (flat_gradients.py). A
            # compressed gradient is a copy anyway, and Adasum has an optimizer of its own. One
            # rank reduces nothing, and zeroing and adding into the buffer cost it (0.87 of the
            # samples/s at np=1).
            self._flat_gradients = FlatGradients(
                p for group in self.optimizer.param_groups for p in group["params"])

    def step(self, x: Any, y: Any, lr: float) -> BatchStats:
        assert self.replica is not None and self.optimizer is not None, "call attach() first"
        set_learning_rate(self.optimizer, lr)
        if self._flat_gradients is not None:
            self._flat_gradients.zero()
        else:
            self.optimizer.zero_grad()
        # Gradient accumulation: k backward passes over equal slices of the batch, each scaled by
        # 1/k, add up to the gradient of the whole batch's mean loss; Horovod allreduces after the
        # k-th pass (backward_passes_per_step), so the update matches k = 1.
        scale = self.gradient_scale(y) / self.accumulation
        parts = ([self.replica.forward_backward(x, y, grad_scale=scale)] if self.accumulation == 1
                 else [self.replica.forward_backward(xs, ys, grad_scale=scale)
                       for xs, ys in zip(split_batch(x, self.accumulation),
                                         split_batch(y, self.accumulation))])
        # Horovod allreduces in the background as backward produces gradients; the optimizer
        # step waits for the results, so its time is the wait for the other ranks.
        started = time.perf_counter()
        self._update()
        self._waited = time.perf_counter() - started
        stats = parts[0]
        for part in parts[1:]:
            stats += part
        return stats

    def gradient_scale(self, y: Any) -> float:
        """What this rank's mean-loss gradient of the batch with labels ``y`` is multiplied by
        before Horovod averages it: 1 where every rank trains an equal share (balance.py
        weighs unequal shares)."""
        return 1.0

    def take_wait_seconds(self) -> float:
        waited, self._waited = self._waited, 0.0
        return waited

    def _update(self) -> None:
        """The optimizer step once the step's backward passes are done."""
        if self.replica.precision.needs_synchronized_gradients:
            # Horovod with a loss scale or clipping: wait for the averaged gradient, then unscale,
            # clip and step it without allreducing again (the order of Horovod's AMP example).
            # Every rank holds the same average, so every rank skips an overflowed step alike.
            self.optimizer.synchronize()
            with self.optimizer.skip_synchronize():
                self.replica.update(self.optimizer)
        else:
            self.optimizer.step()

    def _share_model(self) -> None:
        """Collective: make the model the same on every rank before it is read as the model."""
        self.average_buffers()

    def _share_everything(self) -> None:
        """Collective, at checkpoints (and, for schemes that step apart, epoch ends): what every
        rank continues with. Here every rank already holds the same parameters and optimizer
        state; only the BatchNorm statistics differ."""
        self._share_model()

    def agree_to_stop(self, wants: bool) -> bool:
        """Horovod: every rank's stop flag is summed in the background, started at one vote and
        read at the next, when it has long arrived; so the ranks agree on the same step without
        a blocking collective. A signal therefore stops the job one vote later. The vote also
        sums each rank's microseconds since its previous vote (integers: the sum is exact, so
        vote_gap_s is the same on every rank), which spaces the votes (loop/stop_cadence.py)."""
        hvd = self.hvd
        agreed, self.vote_gap_s = False, 0.0
        if hvd.size() == 1:
            # Alone there is no one to agree with: a vote would still pass a tensor through
            # Horovod's background thread, which DDP's np=1 loop does not pay. It stops at once.
            return wants
        now = time.perf_counter()
        if self._stop_vote is not None:
            votes = hvd.synchronize(self._stop_vote)
            agreed = int(votes[0]) > 0
            self.vote_gap_s = int(votes[1]) / 1e6 / hvd.size()
            self._stop_vote = None
        if not agreed:
            gap_us = int((now - self._voted_at) * 1e6) if self._voted_at is not None else 0
            self._stop_vote = hvd.allreduce_async(torch.tensor([int(wants), gap_us]),
                                                  op=hvd.Sum, name="hvdtrain.stop")
            self._voted_at = now
        return agreed

    def end_of_training(self) -> bool:
        if self._stop_vote is not None:  # the last step's vote: no rank reads it any more
            self.hvd.synchronize(self._stop_vote)
            self._stop_vote = None
        return False  # every rank trained every step: a late signal has nothing left to stop

    # --- collectives the trainer needs, without knowing Horovod -----------------------------
    def sum_across_workers(self, values: list[float]) -> list[float]:
        tensor = torch.tensor(values, dtype=torch.float64)
        return self.hvd.allreduce(tensor, op=self.hvd.Sum, name="hvdtrain.metrics").tolist()

    def broadcast_object(self, obj: Any) -> Any:
        return self.hvd.broadcast_object(obj, root_rank=0, name="hvdtrain.object")

    def workers(self) -> tuple[int, int]:
        return self.hvd.rank(), self.hvd.size()  # every rank also scores a share of the test split

    @contextlib.contextmanager
    def evaluating(self):
        self.hvd.barrier()  # every rank evaluates a share: see UpdateScheme.evaluating
        yield

    def eval_replica(self) -> Replica:
        self._share_model()
        return self.replica

    def average_buffers(self) -> None:
        """Each rank updates its BatchNorm running statistics from its own batches, so the
        replicas' buffers drift apart. Before every evaluation and checkpoint they are averaged,
        so that the model that is scored, saved and returned is the same on every rank.
        Collective; integer buffers (num_batches_tracked) are equal on every rank already."""
        for name, buffer in self.replica.model.named_buffers():
            if buffer.is_floating_point():
                self.hvd.allreduce_(buffer, op=self.hvd.Average, name=f"hvdtrain.buffer.{name}")

    # --- checkpoints -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        self._share_everything()  # every rank saves alike
        state = {"model": self.replica.model.state_dict(), "optimizer": self.optimizer.state_dict()}
        scale = self.replica.precision.state_dict()
        return {**state, "grad_scaler": scale} if scale is not None else state

    def start(self, state: dict[str, Any] | None, resuming: bool) -> None:
        """Collective: every replica starts from rank 0's weights and buffers (BatchNorm
        statistics). On resume rank 0 passes the checkpoint's state (the others pass None) and
        its optimizer state is broadcast too."""
        hvd = self.hvd
        if resuming:
            if state is not None:
                self.replica.model.load_state_dict(state["model"])
                self.optimizer.load_state_dict(state["optimizer"])
            # Horovod: the other ranks take rank 0's optimizer state (momentum, Adam moments).
            hvd.broadcast_optimizer_state(self.optimizer, root_rank=0)
            if self.replica.precision.scaler is not None:
                # fp16: every rank must unscale by the same factor, or their updates differ.
                self.replica.precision.load_state_dict(self.broadcast_object(
                    state.get("grad_scaler") if state is not None else None))
        # Horovod: parameters go last, because broadcast_optimizer_state initialises empty state
        # on the other ranks with a zero-gradient step, which weight decay turns into a change.
        hvd.broadcast_parameters(self.replica.model.state_dict(), root_rank=0)


class ElasticHorovodSync(HorovodSync):
    """``--elastic``: Horovod elastic training under ``horovodrun --gloo --min-np/--max-np
    --host-discovery-script``. The model, optimizer and training progress live in a
    ``hvd.elastic.TorchState`` that is committed every ``--elastic-commit-steps`` steps and at
    each epoch's end. When a worker dies, the survivors restore the last commit and go on; when
    the discovery script reports new hosts, their workers join at the next commit, receive the
    state from rank 0, and the learning rate follows the new number of workers."""

    def __init__(self, cfg: Config, runtime: Runtime):
        super().__init__(cfg, runtime)
        self.commit_every = cfg.sync.elastic_commit_steps
        self.state = None
        self.resets = 0

    def main_decides(self, decide: Callable[[], T]) -> T:
        # Workers that join later run the start-up code too, while the others are mid-training,
        # so nothing before hvd.elastic.run may be collective: each process decides (and reads
        # --resume) itself, from the shared run folder, and state.sync() broadcasts rank 0's state.
        return decide()

    def start(self, state: dict[str, Any] | None, resuming: bool) -> None:
        if state is not None:  # every process holds the checkpoint; no broadcast here
            self.replica.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.replica.precision.load_state_dict(state.get("grad_scaler"))

    def run(self, loop: Callable[[], None], progress: Progress) -> None:
        hvd = self.hvd
        self.state = hvd.elastic.TorchState(model=self.replica.model, optimizer=self.optimizer,
                                            epoch=progress.epoch, step=progress.step,
                                            global_step=progress.global_step,
                                            workers=progress.workers,
                                            grad_scaler=self.replica.precision.state_dict())
        self.state.register_reset_callbacks([self._on_reset])
        rank_started()  # as UpdateScheme.run

        @hvd.elastic.run
        def elastic_loop(state):
            # Entered at the start, and again after each reset with the state rank 0 broadcast.
            progress.epoch, progress.step = state.epoch, state.step
            progress.global_step, progress.workers = state.global_step, state.workers
            self.replica.precision.load_state_dict(state.grad_scaler)  # fp16: rank 0's scale
            loop()

        elastic_loop(self.state)

    @property
    def stall_timeout_s(self) -> float:
        return 0.0  # a stuck peer is elastic training's to handle: the survivors go on

    def _on_reset(self) -> None:
        self.resets += 1
        self._stop_vote = None  # a vote started before the reset died with the old ring
        hvd = self.hvd
        self.runtime = dataclasses.replace(self.runtime, rank=hvd.rank(), size=hvd.size(),
                                           local_rank=hvd.local_rank(),
                                           local_size=hvd.local_size())
        if self.runtime.rank == 0:
            print(f"hvdtrain: elastic reset {self.resets}: now {self.hvd.size()} worker(s); "
                  f"continuing from epoch {self.state.epoch + 1}, step {self.state.step}",
                  flush=True)

    def _commit(self, progress: Progress) -> None:
        state = self.state
        state.epoch, state.step, state.global_step = (progress.epoch, progress.step,
                                                      progress.global_step)
        state.workers = progress.workers
        state.grad_scaler = self.replica.precision.state_dict()
        state.commit()  # also where Horovod raises HostsUpdatedInterrupt for new hosts

    def step_done(self, progress: Progress) -> None:
        if progress.global_step % self.commit_every == 0:
            self._commit(progress)

    def epoch_done(self, progress: Progress) -> None:
        self._commit(progress)
