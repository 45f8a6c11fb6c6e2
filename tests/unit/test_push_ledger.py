"""No update is applied twice (ps/ledger.py): a real server on the fake communicator refuses a
push whose clock does not advance and every push of a worker it declared lost, answers it so
that its sender does not hang, and counts each worker's pushes; the batch plan counts a batch
pushed twice and the batches handed back from a lost worker (ps/dispatch.py)."""

import numpy as np

from fake_ps import Job, replied
from hvdtrain.ps.dispatch import NO_SLOT, BatchDispatcher, SlotPlan
from hvdtrain.ps.ledger import PushLedger
from hvdtrain.ps.protocol import WANT_PARAMS, WANT_SLOT, Kind, Tag, make_header


def _push(job, worker, clock, slot=-1, flags=WANT_PARAMS):
    job.segments[worker][:] = 1.0
    header = make_header(Kind.PUSH, clock=clock, lr=0.5, worker=worker, slot=slot,
                         flags=flags | (WANT_SLOT if slot >= 0 else 0))
    job.sent.clear()
    messages = job.handle(job.topology.server_ranks()[0], worker, header)
    return messages, [(tag, np.asarray(p).tolist()) for d, tag, p in job.sent if d == worker]


def test_the_ledger_takes_a_clock_once_and_never_from_a_finished_or_lost_worker():
    ledger = PushLedger(2)
    assert ledger.admits(0, 0, 1) and ledger.admits(1, 0, 2)
    assert not ledger.admits(2, 0, 2)  # the same push again
    assert not ledger.admits(float("inf"), 1, 7)  # lost (or done)
    assert ledger.report() == {"pushes_per_worker": [2, 0], "pushes_refused": 2,
                               "pushes_refused_per_worker": [1, 1]}


def test_a_duplicate_push_is_answered_not_applied(monkeypatch):
    job = Job(monkeypatch, workers=2, backup=0, bsp=False)
    _push(job, 0, clock=1)
    after_first = job.params()
    messages, _ = _push(job, 0, clock=1)
    assert replied(messages) == {0}  # its sender does not hang
    np.testing.assert_array_equal(job.params(), after_first)
    _push(job, 0, clock=2)
    assert not np.array_equal(job.params(), after_first)
    stats = job.servers[0].statistics()
    assert stats["updates"] == 2 and stats["pushes_applied"] == 2
    assert stats["pushes_per_worker"] == [2, 0] and stats["pushes_refused_per_worker"] == [1, 0]


def test_a_lost_workers_push_is_refused_gets_no_batch_and_is_told_it_is_lost(monkeypatch):
    job = Job(monkeypatch, workers=3, backup=0, bsp=False)
    server = job.servers[0]
    server.dispatcher = dispatcher = BatchDispatcher(SlotPlan(steps_per_epoch=2, num_parts=3,
                                                              epochs=1))
    slots = {w: dispatcher.take(w) for w in range(3)}
    for w in range(3):
        _push(job, w, clock=1, slot=slots[w])  # each hands in its batch, gets the next
    stuck = [s for s, w in dispatcher.outstanding.items() if w == 2]
    server.membership.drop(server, 2, now=0.0)  # frozen past the silence limit, say
    assert dispatcher.handed_back == len(stuck) == 1
    before = job.params()
    messages, to_2 = _push(job, 2, clock=2, slot=stuck[0])  # it wakes up and pushes
    np.testing.assert_array_equal(job.params(), before)
    assert (Tag.SLOT, [NO_SLOT]) in to_2 and (Tag.LOST, [2, 1]) in to_2
    assert replied(messages) == {2}
    assert stuck[0] in dispatcher.redo  # its batch still goes to a survivor, once
    assert dispatcher.take(0) == stuck[0]
    stats = server.statistics()
    assert stats["pushes_per_worker"] == [1, 1, 1]
    assert stats["pushes_made_per_worker"][2] == 1  # what the lost one had pushed: all taken
    assert stats["pushes_refused_per_worker"] == [0, 0, 1]
    assert stats["batches_pushed_twice"] == 0 and stats["batches_handed_back"] == 1


def test_a_batch_pushed_by_a_worker_it_was_not_handed_to_is_counted_not_completed():
    dispatcher = BatchDispatcher(SlotPlan(steps_per_epoch=2, num_parts=2, epochs=1))
    a, b = dispatcher.take(0), dispatcher.take(1)
    dispatcher.complete(a, 1)  # worker 1 never had slot a
    dispatcher.complete(a, 0)
    dispatcher.complete(a, 0)  # a again: trained twice
    dispatcher.complete(b, 1)
    stats = dispatcher.statistics()
    assert stats["batches_completed"] == 2 and stats["batches_pushed_twice"] == 2
