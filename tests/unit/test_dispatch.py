"""The job's batch plan under async training (ps/dispatch.py): every slot handed out once per
run, an epoch's pieces together are the sync plan's batches, and a checkpoint's position resumes
to exactly the slots not yet trained."""

import random

import numpy as np
import pytest

from hvdtrain.data.builtin import epoch_batches
from hvdtrain.data.in_memory import InMemoryBatches
from hvdtrain.loop.epoch_plan import EpochPlan
from hvdtrain.config import RunConfig
from hvdtrain.ps.dispatch import NO_SLOT, NONE_YET, BatchDispatcher, SlotPlan, SlotQueue
from hvdtrain.scheme import BatchFeed, Progress


def test_slot_numbers_cover_the_sync_plan():
    plan = SlotPlan(steps_per_epoch=5, num_parts=3, epochs=2)
    assert plan.total == 30
    assert plan.locate(0) == (0, 0, 0) and plan.locate(4) == (0, 1, 1)
    assert plan.locate(15) == (1, 0, 0) and plan.locate(29) == (1, 4, 2)
    assert plan.first_slot(1, 2) == 21


def _run(dispatcher, speeds, rng, stop_after=None):
    """Workers of the given relative speeds take and train slots until none is left (or until
    ``stop_after`` slots were trained); returns the slots trained, in order, per worker."""
    trained = {w: [] for w in range(len(speeds))}
    held = {w: dispatcher.take(w) for w in range(len(speeds))}  # one ahead, as a worker holds
    count = 0
    while any(s != NO_SLOT for s in held.values()):
        w = rng.choices(range(len(speeds)), weights=speeds)[0]
        if held[w] == NO_SLOT:
            continue
        slot = held[w]
        dispatcher.complete(slot)
        trained[w].append(slot)
        held[w] = dispatcher.take(w)
        count += 1
        if stop_after is not None and count == stop_after:
            break
    return trained


def test_fast_worker_takes_more_and_every_slot_is_trained_once():
    plan = SlotPlan(steps_per_epoch=20, num_parts=3, epochs=3)
    d = BatchDispatcher(plan)
    trained = _run(d, [1.0, 1.0, 0.25], random.Random(0))
    every = sorted(s for slots in trained.values() for s in slots)
    assert every == list(range(plan.total))
    assert len(trained[2]) < len(trained[0]) / 2  # the slow worker got far fewer
    assert d.finished and d.lowest_undone() == plan.total
    assert all(d.finished_pushing(w) for w in range(3))


def test_resume_trains_exactly_the_slots_not_yet_trained():
    plan = SlotPlan(steps_per_epoch=10, num_parts=2, epochs=4)
    rng = random.Random(1)
    first = BatchDispatcher(plan)
    before = _run(first, [1.0, 0.3], rng, stop_after=37)
    state = first.state_dict()
    assert len(state["outstanding"]) == 2  # each worker held one slot it never trained
    resumed = BatchDispatcher(plan)
    assert resumed.load_state_dict(state) is None
    after = _run(resumed, [1.0, 0.3], rng)
    slots = sorted(s for part in (before, after) for w in part for s in part[w])
    assert slots == list(range(plan.total))  # none skipped, none twice
    # the job's count: what the first attempt trained is not untrained (it said 37)
    assert resumed.statistics()["batches_untrained"] == 0


def test_resume_with_another_cut_keeps_the_epoch_position():
    old = SlotPlan(steps_per_epoch=10, num_parts=2, epochs=4)
    d = BatchDispatcher(old)
    d.next = old.first_slot(2, 6)
    new = BatchDispatcher(SlotPlan(steps_per_epoch=5, num_parts=4, epochs=4))
    note = new.load_state_dict(d.state_dict())
    assert "2 worker(s)" in note and "4" in note
    assert new.plan.locate(new.take(0)) == (2, 3, 0)  # 6 steps of 2 = 3 steps of 4


def test_resume_with_another_cut_goes_on_after_the_slots_handed_out():
    """A worker that died under plain mpirun left slot 3 (epoch 0) outstanding while the others
    trained on into epoch 3: the resume goes on from there, not from epoch 0 again."""
    old = SlotPlan(steps_per_epoch=10, num_parts=3, epochs=4)
    d = BatchDispatcher(old)
    for worker in (0, 1, 2):
        d.take(worker)
    d.next = old.first_slot(3, 4)
    for worker in (0, 1):
        d.complete(worker, worker)
    d.take(0)  # in flight at the checkpoint
    assert d.state_dict()["outstanding"] == [2, old.first_slot(3, 4)]
    new = BatchDispatcher(SlotPlan(steps_per_epoch=15, num_parts=2, epochs=4))
    note = new.load_state_dict(d.state_dict())
    assert "epoch 4 after the share" in note and "2 batch(es) outstanding" in note
    assert new.plan.locate(new.take(0)) == (3, 6, 0)  # 4 steps of 3 = 6 steps of 2


