"""``--elastic``: Horovod elastic training (horovodrun --gloo --min-np/--max-np
--host-discovery-script), Horovod's own and refused by other backends."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, TypeVar

from ..config import Config
from ..requeue import rank_started
from ..runtime import Runtime
from ..scheme import Progress
from .collective_group import CollectiveGroup
from .horovod import HorovodSync

T = TypeVar("T")


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
        self.group = ElasticGroup(self.port, cfg.sync.stall_timeout_s)

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
        rank_started(survivable=True)  # as UpdateScheme.run; a lost host's rank is survived

        @hvd.elastic.run
        def elastic_loop(state):
            # Entered at the start, and again after each reset with the state rank 0 broadcast.
            progress.epoch, progress.step = state.epoch, state.step
            progress.global_step, progress.workers = state.global_step, state.workers
            self.replica.precision.load_state_dict(state.grad_scaler)  # fp16: rank 0's scale
            loop()

        elastic_loop(self.state)

    def _on_reset(self) -> None:
        self.resets += 1
        self.group.forget_vote()
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


class ElasticGroup(CollectiveGroup):
    """Sync's group, for processes that may join mid-training."""

    def main_decides(self, decide: Callable[[], T]) -> T:
        # Workers that join later run the start-up code too, while the others are mid-training,
        # so nothing before hvd.elastic.run may be collective: each process decides (and reads
        # --resume) itself, from the shared run folder, and state.sync() broadcasts rank 0's state.
        return decide()

    @property
    def stall_timeout_s(self) -> float:
        return 0.0  # a stuck peer is elastic training's to handle: the survivors go on
