"""Async training's epochs belong to the job, not to each worker: one global plan of batch slots,
handed out by server 0 as the workers ask for them. Pure arithmetic, no MPI (ps/server.py sends,
ps/client.py receives).

The plan is the sync plan cut into its pieces. Epoch e of the sync plan has ``steps_per_epoch``
global steps of ``num_parts`` batches each (builtin.epoch_batches: step s of part w is batch s
of worker w's share). Slot ``k`` of epoch e is (step k // num_parts, part k % num_parts), and
slots are numbered across epochs: ``e * slots_per_epoch + k``. Whoever asks next gets the next
slot, so a fast worker takes more batches than a slow one, every sample is still used once per
epoch, and an epoch ends when its slots are used up, whoever computed them (TF's
ParameterServerStrategy with a shared dataset, Downpour's and MXNet's global data queue).

A slot is *outstanding* from the moment it is handed out until the push that carries its
gradient arrives. A checkpoint records the next slot to hand out and the outstanding ones; a
resume hands the outstanding ones out again first, so every slot's gradient is applied once,
whether the run was interrupted or not (up to the pushes in flight at the checkpoint, within one
round, as for any asynchronous checkpoint).

Under mpirun's recovery settings a lost worker's outstanding slots come back (``give_back``) and
go to the next worker that asks. A loss is noticed only after a silence (silence.py), so the
survivors may have used up the plan's other slots by then; a worker that runs out is therefore
not told NO_SLOT while another live worker holds slots that may still come back: it is told
NONE_YET, and an explicit request (its queue is empty) is held until one comes back or none can
(``ask``, ``answers``; ps/slot_waiters.py sends the replies). Without recovery nothing comes
back, and a worker that runs out is told NO_SLOT at once, as ever.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass
from typing import Any

NO_SLOT = -1  # on the wire: none left, training is over
NONE_YET = -2  # on the wire, under recovery only: none now, but another worker's slots may come
               # back; ask again once the queue is empty (nothing is queued, nothing exhausted)


@dataclass(frozen=True)
class SlotPlan:
    steps_per_epoch: int  # global steps per epoch
    num_parts: int        # batches per global step: the workers the plan is cut for
    epochs: int

    @property
    def slots_per_epoch(self) -> int:
        return self.steps_per_epoch * self.num_parts

    @property
    def total(self) -> int:
        return self.slots_per_epoch * self.epochs

    def locate(self, slot: int) -> tuple[int, int, int]:
        """(epoch, step, part) of a global slot number."""
        epoch, k = divmod(slot, self.slots_per_epoch)
        step, part = divmod(k, self.num_parts)
        return epoch, step, part

    def first_slot(self, epoch: int, step: int) -> int:
        return epoch * self.slots_per_epoch + step * self.num_parts

    def as_list(self) -> list[int]:
        return [self.steps_per_epoch, self.num_parts, self.epochs]


class BatchDispatcher:
    """Server 0's side: hands out slots in order, outstanding ones of a resumed run first."""

    def __init__(self, plan: SlotPlan, recovery: bool = False):
        self.plan = plan
        self.recovery = recovery             # a lost worker's slots come back: wait for them
        self.next = 0                        # the next fresh slot
        self.redo: deque[int] = deque()      # outstanding at the checkpoint: handed out first
        self.outstanding: dict[int, int] = {}  # slot -> worker: handed out, push not arrived
        self.told_none: set[int] = set()     # workers told NO_SLOT
        self.completed = 0                   # pushes that carried a slot, in this run
        self.done_before = 0                 # slots a resumed checkpoint's attempts completed
        self.pushed_twice = 0                # ... a slot not outstanding to its sender
        self.handed_back = 0                 # slots of lost workers, handed out again
        self.handed_to: Counter = Counter()  # worker -> slots handed out, for the statistics
        self.waiting: dict[int, int] = {}    # worker -> slots asked for: its request is held
        self.closed: set[int] = set()        # workers that sent DONE: they push no more
        self.stopped = False                 # the job stops: nobody waits for a slot any more

    def take(self, worker: int) -> int:
        """The next slot for ``worker``; NO_SLOT when none is left, or, under recovery, NONE_YET
        while another worker's slots may still come back (``may_come_back``)."""
        if self.redo:
            slot = self.redo.popleft()
        elif self.next < self.plan.total:
            slot, self.next = self.next, self.next + 1
        elif self.may_come_back(worker):
            return NONE_YET
        else:
            self.told_none.add(worker)
            return NO_SLOT
        self.outstanding[slot] = worker
        self.handed_to[worker] += 1
        return slot

    def may_come_back(self, worker: int) -> bool:
        """Under recovery, whether a slot may still come back for ``worker``: another worker
        that is neither waiting nor closed holds one, and may die before its push. A waiter's
        own slots do not count: it may hold batches it read ahead, which it trains only once
        answered, so two waiters counting on each other's slots would wait forever."""
        return self.recovery and not self.stopped and any(
            w != worker and w not in self.waiting and w not in self.closed
            for w in self.outstanding.values())

    def ask(self, worker: int, count: int, epoch: int) -> list[int] | None:
        """An explicit request for ``count`` slots from a worker whose queue is empty, in
        ``epoch``: the slots to send now, or None when the request is held until ``answers``
        has a reply for it. Held only in the plan's last epoch: a worker in an earlier one
        gets NONE_YET, which ends that epoch for it (it asks again in the next), so that a
        blocking collective of workers at an epoch's end (--early-stop-patience's broadcast)
        never waits for a held worker while the holder of the awaited slot waits in it."""
        slots = [self.take(worker) for _ in range(count)]
        if slots[0] == NONE_YET and epoch >= self.plan.epochs - 1:
            self.waiting[worker] = count
            return None
        return slots

    def answers(self) -> list[tuple[int, list[int]]]:
        """The held requests that have their reply now, as (worker, slots), in the order they
        came: a slot came back, or none can come back any more (NO_SLOT). Asked after every
        event that may change it: a push that completes a slot, a give_back, a new waiter, a
        worker's DONE, the stop."""
        answered = []
        for worker, count in list(self.waiting.items()):
            first = self.take(worker)
            if first == NONE_YET:
                continue
            del self.waiting[worker]  # from here on its slots count for the other waiters
            answered.append((worker, [first, *(self.take(worker) for _ in range(count - 1))]))
        return answered

    def complete(self, slot: int, worker: int | None = None) -> None:
        """The push carrying ``slot``'s gradient came (from ``worker``, when known). A slot
        completes once; a push for a slot not outstanding to its sender (already completed,
        or handed to another worker) is counted, since its batch was trained twice."""
        if worker is not None and self.outstanding.get(slot) != worker:
            self.pushed_twice += 1
        elif self.outstanding.pop(slot, None) is not None:
            self.completed += 1

    def finished_pushing(self, worker: int) -> bool:
        """Whether ``worker`` will push no more: told NO_SLOT, and its last slot's push came.
        Then nobody may wait for its clock (a staleness bound would wait forever)."""
        return worker in self.told_none and worker not in self.outstanding.values()

    def give_back(self, worker: int) -> None:
        """A lost worker's outstanding slots go to the next workers that ask (membership.py)."""
        slots = sorted(s for s, w in self.outstanding.items() if w == worker)
        for slot in slots:
            del self.outstanding[slot]
        self.redo.extendleft(reversed(slots))
        self.handed_back += len(slots)
        self.handed_to[worker] -= len(slots)  # not its batches: batches_per_worker adds up
        self.waiting.pop(worker, None)  # nothing is sent to it any more

    @property
    def finished(self) -> bool:
        return not self.redo and not self.outstanding and self.next >= self.plan.total

    def lowest_undone(self) -> int:
        """The first slot whose gradient has not arrived (plan.total once all have)."""
        return min([*self.redo, *self.outstanding, self.next])

    # --- checkpoint --------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"plan": self.plan.as_list(), "next": self.next,
                "outstanding": sorted({*self.redo, *self.outstanding})}

    def load_state_dict(self, state: dict[str, Any]) -> str | None:
        """Continue a checkpoint's plan. Returns a note when it was cut for another number of
        workers or steps per epoch: then the position of the next slot never handed out is
        carried over as a share of its epoch (as a sync resume with another world size does),
        and the outstanding slots, which name batches of the old cut, are not handed out
        again. Not the lowest outstanding slot: a worker that died under plain mpirun can
        leave one many epochs back while the others trained on, and a resume from there
        trained every epoch since again."""
        steps, parts, _ = state["plan"]
        if (steps, parts) == (self.plan.steps_per_epoch, self.plan.num_parts):
            self.next = min(int(state["next"]), self.plan.total)
            self.redo = deque(s for s in state["outstanding"] if s < self.plan.total)
            self.done_before = self.next - len(self.redo)
            return None
        old = SlotPlan(steps, parts, state["plan"][2])
        epoch, step, _ = old.locate(min(int(state["next"]), old.total))
        step = min(self.plan.steps_per_epoch, step * parts // self.plan.num_parts)
        self.next = min(self.plan.first_slot(epoch, step), self.plan.total)
        self.redo.clear()
        self.done_before = self.next
        return (f"the checkpoint's async batch plan was cut for {parts} worker(s) and {steps} "
                f"steps per epoch, this run's for {self.plan.num_parts} and "
                f"{self.plan.steps_per_epoch}: the job goes on in epoch {epoch + 1} after the "
                f"share of its batches already handed out, and the "
                f"{len(state['outstanding'])} batch(es) outstanding at the checkpoint are not "
                "trained again")

    def statistics(self) -> dict[str, Any]:
        return {"batches_completed": self.completed, "batches_pushed_twice": self.pushed_twice,
                "batches_handed_back": self.handed_back,
                # the job's: what earlier attempts trained (a resume's checkpoint) counts
                "batches_untrained": self.plan.total - self.done_before - self.completed,
                "batches_per_worker": {int(w): int(n) for w, n in sorted(self.handed_to.items())},
                "batches_left": self.plan.total - self.lowest_undone()}


class SlotQueue:
    """A worker's side: the slots handed to it and not yet trained, in the order it trains them
    (the DataLoader may read a few ahead of training, so ``training`` keeps the order too)."""

    def __init__(self, plan: SlotPlan):
        self.plan = plan
        self.queued: deque[int] = deque()    # handed to this worker, batch not yet read
        self.training: deque[int] = deque()  # batch read (maybe prefetched), push not yet made
        self.exhausted = False               # the dispatcher said NO_SLOT

    def receive(self, slot: int) -> None:
        if slot == NO_SLOT:
            self.exhausted = True
        elif slot != NONE_YET:  # NONE_YET: nothing now; the next request, when the queue is empty
            self.queued.append(slot)

    def next_of_epoch(self, epoch: int) -> tuple[int, int, int] | None:
        """The next slot to read while epoch ``epoch`` is under way, as (epoch, step, part), or
        None when the queue's next slot belongs to a later epoch or none is left. A slot of an
        earlier epoch (outstanding when a resumed run's checkpoint was written) counts."""
        if not self.queued:
            return None
        located = self.plan.locate(self.queued[0])
        if located[0] > epoch:
            return None
        self.training.append(self.queued.popleft())
        return located

    def current(self) -> int:
        """The slot of the batch being trained now (whose push comes next)."""
        return self.training[0] if self.training else NO_SLOT

    def trained(self) -> tuple[int, int, int] | None:
        """The current batch's push is made: its (epoch, step, part)."""
        return self.plan.locate(self.training.popleft()) if self.training else None
