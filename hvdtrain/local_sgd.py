"""``--local-steps H`` (H > 1): local SGD (Lin et al. 2020, "Don't use large mini-batches, use
local SGD") and, with ``--outer-lr``, DiLoCo (Douillard et al. 2023). No Horovod wrapper: each
worker steps its own optimizer on its own gradients, and every H steps the workers meet in one
allreduce. What a round averages and where the workers go on from is the rule's
(rules/local_sgd.py); when rounds happen, and what else they share, is this scheme's.
"""

from __future__ import annotations

from typing import Any

import torch

from .config import Config
from .optim import build_optimizer
from .replica import Replica
from .rules.local_sgd import round_rule
from .runtime import Runtime
from .sync import HorovodSync


class LocalSGDSync(HorovodSync):
    """Local SGD: every H steps one allreduce of the parameters (with --outer-lr, of DiLoCo's
    pseudo-gradients, which an outer Nesterov step then applies) and of the float buffers
    (BatchNorm running statistics, plainly averaged under both rules).

    The inner optimizer state (momentum buffers, Adam moments) stays local between rounds, as
    Lin et al. and most implementations keep it: averaging it every round would double the
    traffic. DiLoCo keeps the same treatment (the paper keeps it local throughout; averaging it
    where the model is shared anyway costs nothing extra per round and makes resumes exact).
    Wherever something reads "the model" (an evaluation, a checkpoint, the end of training or
    of an epoch) a round is completed early, so the model is the same on every rank (DiLoCo
    takes its outer step over the inner steps so far); at epoch ends and checkpoints the inner
    optimizer state is averaged too, so a checkpoint holds the state every rank continues with.
    The outer optimizer's momentum and the round's start are the same on every rank and go into
    the checkpoint. A resume from an epoch checkpoint therefore continues exactly as an
    uninterrupted run. A checkpoint inside an epoch (--checkpoint-steps, a stop signal, a
    target reached at a step) ends no round and averages nothing: it holds every rank's own
    parameters, buffers and optimizer state (gathered to rank 0: the checkpoint is that many
    models large) and the steps into the round, as its ``local_round``, so that a resume with
    the same number of ranks continues exactly too; its ``model`` is the ranks' average, for
    whoever reads the checkpoint as a model (and for a resume with another number of ranks,
    which starts the rest of the round from it, and says so).
    """

    def __init__(self, cfg: Config, runtime: Runtime):
        super().__init__(cfg, runtime)
        self.local_steps = cfg.sync.local_steps
        self.rule = None            # built with the replica's parameters in attach()
        self._unaveraged_steps = 0  # local steps whose updates the ranks do not share yet
        self._state_apart = False   # optimizer state stepped apart since it was last averaged
        self._rounds = 0            # averaging rounds for this epoch's log line
        self._rounds_total = 0
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
        return self.rule.inner_lr_scale(super().lr_scale)

    def attach(self, replica: Replica) -> None:
        self.replica = replica
        self.optimizer = build_optimizer(replica.parameters(), self.cfg.optim)  # the worker's own
        self.rule = round_rule(self._params(), self.cfg.sync.outer_lr,
                               self.cfg.sync.outer_momentum)

    def _params(self) -> list[torch.Tensor]:
        return [p.data for p in self.replica.model.parameters()]

    def _update(self) -> None:
        """This worker's own update (loss scale and clipping act on its own gradient; under fp16
        each rank keeps its own scale), then the round's average every H steps."""
        self.replica.update(self.optimizer)
        self._unaveraged_steps += 1
        self._state_apart = True
        if self._unaveraged_steps == self.local_steps:
            self._share_model()

    def _share_model(self) -> None:
        """Collective: a round, if any local step has moved the ranks apart since the last one.
        Every rank counts the same steps, so every rank joins the same rounds."""
        if not self._unaveraged_steps:
            return
        model = self.replica.model
        params = self._params()
        sent = self.rule.sent(params)
        buffers = [(f"buffer.{name}", b) for name, b in model.named_buffers()
                   if b.is_floating_point()]
        kind = "param" if sent is params else "delta"  # DiLoCo sends pseudo-gradients
        self._average_in_place([(f"{kind}.{name}", t) for (name, _), t in
                                zip(model.named_parameters(), sent)] + buffers)
        merged = self.rule.merged(sent)
        if merged is not params:
            with torch.no_grad():
                for p, new in zip(params, merged):
                    p.copy_(new)
        self._unaveraged_steps = 0
        self._rounds += 1
        self._rounds_total += 1

    def _average_optimizer_state(self) -> None:
        """Collective: average the inner optimizer's floating-point state (momentum buffers, Adam
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

    def _share_everything(self) -> None:
        """Collective, at epoch ends and checkpoints: the model and the inner optimizer state."""
        self._share_model()
        self._average_optimizer_state()

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
        closing = int(self._unaveraged_steps > 0)
        rounds, self._rounds = self._rounds + closing, -closing
        return {"averaging_rounds": rounds}

    def close(self) -> dict[str, Any] | None:
        return {"local_steps": self.local_steps, "averaging_rounds": self._rounds_total}

    def end_of_training(self) -> bool:
        super().end_of_training()
        if not self._inside_epoch():  # a stop at a step keeps the round for its checkpoint
            self._share_everything()  # the last round may be shorter than H steps
        return False

    def _warn_of_early_rounds(self) -> None:
        """An evaluation inside a round ends it early; under DiLoCo each early round is one
        more outer momentum step, which changes training (simulated on digits: evaluations
        every 4 steps of H = 8 left DiLoCo at 0.78 test accuracy, against 0.95 every 8)."""
        every = self.cfg.run.eval_every_steps
        if self.cfg.sync.outer_lr and every and every % self.local_steps and \
                self.runtime.rank == 0:
            print(f"hvdtrain: warning: --eval-every-steps {every} is not a multiple of "
                  f"--local-steps {self.local_steps}: every evaluation inside a DiLoCo round "
                  "ends the round early with an extra outer momentum step, which slows "
                  f"training; use a multiple of {self.local_steps}", flush=True)

    # --- checkpoints -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        if self._inside_epoch() and (self._unaveraged_steps or self._state_apart):
            state = self._state_inside_round()
        else:
            state = super().state_dict()  # ends the round: the rule's start is the shared model
        outer = self.rule.state_dict()
        return {**state, "outer": outer} if outer else state

    def _state_inside_round(self) -> dict[str, Any]:
        """Collective: the checkpoint of the ranks as they stand apart (class docstring)."""
        own = {"model": self.replica.model.state_dict(), "optimizer": self.optimizer.state_dict(),
               "grad_scaler": self.replica.precision.state_dict()}
        ranks = self.hvd.allgather_object(own, name="hvdtrain.local_sgd.ranks")
        average = {k: v.detach().clone() for k, v in own["model"].items()}
        self._average_in_place([(f"checkpoint.{k}", v) for k, v in average.items()
                                if v.is_floating_point()])
        counts = {"steps": self._unaveraged_steps, "state_apart": self._state_apart,
                  "rounds": self._rounds, "rounds_total": self._rounds_total}
        state = {"model": average, "optimizer": own["optimizer"],
                 "local_round": {**counts, "ranks": ranks}}
        scale = own["grad_scaler"]
        return {**state, "grad_scaler": scale} if scale is not None else state

    def _resume_round(self, state: dict[str, Any] | None) -> None:
        """Collective, on resume: each rank takes its own part of a checkpoint written inside a
        round (rank 0 read it; the parts go out one at a time, so no rank holds them all)."""
        local = state.get("local_round") if state is not None else None
        counts = None
        if local:  # what every rank needs to know, without the ranks' parts themselves
            counts = {**{k: v for k, v in local.items() if k != "ranks"},
                      "ranks": len(local["ranks"])}
        counts = self.broadcast_object(counts)
        if counts is None:
            return
        size, rank = self.hvd.size(), self.hvd.rank()
        if counts["ranks"] != size:
            if rank == 0:
                print(f"hvdtrain: warning: the checkpoint was written inside a local SGD round "
                      f"by {counts['ranks']} ranks; this run's {size} start the rest of the "
                      "round from their average, so it does not continue exactly as the "
                      "uninterrupted run would", flush=True)
            return
        for r in range(size):
            part = self.broadcast_object(local["ranks"][r] if local else None)
            if r == rank:
                self.replica.model.load_state_dict(part["model"])
                self.optimizer.load_state_dict(part["optimizer"])
                self.replica.precision.load_state_dict(part["grad_scaler"])
        self._unaveraged_steps, self._state_apart = counts["steps"], counts["state_apart"]
        self._rounds, self._rounds_total = counts["rounds"], counts["rounds_total"]

    def start(self, state: dict[str, Any] | None, resuming: bool) -> None:
        """As sync's start; then the rule starts its first round from the shared parameters,
        and on resume takes rank 0's outer state (DiLoCo: the same on every rank when saved)."""
        super().start(state, resuming)
        self._warn_of_early_rounds()
        self.rule.restart(self._params())
        if resuming:
            outer = state.get("outer") if state is not None else None
            self.rule.load_state_dict(self.broadcast_object(outer))
            self._resume_round(state)
