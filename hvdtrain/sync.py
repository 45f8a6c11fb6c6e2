"""Synchronous data parallelism: Horovod's ring-allreduce behind the user's own torch optimizer.

Every line here exists because training is distributed; the arithmetic of a step lives in
replica.py and the loop in trainer.py. This is the Horovod recipe, wrapped rather than rewritten:
``hvd.DistributedOptimizer`` around the optimizer, parameters broadcast from rank 0 at the start,
and optimizer state broadcast from rank 0 after a resume.

``--local-steps H`` (H > 1) is local SGD (Lin et al. 2020, "Don't use large mini-batches, use
local SGD"): no wrapper, each worker steps its own optimizer on its own gradients, and every H
steps the workers average their parameters (and BatchNorm statistics) with one allreduce.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable, TypeVar

import torch

from .config import Config
from .optim import build_optimizer, set_learning_rate
from .replica import BatchStats, Replica, split_batch
from .runtime import Runtime
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


class HorovodSync(UpdateScheme):
    """The sync update scheme: every step is one allreduce of every worker's gradients, or with
    ``--local-steps H`` one allreduce of the parameters every H steps (local SGD).

    Local SGD keeps the optimizer state (momentum buffers, Adam moments) local between averaging
    rounds, as Lin et al. and most implementations do: averaging it every round would double the
    traffic. Wherever something reads "the model" (an evaluation, a checkpoint, the end of
    training or of an epoch) a round is completed early, so the model is the same on every rank;
    at epoch ends and checkpoints the optimizer state is averaged too, so a checkpoint holds the
    state every rank continues with. A resume from an epoch checkpoint therefore continues
    exactly as an uninterrupted run; a step or preemption checkpoint ends its round early, which
    an uninterrupted run without that checkpoint does not (one extra average).
    """

    def __init__(self, cfg: Config, runtime: Runtime):
        import horovod.torch as hvd

        self.hvd = hvd
        self.cfg = cfg
        self.runtime = runtime
        self.accumulation = cfg.sync.backward_passes_per_step
        self.local_steps = cfg.sync.local_steps
        self.local_sgd = self.local_steps > 1  # 1: today's DistributedOptimizer path, untouched
        self._unaveraged_steps = 0  # local steps whose updates the ranks do not share yet
        self._state_apart = False   # optimizer state stepped apart since it was last averaged
        self._rounds = 0            # averaging rounds for this epoch's log line
        self._rounds_total = 0
        self.replica: Replica | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self._stop_vote = None  # the handle of the stop vote started at the previous step

    @property
    def stall_timeout_s(self) -> float:
        return self.cfg.sync.stall_timeout_s

    @property
    def lr_scale(self) -> float:
        """How many times one worker's learning rate the combined update can take.

        Local SGD keeps the same scale: with plain SGD, averaging the parameters after every step
        is w - lr * mean_i(g_i), exactly the averaged-gradient step of --local-steps 1 at the
        same lr; so H = 1 of the local path and the DistributedOptimizer path agree, and larger
        H only averages less often."""
        if self.cfg.sync.reduce_op == "adasum":
            # Adasum adds orthogonal gradients instead of averaging them, so it needs no scaling
            # across hosts; on GPUs with NCCL it still averages within a host (Horovod docs).
            return float(self.hvd.local_size()) if self.hvd.nccl_built() and \
                self.runtime.device.type == "cuda" else 1.0
        return float(self.hvd.size())

    def attach(self, replica: Replica) -> None:
        hvd = self.hvd
        self.replica = replica
        if self.local_sgd:
            # Local SGD: the worker's own optimizer, no allreduce per step (_average_replicas).
            self.optimizer = build_optimizer(replica.parameters(), self.cfg.optim)
            return
        compression = hvd.Compression.fp16 if self.cfg.sync.compression == "fp16" else hvd.Compression.none
        op = hvd.Adasum if self.cfg.sync.reduce_op == "adasum" else hvd.Average
        optimizer = build_optimizer(replica.parameters(), self.cfg.optim)
        # Horovod: allreduce each gradient as soon as backward produces it, overlapping
        # communication with the rest of the backward pass.
        self.optimizer = hvd.DistributedOptimizer(
            optimizer, named_parameters=replica.model.named_parameters(),
            compression=compression, op=op,
            backward_passes_per_step=self.accumulation * replica.backward_passes)

    def step(self, x: Any, y: Any, lr: float) -> BatchStats:
        assert self.replica is not None and self.optimizer is not None, "call attach() first"
        set_learning_rate(self.optimizer, lr)
        self.optimizer.zero_grad()
        # Gradient accumulation: k backward passes over equal slices of the batch, each scaled by
        # 1/k, add up to the gradient of the whole batch's mean loss; Horovod allreduces after the
        # k-th pass (backward_passes_per_step), so the update matches k = 1.
        parts = [self.replica.forward_backward(xs, ys, grad_scale=1.0 / self.accumulation)
                 for xs, ys in zip(split_batch(x, self.accumulation),
                                   split_batch(y, self.accumulation))]
        if self.local_sgd:
            self._local_step()
        elif self.replica.precision.needs_synchronized_gradients:
            # Horovod with a loss scale or clipping: wait for the averaged gradient, then unscale,
            # clip and step it without allreducing again (the order of Horovod's AMP example).
            # Every rank holds the same average, so every rank skips an overflowed step alike.
            self.optimizer.synchronize()
            with self.optimizer.skip_synchronize():
                self.replica.update(self.optimizer)
        else:
            self.optimizer.step()
        stats = parts[0]
        for part in parts[1:]:
            stats += part
        return stats

    # --- local SGD --------------------------------------------------------------------------------
    def _local_step(self) -> None:
        """This worker's own update (loss scale and clipping act on its own gradient; under fp16
        each rank keeps its own scale), then the round's average every H steps."""
        self.replica.update(self.optimizer)
        self._unaveraged_steps += 1
        self._state_apart = True
        if self._unaveraged_steps == self.local_steps:
            self._average_replicas()

    def _average_replicas(self) -> None:
        """Collective: average the parameters and floating-point buffers (BatchNorm running
        statistics) across ranks, if any local step has moved them apart since the last round.
        Every rank counts the same steps, so every rank joins the same rounds."""
        if not self._unaveraged_steps:
            return
        model = self.replica.model
        tensors = [(f"param.{name}", p.data) for name, p in model.named_parameters()]
        tensors += [(f"buffer.{name}", b) for name, b in model.named_buffers()
                    if b.is_floating_point()]
        self._average_in_place(tensors)
        self._unaveraged_steps = 0
        self._rounds += 1
        self._rounds_total += 1

    def _average_optimizer_state(self) -> None:
        """Collective: average the optimizer's floating-point state (momentum buffers, Adam
        moments), at epoch ends and checkpoints only (see the class docstring). Step counters
        stay as they are. Under fp16 a rank whose every step so far overflowed has no state yet;
        the ranks then keep theirs rather than wait on tensors that one of them lacks."""
        if not self._state_apart:
            return
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        tensors = [(f"optim.{i}.{key}", value)
                   for i, param in enumerate(params)
                   for key, value in sorted(self.optimizer.state.get(param, {}).items())
                   if torch.is_tensor(value) and value.is_floating_point() and key != "step"]
        counts = self.hvd.allgather(torch.tensor([len(tensors)]), name="hvdtrain.optim.count")
        if int(counts.min()) == int(counts.max()):
            self._average_in_place(tensors)
        self._state_apart = False

    def _average_in_place(self, tensors: list[tuple[str, torch.Tensor]]) -> None:
        # Horovod: all started before any is awaited, so tensor fusion packs them into few
        # allreduces; one tensor at a time, since a pipelined replica spans devices.
        hvd = self.hvd
        with torch.no_grad():
            handles = [hvd.allreduce_async_(t, op=hvd.Average, name=f"hvdtrain.local_sgd.{name}")
                       for name, t in tensors]
            for handle in handles:
                hvd.synchronize(handle)

    def _share_model(self) -> None:
        """Collective: make the model the same on every rank before it is read as the model."""
        if self.local_sgd:
            self._average_replicas()  # the buffers come with the parameters
        else:
            self.average_buffers()

    def _share_everything(self) -> None:
        """Collective, at epoch ends and checkpoints: the model and the optimizer state."""
        self._share_model()
        if self.local_sgd:
            self._average_optimizer_state()

    def epoch_done(self, progress: Progress) -> None:
        # Every epoch ends on a full average, whether or not it was evaluated or checkpointed
        # (those average on their own, earlier), so the result does not depend on
        # --eval-every or --checkpoint-every, and a resume from an epoch checkpoint is exact.
        if self.local_sgd:
            self._share_everything()

    def take_epoch_metrics(self) -> dict:
        if not self.local_sgd:
            return {}
        # This runs before the epoch's checkpoint; if no evaluation has averaged yet, the round
        # that closes the epoch is still ahead (epoch_done) and is counted here, in its epoch.
        closing = int(self._unaveraged_steps > 0)
        rounds, self._rounds = self._rounds + closing, -closing
        return {"averaging_rounds": rounds}

    def close(self) -> dict[str, Any] | None:
        # Horovod shuts down at interpreter exit: an explicit hvd.shutdown() can race it.
        if not self.local_sgd:
            return None
        return {"local_steps": self.local_steps, "averaging_rounds": self._rounds_total}

    def agree_to_stop(self, wants: bool) -> bool:
        """Horovod: every rank's stop flag is summed in the background, started at one step and
        read at the next, when it has long arrived; so the ranks agree on the same step without
        a blocking collective per step. A signal therefore stops the job one step later."""
        hvd = self.hvd
        agreed = False
        if self._stop_vote is not None:
            agreed = hvd.synchronize(self._stop_vote).item() > 0
            self._stop_vote = None
        if not agreed:
            self._stop_vote = hvd.allreduce_async(torch.tensor([int(wants)]), op=hvd.Sum,
                                                  name="hvdtrain.stop")
        return agreed

    def end_of_training(self) -> bool:
        if self._stop_vote is not None:  # the last step's vote: no rank reads it any more
            self.hvd.synchronize(self._stop_vote)
            self._stop_vote = None
        if self.local_sgd:  # the last round may be shorter than H steps
            self._share_everything()
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
        self._share_everything()  # local SGD: a round ends early, so every rank saves alike
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