def test_a_worker_told_none_has_finished_only_after_its_last_push():
    d = BatchDispatcher(SlotPlan(steps_per_epoch=1, num_parts=2, epochs=1))
    a, b = d.take(0), d.take(0)
    assert d.take(1) == NO_SLOT and d.finished_pushing(1)
    assert d.take(0) == NO_SLOT and not d.finished_pushing(0)
    d.complete(a)
    d.complete(b)
    assert d.finished_pushing(0)


def test_queue_ends_an_epoch_at_the_next_epochs_slot():
    plan = SlotPlan(steps_per_epoch=2, num_parts=2, epochs=2)
    q = SlotQueue(plan)
    for slot in (3, 4):
        q.receive(slot)
    assert q.next_of_epoch(0) == (0, 1, 1)
    assert q.next_of_epoch(0) is None  # slot 4 is epoch 1's
    assert q.current() == 3 and q.trained() == (0, 1, 1) and q.current() == NO_SLOT
    assert q.next_of_epoch(1) == (1, 0, 0)
    q.receive(NO_SLOT)
    assert q.exhausted and q.next_of_epoch(1) is None


class _ListFeed(BatchFeed):
    def __init__(self, plan, slots):
        self.queue, self.num_parts = SlotQueue(plan), plan.num_parts
        for s in slots:
            self.queue.receive(s)

    def next_part(self, epoch):
        return self.queue.next_of_epoch(epoch)

    def part_trained(self):
        return self.queue.trained()


def test_pieces_are_the_sync_plans_batches_and_progress_is_the_jobs():
    x = np.arange(40, dtype=np.float32).reshape(40, 1)
    source = InMemoryBatches(__import__("torch").from_numpy(x),
                             __import__("torch").arange(40))
    run = RunConfig(batch_size=4, epochs=1, seed=3)
    plan = EpochPlan(run, source)
    plan.bind_world(0, 2)
    assert plan.steps_per_epoch == 5
    slots = SlotPlan(5, 2, 1)
    plan.use_feed(_ListFeed(slots, [1, 4, 7]))
    p = Progress()
    got = []
    for _, y in plan.batches(p):
        got.append(y.tolist())
        plan.advance(p)
        got.append((p.step, p.global_step))
    rows = [epoch_batches(40, 4, w, 2, 0, 3) for w in range(2)]
    assert got == [rows[1][0].tolist(), (1, 1), rows[0][2].tolist(), (3, 3),
                   rows[1][3].tolist(), (4, 4)]
    plan.finish_epoch(p)  # another worker trained step 5's pieces: the epoch's end all the same
    assert (p.epoch, p.step, p.global_step) == (1, 0, 5)


@pytest.mark.parametrize("before,after,due", [(3, 4, True), (4, 5, False), (2, 6, True),
                                              (4, 7, False), (7, 8, True)])
def test_step_cadence_counts_multiples_passed(before, after, due):
    from hvdtrain.loop.evaluator import Evaluator

    ev = Evaluator(RunConfig(eval_every_steps=4, epochs=10), None, None, [])
    assert ev.due_at_step(before, after, False, 0) is due


# --- under recovery: a lost worker's slots come back after the others ran out (slot_waiters.py)
def _ran_out(recovery=True, epochs=1):
    """A plan of 4 slots, all handed out: worker 0 holds 0 and 1 (1 read ahead), worker 1 holds
    2, worker 2 holds 3."""
    d = BatchDispatcher(SlotPlan(steps_per_epoch=2, num_parts=2, epochs=epochs), recovery)
    for w in (0, 0, 1, 2):
        d.take(w)
    return d


def test_a_request_waits_while_another_live_worker_holds_a_slot():
    d = _ran_out()
    d.complete(2, 1)
    assert d.take(1) == NONE_YET  # the push path: nothing now, and nothing is held
    assert d.ask(1, 2, epoch=0) is None and d.waiting == {1: 2}  # held: 0 and 2 hold slots
    assert d.answers() == [] and 1 not in d.told_none
    d.complete(3, 2)
    assert d.take(2) == NONE_YET and d.answers() == []  # worker 0 still holds 0 and 1


