"""``--local-steps H`` (H > 1): local SGD (Lin et al. 2020, "Don't use large mini-batches, use
local SGD") and, with ``--outer-lr``, DiLoCo (Douillard et al. 2023), over any collective port.
No optimizer wrapper: each worker steps its own optimizer on its own gradients, and every H steps
the workers meet in one round. What a round averages and where the workers go on from is the
rule's (rules/local_sgd.py); when rounds happen, and what else they share, is the local-rounds
engine's (engines/local_rounds.py); this scheme tells the engine where the trainer stands.
"""

from __future__ import annotations

from typing import Any

from ..config import Config
from ..engines.local_rounds import LocalRounds, optimizer_tensors, rule_for_wire
from ..engines.ports import CollectivePort
from ..engines.sync_step import ReplicaLearner, SyncStep
from ..optim import LrScale, build_optimizer
from ..replica import Replica, ScoredWith
from ..rules.wire_dtype import narrow_dtype
from ..runtime import Runtime
from .collective import CollectiveSync


class LocalSGDSync(CollectiveSync):
    """Local SGD: every H steps one average of the parameters (with --outer-lr, of DiLoCo's
    pseudo-gradients, which an outer Nesterov step then applies) and of the float buffers
    (BatchNorm running statistics, plainly averaged under both rules).
    ``LocalSGDSync(cfg, runtime, port)``.

    The inner optimizer state (momentum buffers, Adam moments) stays local between rounds, as
    Lin et al. and most implementations keep it: averaging it every round would double the
    traffic. DiLoCo keeps the same treatment (the paper keeps it local throughout; averaging it
    where the model is shared anyway costs nothing extra per round and makes resumes exact).
    Wherever something reads "the model" (a checkpoint, the end of training or of an epoch, and
    under plain local SGD an evaluation) a round is completed early, so the model is the same
    on every rank (DiLoCo takes its outer step over the inner steps so far); at epoch ends and
    checkpoints the inner optimizer state is averaged too, so a checkpoint holds the state every
    rank continues with. DiLoCo's evaluation inside an epoch ends no round: it scores the model
    the ranks agreed on at the round's start (eval_replica), so that evaluations never change
    training (an early round is one more outer momentum step: simulated on digits, evaluations
    every 4 steps of H = 8 left DiLoCo at 0.78 test accuracy, against 0.95 every 8) and H is
    what --local-steps says whatever --eval-every-steps is.
    The outer optimizer's momentum and the round's start are the same on every rank and go into
    the checkpoint. A resume from an epoch checkpoint therefore continues exactly as an
    uninterrupted run. A checkpoint inside an epoch (--checkpoint-steps, a stop signal, a
    target reached at a step) ends no round and averages nothing: it holds every rank's own
    parameters, buffers and optimizer state (gathered to rank 0: the checkpoint is that many
    models large) and the steps into the round, as its ``local_round``, so that a resume with
    the same number of ranks continues exactly too; its ``model``, for whoever reads the
    checkpoint as a model, is the ranks' average (DiLoCo's: the parameters agreed at the round's
    start, which its evaluations score, with the buffers' average), and a resume with another
    number of ranks starts the rest of the round from it, and says so.
    """

    def __init__(self, cfg: Config, runtime: Runtime, port: CollectivePort):
        super().__init__(cfg, runtime, port)
        self.local_steps = cfg.sync.local_steps
        self.rule = None            # built with the replica's parameters in attach()
        self.rounds: LocalRounds | None = None  # the engine, built in attach() too
        self._position = None       # the trainer's Progress (step_done): inside an epoch or not

    @property
    def lr_scale(self) -> float:
        """Sync's N over the rule's gain. Plain local SGD keeps sync's N: with plain SGD,
        averaging the parameters after every step is w - lr * mean_i(g_i), exactly the
        averaged-gradient step of --local-steps 1 at the same lr; larger H only averages less
        often. DiLoCo's outer step multiplies a round's averaged progress by lr / (1 - m) once
        its momentum has built up (7 with the paper's 0.7 and 0.9), so its inner rate is divided
        by that, and the combined update again moves at sync's rate: at outer lr 1 and momentum
        0, where DiLoCo is plain averaging, both agree. (Unscaled, --lr 0.05 with momentum
        0.9 inner steps diverges on digits.)"""
        return LrScale(super().lr_scale, self.rule.gain)

    def attach(self, replica: Replica) -> None:
        self.replica = replica
        self.optimizer = build_optimizer(replica.parameters(), self.cfg.optim)  # the worker's own
        # the sync engine's backward passes; its update (an average of gradients) is not used
        self.engine = SyncStep(self.port, ReplicaLearner(replica, self.optimizer),
                               self.accumulation)
        model = replica.model
        wire = narrow_dtype(self.cfg.ps.wire_dtype)  # --wire-dtype: what a round averages in
        self.rule = rule_for_wire([p.data for p in model.parameters()], self.cfg.sync.outer_lr,
                                  self.cfg.sync.outer_momentum, wire)
        self.rounds = LocalRounds(
            self.port, self.rule, self.local_steps,
            parameters=lambda: [(name, p.data) for name, p in model.named_parameters()],
            buffers=lambda: [(name, b) for name, b in model.named_buffers()
                             if b.is_floating_point()],
            optimizer_state=lambda: optimizer_tensors(self.optimizer), wire=wire)

    def _update(self) -> None:
        """This worker's own update (loss scale and clipping act on its own gradient; under fp16
        each rank keeps its own scale), then the round's average every H steps."""
        self.replica.update(self.optimizer)
        self.rounds.stepped()

    def _share_model(self) -> None:
        self.rounds.share_model()

    def eval_replica(self, closing: bool = False) -> Replica:
        """Inside a DiLoCo round (not at an epoch's end, ``closing``, which ends it anyway), the
        model the ranks agreed on at its start, with their BatchNorm statistics averaged for the
        evaluation alone: scored, and the round goes on untouched (class docstring). It is up
        to H - 1 steps behind each rank's own weights. Elsewhere as sync's (plain local SGD
        keeps no agreed model: its round ends, and the average is scored)."""
        chosen = None if closing else self.rounds.model_to_score()
        if chosen is None:
            return super().eval_replica(closing)  # the round ended: the buffers' average
        live, scored = chosen
        return ScoredWith(self.replica, live, scored)

    def _share_everything(self) -> None:
        """Collective, at epoch ends and checkpoints: the model and the inner optimizer state."""
        self.rounds.share_everything()

    def step_done(self, progress) -> None:
        super().step_done(progress)
        self._position = progress  # the trainer's own object: its step is 0 at an epoch's end

    def _inside_epoch(self) -> bool:
        """Whether the loop stands inside an epoch (a step checkpoint or a stop at a step),
        where an uninterrupted run would average nothing."""
        return self._position is not None and self._position.step > 0

    def epoch_done(self, progress) -> None:
        # Every epoch ends on a full average, whether or not it was evaluated or checkpointed
        # (those average on their own, earlier), so the result does not depend on
        # --eval-every or --checkpoint-every, and a resume from an epoch checkpoint is exact.
        self._share_everything()

    def take_epoch_metrics(self) -> dict:
        # This runs before the epoch's checkpoint; if no evaluation has averaged yet, the round
        # that closes the epoch is still ahead (epoch_done) and is counted here, in its epoch.
        return {"averaging_rounds": self.rounds.take_epoch_rounds()}

    def close(self) -> dict[str, Any] | None:
        return {"local_steps": self.local_steps, "averaging_rounds": self.rounds.rounds_total}

    def end_of_training(self) -> bool:
        super().end_of_training()
        if not self._inside_epoch():  # a stop at a step keeps the round for its checkpoint
            self._share_everything()  # the last round may be shorter than H steps
        return False

    # --- checkpoints -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        if self._inside_epoch() and self.rounds.apart:
            state = self._state_inside_round()
        else:
            state = super().state_dict()  # ends the round: the rule's start is the shared model
        outer = self.rounds.outer_state()
        return {**state, "outer": outer} if outer else state

    def _state_inside_round(self) -> dict[str, Any]:
        """Collective: the checkpoint of the ranks as they stand apart (class docstring)."""
        own = {"model": self.replica.model.state_dict(), "optimizer": self.optimizer.state_dict(),
               "grad_scaler": self.replica.precision.state_dict()}
        average = {k: v.detach().clone() for k, v in own["model"].items()}
        local = self.rounds.checkpoint_inside_round(
            own, [(k, v) for k, v in average.items() if v.is_floating_point()])
        # DiLoCo: the parameters its evaluations score, so that a stop at a target reached
        # inside a round keeps the model that reached it (an average of the ranks' inner
        # steps is no model DiLoCo ever makes)
        average.update((k, v.detach().clone()) for k, v in
                       (self.rounds.agreed_model() or {}).items() if k in average)
        state = {"model": average, "optimizer": own["optimizer"], "local_round": local}
        scale = own["grad_scaler"]
        return {**state, "grad_scaler": scale} if scale is not None else state

    def _resume_round(self, state: dict[str, Any] | None) -> None:
        """Collective, on resume: each rank takes its own part of a checkpoint written inside a
        round (rank 0 read it)."""
        own = self.rounds.resume_round(state.get("local_round") if state is not None else None)
        saved, size = self.rounds.saved_ranks, self.port.size
        if saved is not None and saved != size and self.port.rank == 0:
            print(f"hvdtrain: warning: the checkpoint was written inside a local SGD round "
                  f"by {saved} ranks; this run's {size} start the rest of the "
                  "round from the checkpoint's model, so it does not continue exactly as the "
                  "uninterrupted run would", flush=True)
        if own is not None:
            self.replica.model.load_state_dict(own["model"])
            self.optimizer.load_state_dict(own["optimizer"])
            self.replica.precision.load_state_dict(own["grad_scaler"])

    def start(self, state: dict[str, Any] | None, resuming: bool) -> None:
        """As sync's start; then the rule starts its first round from the shared parameters,
        and on resume takes rank 0's outer state (DiLoCo: the same on every rank when saved)."""
        super().start(state, resuming)
        self.rounds.start()
        if resuming:
            self.rounds.resume_outer(state.get("outer") if state is not None else None)
            self._resume_round(state)
