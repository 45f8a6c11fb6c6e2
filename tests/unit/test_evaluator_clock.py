"""The evaluator's clocks (loop/evaluator.py): what a scheme does to bring its weights to be
scored (scheme.eval_replica: a round of local steps that an evaluation cuts short, training's
own exchange) runs on the training clock; only the scoring is left out of it. Charged to the evaluation, async DiLoCo's pushes at every evaluation crossed issue
43's slow link off the clock, and its time to target read a third of its wall time."""

import contextlib
import time

import torch

from hvdtrain.config import RunConfig
from hvdtrain.loop.clock import TrainingClock
from hvdtrain.loop.evaluator import Evaluator
from hvdtrain.replica import BatchStats


class Group:
    eval_partition = (0, 1)

    def evaluating(self):
        return contextlib.nullcontext()


class Replica:
    def __init__(self, seconds: float):
        self.seconds = seconds

    def evaluate(self, batches):
        time.sleep(self.seconds)  # the scoring
        return BatchStats(torch.tensor(2.0), 4)


class Scheme:
    """A scheme whose round's exchange takes ``round_s`` and whose scoring takes ``score_s``."""

    def __init__(self, round_s: float, score_s: float):
        self.group, self.round_s, self.calls = Group(), round_s, []
        self.replica = Replica(score_s)

    def eval_replica(self, closing=False):
        self.calls.append(("eval_replica", closing))
        time.sleep(self.round_s)  # the round under way ends: its push and the reply
        return self.replica


class Test:
    def eval_batches(self, part, parts, size):
        return [None]


def timed(scheme, test=Test()):
    clock = TrainingClock()
    clock.start()
    evaluator = Evaluator(RunConfig(), test, scheme, [])
    result, wall, train = evaluator.timed(clock)
    return result, wall, train, clock


def test_the_rounds_exchange_is_training_time_and_the_scoring_is_not():
    scheme = Scheme(round_s=0.3, score_s=0.3)
    (loss, _), wall, train, clock = timed(scheme)
    assert scheme.calls == [("eval_replica", False)]
    assert loss == 0.5
    # The evaluation's moment is after the round ended, and its time counts as training...
    assert 0.3 <= train <= wall < 0.45, (wall, train)
    # ...while the scoring's 0.3 s are left out of the training clock.
    assert 0.3 <= clock.eval_seconds < 0.45, clock.eval_seconds
    after_wall, after_train = clock.now()
    assert after_wall - after_train >= 0.3 and after_train < 0.45, (after_wall, after_train)


def test_no_test_split_or_no_share_of_it_cuts_no_round_short():
    scheme = Scheme(round_s=0.0, score_s=0.0)
    result, *_ = timed(scheme, test=None)
    assert result is None and scheme.calls == []
    scheme.group.eval_partition = None  # an async worker other than worker 0
    result, *_ = timed(scheme)
    assert result is None and scheme.calls == []
