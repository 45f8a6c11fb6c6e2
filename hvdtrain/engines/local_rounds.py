"""Local SGD and DiLoCo rounds (``--local-steps H``), written once for every backend: each worker
steps its own optimizer on its own gradients, and every H steps the workers meet in a round
that averages what the rule sends (the parameters, or DiLoCo's pseudo-gradients) and the float
buffers; every worker goes on from what the rule merges (rules/local_sgd.py). The Horovod and
torch.distributed schemes (sync/) and the simulator's virtual workers (compare/sim/) run this
class; it reaches the other workers only through the port.

What it decides, besides the H-step cadence:
- a round ends early wherever the model is read (``share_model``: the end of training, an
  evaluation at an epoch's end, and under plain averaging any evaluation), so that every worker
  holds the same model; under DiLoCo an early round is one more outer step, so an evaluation
  inside an epoch scores the model agreed at the round's start instead (``RoundRule.agreed``,
  sync/local_rounds_scheme.py eval_replica) and the round goes on;
- at epoch ends and checkpoints the inner optimizer state is averaged too (``share_everything``),
  so that a checkpoint holds the state every worker continues with. The workers first agree on
  how many state tensors they hold (under fp16 a worker whose every step overflowed has none);
  if they differ, each keeps its own;
- a checkpoint inside a round (``checkpoint_inside_round``) averages nothing: it gathers every
  worker's own part and the round's counters, and ``resume_round`` hands each worker its part
  back, so that a resume with as many workers continues exactly.

Names given to the port are labels (``local_sgd.param.<name>`` and so on): Horovod matches its
operations by them, and the unit tests read them.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from ..rules.local_sgd import OuterNesterov, RoundRule, round_rule
from .ports import CollectivePort

Named = Sequence[tuple[str, torch.Tensor]]


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> list[tuple[str, torch.Tensor]]:
    """A torch optimizer's floating-point state (momentum buffers, Adam's moments), named
    ``optim.<parameter index>.<key>``, for ``LocalRounds``' ``optimizer_state``. Step counters
    stay as they are."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    return [(f"optim.{i}.{key}", value)
            for i, param in enumerate(params)
            for key, value in sorted(optimizer.state.get(param, {}).items())
            if torch.is_tensor(value) and value.is_floating_point() and key != "step"]


def rule_for_wire(params: list[torch.Tensor], outer_lr: float, outer_momentum: float,
                  wire: torch.dtype | None) -> RoundRule:
    """The round's rule (rules/local_sgd.py round_rule) for a wire of dtype ``wire`` (None:
    float32). A rounded wire carries what a round moved, never the weights themselves, whose
    small updates it would round away: plain local SGD then runs as DiLoCo at outer lr 1
    without momentum, the same average (start - mean(start - local) = mean(local))."""
    if wire is not None and not outer_lr:
        return OuterNesterov(params, 1.0, 0.0)
    return round_rule(params, outer_lr, outer_momentum)


