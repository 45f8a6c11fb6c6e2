"""Scoring the test split: each evaluating worker scores its part with the scheme's current
weights, and the parts are summed (sync: every rank a share; async: worker 0 all of it)."""

from __future__ import annotations

from ..config import RunConfig
from ..data.batches import BatchSource
from ..scheme import UpdateScheme
from .clock import TrainingClock
from .epoch_totals import EpochTotals, means

EVAL_BATCH = 1024


class EvalCadence:
    """When a run evaluates, from its --eval-every and --eval-every-steps (the trainer's
    Evaluator; the simulator asks it too, compare/sim/)."""

    def __init__(self, run: RunConfig):
        self.run = run

    def due(self, epoch: int) -> bool:
        """Every --eval-every epochs, and always after the last."""
        return (epoch + 1) % self.run.eval_every == 0 or epoch + 1 == self.run.epochs

    def due_at_step(self, before: int, global_step: int, end_of_epoch: bool, epoch: int) -> bool:
        """Every --eval-every-steps steps (once a step from ``before`` to ``global_step``
        passed a multiple: an async worker's steps skip the others'), except where the epoch's
        own evaluation follows."""
        every = self.run.eval_every_steps
        if not every or global_step // every <= before // every:
            return False
        return not (end_of_epoch and self.due(epoch))


class Evaluator(EvalCadence):
    def __init__(self, run: RunConfig, test: BatchSource | None, scheme: UpdateScheme,
                 metric_names: list[str]):
        super().__init__(run)
        self.test = test
        self.scheme = scheme
        self.names = metric_names

    def timed(self, clock: TrainingClock, closing: bool = False):
        """(test figures, wall seconds when evaluated, training seconds by then), on ``clock``;
        ``closing``: the evaluation at an epoch's end (scheme.eval_replica).
        Inside scheme.group.evaluating(), nobody trains off that clock: waiting for a straggler
        is training time, and so is what the scheme does to bring its weights to be scored
        (scheme.eval_replica: a round of local steps cut short there is training's exchange)."""
        with self.scheme.group.evaluating():
            partition = self.scheme.group.eval_partition
            if self.test is None or partition is None:
                return clock.timed(lambda: None)  # nothing scored here
            replica = self.scheme.eval_replica(closing)  # on the training clock
            return clock.timed(lambda: self.evaluate(replica, *partition))

    def evaluate(self, replica, part: int, parts: int) -> tuple[float, dict[str, float | None]]:
        """(test loss, each metric) of ``replica`` over the whole test split, this worker
        scoring part ``part`` of ``parts``."""
        stats = replica.evaluate(self.test.eval_batches(part, parts, EVAL_BATCH))
        totals = EpochTotals(self.names)  # the training figures' sums, and their layout
        if stats is not None:
            totals.add(stats.loss_sum.item(), stats)
        values = totals.as_vector(seconds=0.0)
        if parts > 1:
            values = self.scheme.group.sum_across_workers(values)
        return means(values, self.names)
