"""rules/ssp.py and rules/clocks.py: the staleness bound's decisions, without a server."""

from __future__ import annotations

import math

from hvdtrain.rules.clocks import Versions, WorkerClocks
from hvdtrain.rules.ssp import StalenessBound


def test_a_worker_s_plus_1_ahead_is_held_and_released_when_the_slowest_catches_up():
    bound, clocks = StalenessBound(2), WorkerClocks(3)
    for clock in (1, 2):
        clocks.push(0, clock)
        assert bound.may_reply(clocks, 0)        # at most 2 ahead of workers 1 and 2 (at 0)
    clocks.push(0, 3)
    assert not bound.may_reply(clocks, 0)        # 3 = s + 1 ahead: held
    clocks.push(1, 1)
    assert bound.released(clocks, [0]) == []     # worker 2 is still at 0
    clocks.push(2, 1)
    assert bound.released(clocks, [0]) == [0]    # the slowest is at 1: 3 - 1 = 2 <= s


def test_finished_idle_and_done_workers_hold_nobody_back():
    bound, clocks = StalenessBound(0), WorkerClocks(3)
    clocks.push(0, 5)
    assert not bound.may_reply(clocks, 0)
    clocks.finished.add(1)   # its batches are used up
    clocks.idle.add(2)       # it waits for the others
    assert bound.may_reply(clocks, 0)
    clocks.push(2, 1)        # pushing again: it counts again
    assert not bound.may_reply(clocks, 0)
    clocks.done(2)
    assert bound.may_reply(clocks, 0) and clocks.is_done(2)


def test_async_never_holds_and_every_gradient_counts():
    bound, clocks = StalenessBound(math.inf), WorkerClocks(2)
    clocks.push(0, 1000)
    assert bound.may_reply(clocks, 0) and bound.lr_scale(2) == 1.0
    assert not bound.is_late(Versions(2), 0)


def test_staleness_is_updates_since_the_worker_received_the_parameters():
    versions = Versions(2)
    versions.start(4)
    versions.updated()
    versions.updated()
    assert versions.staleness(0) == 2
    versions.received(0)
    assert versions.staleness(0) == 0 and versions.staleness(1) == 2