class LocalRounds:
    """The local-SGD engine of one worker.

    ``port``: the other workers. ``rule``: the round's rule (rules/local_sgd.py round_rule,
    built on this worker's parameters). ``local_steps``: H. The three callables name this
    worker's live tensors, each call afresh: ``parameters`` (what the rule sends and merges;
    replaced in place), ``buffers`` (float buffers averaged plainly, BatchNorm statistics) and
    ``optimizer_state`` (the inner optimizer's float state, averaged at epoch ends and
    checkpoints: ``optimizer_tensors`` for a torch optimizer, a ShardOptimizer's vectors in
    the simulator). Every worker must name the same tensors in the same order. ``wire``: the
    dtype a round's average of what the rule sends travels in (--wire-dtype: rounded before
    the average, which every backend then reduces in it, so the real collectives and the
    simulator's round alike), None: as the tensors are; buffers and optimizer state travel
    as they are.

    The driver calls ``stepped()`` after each of this worker's own optimizer steps,
    ``share_model()`` wherever the model is read, ``share_everything()`` at epoch ends and
    checkpoints at an epoch's end. All of these are collective: every worker calls them at the
    same steps (every worker counts the same steps, so every worker joins the same rounds).

    Counters: ``unshared_steps`` (local steps since the last round), ``state_apart`` (whether
    the optimizer state has stepped apart since it was averaged), ``rounds`` (this epoch's
    rounds, for its log line: ``take_epoch_rounds``) and ``rounds_total``."""

    def __init__(self, port: CollectivePort, rule: RoundRule, local_steps: int,
                 parameters: Callable[[], Named], buffers: Callable[[], Named] = lambda: [],
                 optimizer_state: Callable[[], Named] = lambda: [],
                 wire: torch.dtype | None = None):
        if local_steps < 1:
            raise ValueError(f"local_steps must be 1 or more, not {local_steps}")
        if wire is not None and type(rule) is RoundRule:
            raise ValueError("a rounded wire would round the weights that plain averaging "
                             "sends; build the rule with rule_for_wire")
        self.port = port
        self.rule = rule
        self.wire = wire
        self.local_steps = local_steps
        self._parameters, self._buffers, self._optimizer_state = (parameters, buffers,
                                                                  optimizer_state)
        self.unshared_steps = 0
        self.state_apart = False
        self.rounds = 0
        self.rounds_total = 0
        self.saved_ranks: int | None = None  # workers of a resumed round (resume_round)

    @property
    def apart(self) -> bool:
        """Whether anything moved the workers apart since they last shared everything."""
        return bool(self.unshared_steps) or self.state_apart

    def start(self) -> None:
        """The workers (re)start from their current, shared parameters: the round's start."""
        self.rule.restart([t for _, t in self._parameters()])

    def stepped(self) -> None:
        """After this worker's own optimizer step: a round once H steps are unshared."""
        self.unshared_steps += 1
        self.state_apart = True
        if self.unshared_steps == self.local_steps:
            self.share_model()

    def share_model(self) -> None:
        """Collective: a round, if any local step has moved the workers apart since the last."""
        if not self.unshared_steps:
            return
        named = self._parameters()
        params = [t for _, t in named]
        sent = self.rule.sent(params)
        kind = "param" if sent is params else "delta"  # DiLoCo sends pseudo-gradients
        wired = sent if self.wire is None else [t.to(self.wire) for t in sent]
        self.port.average_([(f"local_sgd.{kind}.{name}", t)
                            for (name, _), t in zip(named, wired)] +
                           [(f"local_sgd.buffer.{name}", b) for name, b in self._buffers()])
        if wired is not sent:  # widened back: the rule merges in float32
            with torch.no_grad():
                for t, w in zip(sent, wired):
                    t.copy_(w)
        merged = self.rule.merged(sent)
        if merged is not params:
            with torch.no_grad():
                for p, new in zip(params, merged):
                    p.copy_(new)
        self.unshared_steps = 0
        self.rounds += 1
        self.rounds_total += 1

    def model_to_score(self) -> tuple[list[torch.Tensor], list[torch.Tensor]] | None:
        """Collective, where an evaluation inside an epoch reads the model: under a rule that
        keeps the parameters agreed at the round's start (DiLoCo), (live, scored): this
        worker's live parameters and float buffers, and what to score in their place, the
        agreed parameters and the buffers' average (BatchNorm statistics, averaged for the
        evaluation alone); the round goes on untouched (an early round would be one more outer
        step and one more exchange). Else (plain averaging, or no step since the last round)
        None, once the round has ended here, and the live tensors are the model."""
        agreed = self.rule.agreed()
        if agreed is None or not self.unshared_steps:
            self.share_model()
            return None
        buffers = self._buffers()
        averaged = [(f"local_sgd.eval_buffer.{name}", b.clone()) for name, b in buffers]
        if averaged:
            self.port.average_(averaged)
        return ([t for _, t in self._parameters()] + [b for _, b in buffers],
                [*agreed, *(b for _, b in averaged)])

    def share_state(self) -> None:
        """Collective: average the inner optimizer state, if it stepped apart since it was: the
        tensors every worker holds. A parameter a worker's forward never used has no state
        there yet (torch makes it at its first gradient), so a model whose branches follow
        the data held other tensors on each worker, which then waited for each other's
        averages until the stall timeout; those stay each worker's own."""
        if not self.state_apart:
            return
        tensors = self._optimizer_state()
        held = self.port.gather_object([name for name, _ in tensors], name="optim.names")
        common = set.intersection(*map(set, held))  # the same on every worker
        if common:
            self.port.average_([(f"local_sgd.{name}", t) for name, t in tensors
                                if name in common])
        self.state_apart = False

    def share_everything(self) -> None:
        """Collective, at epoch ends and checkpoints: the model, then the optimizer state."""
        self.share_model()
        self.share_state()

    def take_epoch_rounds(self) -> int:
        """This epoch's rounds, counting the one that will close it (an epoch's end shares what
        is apart, after its line is taken); then reset."""
        closing = int(self.unshared_steps > 0)
        rounds, self.rounds = self.rounds + closing, -closing
        return rounds

    # --- checkpoints ---------------------------------------------------------------------------
    def counters(self) -> dict[str, Any]:
        return {"steps": self.unshared_steps, "state_apart": self.state_apart,
                "rounds": self.rounds, "rounds_total": self.rounds_total}

    def agreed_model(self) -> dict[str, torch.Tensor] | None:
        """Inside a round, under a rule that keeps the parameters agreed at its start (DiLoCo):
        those, by name, the model its evaluations score (model_to_score); else None."""
        agreed = self.rule.agreed()
        if agreed is None or not self.unshared_steps:
            return None
        return {name: value for (name, _), value in zip(self._parameters(), agreed)}

    def checkpoint_inside_round(self, own: Any, model: Named) -> dict[str, Any]:
        """Collective: the checkpoint's ``local_round`` while the workers stand apart: the
        counters and every worker's ``own`` part (whatever the driver needs to take its place
        back: model, optimizer state, loss scale), in rank order. ``model`` (copies of this
        worker's model tensors) is averaged in place, for the checkpoint's shared model."""
        ranks = self.port.gather_object(own, name="local_sgd.ranks")
        self.port.average_([(f"local_sgd.checkpoint.{name}", t) for name, t in model])
        return {**self.counters(), "ranks": ranks}

    def resume_round(self, local: dict[str, Any] | None) -> Any | None:
        """Collective, on resume: ``local`` is the checkpoint's ``local_round`` on worker 0
        (None elsewhere, or where it has none). Returns this worker's own part and takes the
        round's counters; None where there is no round, or where it was written by another
        number of workers (``saved_ranks`` says how many: those workers start the rest of the
        round from the shared model). The parts go out one at a time, so that no worker holds
        them all."""
        counts = None
        if local:  # what every worker needs to know, without the parts themselves
            counts = {**{k: v for k, v in local.items() if k != "ranks"},
                      "ranks": len(local["ranks"])}
        counts = self.port.broadcast_object(counts)
        self.saved_ranks = counts["ranks"] if counts is not None else None
        if counts is None or counts["ranks"] != self.port.size:
            return None
        mine = None
        for r in range(self.port.size):
            part = self.port.broadcast_object(local["ranks"][r] if local else None)
            if r == self.port.rank:
                mine = part
        self.unshared_steps, self.state_apart = counts["steps"], counts["state_apart"]
        self.rounds, self.rounds_total = counts["rounds"], counts["rounds_total"]
        return mine

    def outer_state(self) -> dict[str, Any]:
        """The rule's state for the checkpoint (DiLoCo: the round's start and outer momentum,
        the same on every worker); empty for plain local SGD."""
        return self.rule.state_dict()

    def resume_outer(self, outer: dict[str, Any] | None) -> None:
        """Collective, on resume: every worker takes worker 0's outer state (``outer``: the
        checkpoint's, on worker 0)."""
        self.rule.load_state_dict(self.port.broadcast_object(outer))
