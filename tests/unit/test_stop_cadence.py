"""The stop vote's cadence (loop/stop_cadence.py) and the stopping component's use of it: sync
workers vote every few steps, at global steps they all agree on, about every VOTE_EVERY_S
seconds of training; a reached target votes at once; async votes after every step."""

from __future__ import annotations

from hvdtrain.config import RunConfig
from hvdtrain.loop.clock import TrainingClock
from hvdtrain.loop.hooks import StepHook, StepResult, Straggler, acting, default_hooks
from hvdtrain.loop.stop_cadence import MOST_STEPS, StopCadence
from hvdtrain.loop.stopping import SIGNAL, TARGET, Stopping
from hvdtrain.loop.target import TargetStop

from fake_group import OwnGroup
from test_stopping import REACHED, Best, Checkpointer


def votes_at(cadence: StopCadence, steps: int, seconds_per_step: float) -> list[int]:
    """The global steps 1..steps at which it votes, with the gap a sync vote would carry."""
    voted, gaps = [], []
    for step in range(1, steps + 1):
        if cadence.due(step):
            # the vote read here carries the time between the two votes before it
            gap = (voted[-1] - voted[-2]) * seconds_per_step if len(voted) >= 2 else 0.0
            cadence.voted(step, gap)
            voted.append(step)
    return voted


def test_votes_every_step_until_a_step_is_timed_then_every_fifty_ms():
    voted = votes_at(StopCadence(every_s=0.05), 400, seconds_per_step=0.001)
    assert voted[:3] == [1, 2, 3]  # no gap known yet: every step
    gaps = {b - a for a, b in zip(voted[3:], voted[4:])}
    assert gaps == {50}  # 0.05 s / 1 ms


def test_slow_steps_vote_every_step_and_fast_ones_at_most_every_most_steps():
    slow = votes_at(StopCadence(every_s=0.05), 30, seconds_per_step=0.2)
    assert slow == list(range(1, 31))
    fast = votes_at(StopCadence(every_s=0.05), 2000, seconds_per_step=1e-5)
    assert {b - a for a, b in zip(fast[3:], fast[4:])} == {MOST_STEPS}


def test_reset_votes_at_the_next_step_again():
    cadence = StopCadence(every_s=0.05)
    votes_at(cadence, 300, seconds_per_step=0.001)
    cadence.reset()
    assert cadence.due(0) and cadence.every == 1


class Scheme(OwnGroup):
    """Two sync workers whose vote says stop once any worker wants it (read at the next vote,
    as Horovod's is); each vote carries 1 ms a step since the vote before."""

    eval_partition, steps_agree = (0, 2), True

    def __init__(self, others_stop_from=None):
        self.calls, self.others_stop_from, self.vote_gap_s = [], others_stop_from, 0.0
        self._pending = None

    def workers(self):
        return 0, 2

    def agree_to_stop(self, wants):
        step = self.step
        self.vote_gap_s = (self.calls[-1] - self.calls[-2]) * 0.001 if len(self.calls) >= 2 \
            else 0.0
        agreed = self._pending
        self.calls.append(step)
        self._pending = wants or (self.others_stop_from is not None and
                                  step >= self.others_stop_from)
        return bool(agreed)


class Signals:
    received = None


def stopping(scheme, stop_at="test_acc>=0.9"):
    run = RunConfig(epochs=4, stop_at=stop_at)
    clock = TrainingClock()
    clock.start()
    return Stopping(run, scheme, Checkpointer(), Best(),
                    TargetStop(run, ["acc"], has_test_split=True), clock, signals=Signals())


def run_steps(s: Stopping, scheme: Scheme, steps: int, evaluated_at=None):
    for step in range(1, steps + 1):
        scheme.step = step
        if step == evaluated_at:
            s.evaluated(REACHED, step)
        if s.decide_at_step(step).stop:
            return step
    return None


def test_a_signal_on_another_worker_stops_within_two_vote_intervals():
    scheme = Scheme(others_stop_from=230)
    s = stopping(scheme)
    stopped = run_steps(s, scheme, 1000)
    assert s.verdict.why == SIGNAL and s.verdict.at_step
    assert 230 < stopped <= 230 + 2 * 50
    assert len(scheme.calls) < 20  # not a vote per step


def test_a_target_that_every_worker_judged_stops_at_its_step_without_a_vote():
    """Sync: every rank scored the evaluation's sums, so all stop at the step that reached the
    target; the vote, read a vote later, stopped them a step after it, and the checkpoint held
    another model than the one that reached the target."""
    scheme = Scheme()
    s = stopping(scheme)
    assert run_steps(s, scheme, 1000, evaluated_at=120) == 120
    assert s.verdict.why == TARGET and 120 not in scheme.calls


def test_a_target_that_one_worker_judged_votes_at_once_and_stops_a_step_later():
    scheme = Scheme()
    scheme.eval_partition = None  # async: worker 0 judged alone, and tells the others
    s = stopping(scheme)
    assert run_steps(s, scheme, 1000, evaluated_at=120) == 121
    assert s.verdict.why == TARGET and 120 in scheme.calls


def test_steps_that_do_not_agree_vote_every_step():
    scheme = Scheme()
    scheme.steps_agree = False  # async: each worker's global steps skip the others'
    s = stopping(scheme)
    run_steps(s, scheme, 200)
    assert scheme.calls == list(range(1, 201))


def test_hooks_that_are_off_cost_no_call():
    assert default_hooks(RunConfig()) == []  # no --straggler: no straggler hook at all
    assert isinstance(default_hooks(RunConfig(straggler="3x"))[0], Straggler)

    class Acts(StepHook):
        def after_step(self, step: StepResult) -> None:
            pass

    binds_only, acts = StepHook(), Acts()
    assert acting([binds_only, acts]) == [acts]


def test_the_watchdogs_step_beat_is_a_count_that_reads_as_the_next_step():
    from hvdtrain.loop.watchdog import StallWatchdog

    dog = StallWatchdog(30, rank=0, size=1)
    dog.stepped(41)
    assert dog.doing_text == "in step 42" and "while in step 42" in dog.what_stalled(31)
    dog.beat("writing the stop checkpoint")
    assert "while writing the stop checkpoint" in dog.what_stalled(31)
