"""Asynchronous DiLoCo through the parameter server (``--mode async --local-steps H``): the worker
side. Each worker steps its own inner optimizer (--optimizer, --lr, --momentum,
--weight-decay, as sync DiLoCo's workers do); every H steps its round's pseudo-gradient goes to
the servers, which apply the outer step (--outer-lr, --outer-momentum, Nesterov;
--outer-momentum-every: Delayed Nesterov) as it arrives and send back their parameters. When the
rounds happen is engines/async_rounds.py's; this class moves the bytes (ps/client.py's link)."""

from __future__ import annotations

import copy
import statistics
import time
from typing import Any

from ..engines.async_rounds import AsyncRounds
from ..optim import LrScale, build_optimizer
from ..replica import BatchStats, Replica, ScoredWith
from ..rules.local_sgd import dynamic_local_steps, outer_step_of
from ..rules.registry import server_rules
from .client import ParameterServerClient
from .protocol import Kind


class DiLoCoClient(ParameterServerClient):
    """The async scheme with H inner steps per push. The job's batch plan still hands out one
    batch per inner step; a push lists the batches of its round, so that they count as done only
    once the server holds their progress (a checkpoint hands the others out again on resume).
    The staleness bound, --staleness-lr and --bsp/--backup-workers count pushes: outer rounds.

    Checkpoints: worker 0 pushes its round first, so the saved model holds its progress, and
    saves its inner optimizer state; each other worker saves its own beside the checkpoint
    (group.own_state, loop/own_state.py) and takes it back on resume where it belongs to the
    checkpoint resumed, else starts from worker 0's (as every worker starts from worker 0's
    BatchNorm buffers). The other workers' rounds under way at a checkpoint are not in it: their
    batches are outstanding, and trained again on resume."""

    early_copies = False  # its push is a round's difference, not a backward pass's gradient

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        sync = self.cfg.sync
        outer = outer_step_of(self.cfg)
        self.outer_lr = outer.lr  # without --outer-lr 1: each round's progress, as is
        self.lock_step = server_rules(self.cfg.ps, self.topology.num_workers).policy.lock_step
        # Once the momentum has built up, a push moves the server by this many times its
        # pseudo-gradient, Delayed Nesterov's cycle included (rules/local_sgd.py OuterStep).
        self.gain = outer.gain
        self.round_slots: list[int] = []  # the job's batches this round trained
        self.round_samples = 0
        self.rounds: AsyncRounds | None = None
        # --dynamic-local-steps: seconds between this worker's steps (its compute, data and any
        # straggler's delay; not its pushes), measured over each round
        self.dynamic = sync.dynamic_local_steps
        self._intervals: list[float] = []
        self._last_start: float | None = None
        self._pushed_s = 0.0

    @property
    def lr_scale(self) -> float:
        """The server's scale over the outer step's gain, as sync DiLoCo's inner rate
        (sync/local_rounds_scheme.py): the combined update moves at plain async's rate."""
        return LrScale(super().lr_scale, self.gain)

    def attach(self, replica: Replica) -> None:
        super().attach(replica)
        self.optimizer = build_optimizer(self.trained, self.cfg.optim)  # the inner optimizer
        self.group.own_state = InnerOptimizerState(self.optimizer)
        self.rounds = AsyncRounds(
            self, self.cfg.sync.local_steps, weights=lambda: self.copies.device_params,
            push_buffer=lambda: self.copies.gradient_target(self.link.grads_flat))

    def start(self, state: dict[str, Any] | None, resuming: bool) -> None:
        super().start(state, resuming)  # pulls: the live weights are the server's
        inner = self.worker_comm.bcast(state.get("inner_optimizer") if state else None, root=0)
        if inner is not None and not self.group.own_state.loaded:  # else its own, from restore
            self.optimizer.load_state_dict(inner)
        self.rounds.start()

    # --- the hot path --------------------------------------------------------------------------
    def step(self, x: Any, y: Any, lr: float) -> BatchStats:
        for p in self.trained:
            p.grad = None
        self._time_step()
        # A push outside a step (an epoch's closing evaluation, a checkpoint) is no step's
        # wait: taken by this step, it made its compute (its time less the wait) negative.
        self._waited = 0.0
        if self.feed is not None:
            self.round_slots.append(self.feed.queue.current())
        stats = self.replica.forward_backward(x, y, grad_scale=1.0)
        self.round_samples += stats.count
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.replica.update(self.optimizer)  # unscale, clip, step (or skip an fp16 overflow)
        self.flat.copy_in()  # parameters outside the flat buffer: into it
        if not self.rounds.stepped() and self.stops.wants:
            self.rounds.share_model()  # a stop signal rides on a push: send it now
        self.stops.after_push()  # a STOP may arrive between pushes: look every step
        self._regroup()
        return stats

    def _time_step(self) -> None:
        now = time.perf_counter()
        if self._last_start is not None:
            self._intervals.append(now - self._last_start - self._pushed_s)
        self._last_start, self._pushed_s = now, 0.0

    def push_round(self, steps: int) -> None:
        """AsyncRounds' port: push the pseudo-gradient of ``steps`` inner steps, listing the
        round's batches (and this worker's step time); the reply's parameters become the live
        weights."""
        self.copies.gradients_to_host(self.link.chunks)
        started = time.perf_counter()
        self.clock += 1
        slots, self.round_slots = self.round_slots, []
        header = {"clock": self.clock, "lr": self.outer_lr, "size": self.round_samples,
                  "wants_stop": self.stops.wants}
        # the median: an evaluation or a checkpoint between two steps is no measure of speed
        own_s = statistics.median(self._intervals) if self._intervals else 0.0
        self._intervals.clear()
        fastest_us = self.link.exchange(Kind.PUSH, header, True, True,
                                        self.feed.queue if self.feed else None, slots=slots,
                                        step_us=int(own_s * 1e6))
        self.round_samples = 0
        self.flat.copy_out()
        self._pushed_s = time.perf_counter() - started
        self._waited += self._pushed_s
        self.pauses.after_reply()
        if self.dynamic:
            self.rounds.local_steps = dynamic_local_steps(self.cfg.sync.local_steps, own_s,
                                                          fastest_us / 1e6)

    # --- where the model is read ---------------------------------------------------------------
    def eval_replica(self, closing: bool = False) -> Replica:
        """Inside a round (not at an epoch's end, ``closing``, whose checkpoint pushes it
        anyway), the server's parameters of this worker's last reply, the round's start: scored
        with nothing sent, and the round goes on untouched, as sync DiLoCo's evaluations do
        (sync/local_rounds_scheme.py). Ending worker 0's round at each evaluation cut its
        rounds to a few steps (evaluations count every worker's steps), each push crossing the
        link: the lab's worker 0 pushed 10 times to worker 1's 5 at H = 16. At a round's
        start the live weights are that reply's: scored as they are. Under lock-step rounds
        (--bsp) the others end their rounds where worker 0 evaluates, not knowing whether it
        closes an epoch (model_read_by_worker_0), so worker 0 ends its round too: it pushes
        its round and scores the server's model, as at an epoch's end."""
        if closing or self.lock_step:
            self.rounds.refresh()
            return self.replica
        start = self.rounds.model_to_score()
        if start is None:
            return self.replica
        return ScoredWith(self.replica, [self.copies.device_params], [start],
                          refresh=self.flat.copy_out)

    def model_read_by_worker_0(self) -> None:
        """Worker 0 ends its round early where it reads the model. Under lock-step rounds
        (--bsp) a round pairs every worker's push of the same number, so every worker ends its
        round there too: otherwise worker 0 makes more rounds than the others, and its last
        push waits for a round that they, done, never join."""
        if self.lock_step:
            self.rounds.share_model()

    def end_of_training(self) -> bool:
        self.rounds.share_model()  # the last round may be shorter than H steps
        return super().end_of_training()

    def state_dict(self) -> dict[str, Any]:
        if not self.is_main:
            self.model_read_by_worker_0()
            return {}
        self.rounds.share_model()
        state = super().state_dict()  # the model: the reply to the round just pushed
        self.rounds.start()
        return {**state, **self.group.own_state.state_dict()}

    def take_epoch_metrics(self) -> dict:
        return {**super().take_epoch_metrics(), "outer_rounds": self.rounds.take_epoch_rounds(),
                **({"local_steps": self.rounds.local_steps} if self.dynamic else {})}

    def close(self) -> dict[str, Any] | None:
        stats = super().close()
        if stats is not None:
            stats = {**stats, "local_steps": self.cfg.sync.local_steps,
                     "outer_rounds_worker0": self.rounds.rounds_total,
                     **({"local_steps_worker0": self.rounds.local_steps}
                        if self.dynamic else {})}
        return stats


class InnerOptimizerState:
    """A worker's inner optimizer state: worker 0's goes into the checkpoint, each other
    worker's beside it (scheme.Group.own_state), under the same key."""

    name = "inner optimizer state"

    def __init__(self, optimizer):
        self.optimizer = optimizer
        self.loaded = False  # from this worker's own file on resume: start() keeps it

    def state_dict(self) -> dict[str, Any]:
        # A copy: torch hands out the live buffers, which the next steps change.
        return {"inner_optimizer": copy.deepcopy(self.optimizer.state_dict())}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["inner_optimizer"])
        self.loaded = True