def test_no_slot_when_only_waiters_hold_slots():
    """The deadlock case: a waiter cannot push the batches it read ahead until it is answered,
    so a waiter that counted on another waiter's slots would wait forever."""
    d = _ran_out()
    assert d.ask(0, 1, epoch=0) is None  # worker 0 waits, holding 0 and 1 (read ahead)
    d.complete(2, 1)
    assert d.take(1) == NONE_YET and d.ask(1, 1, epoch=0) is None  # worker 2 holds slot 3
    assert d.answers() == []
    d.complete(3, 2)
    assert d.take(2) == NO_SLOT  # only waiters hold slots: nothing to wait for
    # Worker 0 is told first: its own slots and worker 1's wait do not count. Once told, it
    # trains 0 and 1 again, which may still come back, so worker 1 waits for them.
    assert d.answers() == [(0, [NO_SLOT])] and d.waiting == {1: 1}
    d.complete(0, 0)
    d.complete(1, 0)
    assert d.take(0) == NO_SLOT and d.answers() == [(1, [NO_SLOT])]
    assert d.finished and all(d.finished_pushing(w) for w in range(3))


def test_a_worker_holding_only_its_own_slots_is_not_held():
    d = _ran_out()
    d.complete(2, 1)
    d.complete(3, 2)
    assert d.ask(0, 1, epoch=0) == [NO_SLOT]  # it trains its read-ahead 0 and 1, and ends
    assert not d.waiting and not d.finished_pushing(0)


def test_a_lost_workers_slot_goes_to_a_waiter():
    d = _ran_out()
    for slot, w in ((0, 0), (1, 0), (2, 1)):
        d.complete(slot, w)
    assert d.ask(0, 2, epoch=0) is None and d.ask(1, 1, epoch=0) is None  # 2 is silent
    d.give_back(2)  # worker 2 is lost, holding slot 3
    # the first waiter; nothing else can come back for it (1 only waits): it ends after slot 3
    assert d.answers() == [(0, [3, NO_SLOT])]
    assert d.waiting == {1: 1} and d.answers() == []  # 1 waits on: 0 may die too
    d.complete(3, 0)
    assert d.take(0) == NO_SLOT  # its push: only a waiter is left, nothing can come back
    assert d.answers() == [(1, [NO_SLOT])]
    assert d.finished and d.statistics()["batches_untrained"] == 0
    assert d.statistics()["batches_handed_back"] == 1
    # each batch counted once, for the worker that trained it: the per-worker counts add up
    per_worker = d.statistics()["batches_per_worker"]
    assert sum(per_worker.values()) == d.statistics()["batches_completed"], per_worker


def test_a_waiter_lost_itself_is_no_longer_waited_on_nor_answered():
    d = _ran_out()
    d.complete(2, 1)
    d.complete(3, 2)
    assert d.ask(1, 1, epoch=0) is None
    d.give_back(1)
    assert not d.waiting and d.answers() == []


def test_without_recovery_running_out_is_no_slot_at_once():
    d = _ran_out(recovery=False)
    d.complete(2, 1)
    assert d.take(1) == NO_SLOT
    assert d.ask(2, 2, epoch=0) == [NO_SLOT, NO_SLOT] and not d.waiting


def test_the_push_path_never_holds():
    d = _ran_out()
    d.complete(2, 1)
    for _ in range(3):
        assert d.take(1) == NONE_YET  # as often as it pushes: never held, never exhausted
    assert not d.waiting and 1 not in d.told_none
    q = SlotQueue(d.plan)
    q.receive(NONE_YET)
    assert not q.queued and not q.exhausted  # it asks again once its queue is empty


def test_a_request_before_the_last_epoch_is_answered_none_yet_at_once():
    """A worker behind the others' epoch is not held: the epoch ends for it (its queue stays
    empty), so it reaches the epoch ends' collectives that a slot's holder may wait in."""
    d = _ran_out(epochs=2)
    while d.next < d.plan.total:
        d.take(0)
    d.complete(2, 1)
    assert d.ask(1, 2, epoch=0) == [NONE_YET, NONE_YET] and not d.waiting
    assert d.ask(1, 2, epoch=1) is None and d.waiting == {1: 2}


def test_the_stop_and_a_done_worker_end_the_wait():
    d = _ran_out()
    d.complete(2, 1)
    assert d.ask(1, 1, epoch=0) is None
    d.closed.add(2)  # worker 2 sent DONE holding slot 3 (it stopped): it never pushes it
    assert d.answers() == []  # worker 0 still holds slots
    d.stopped = True
    assert d.answers() == [(1, [NO_SLOT])]
