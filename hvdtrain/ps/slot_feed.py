"""The job's batches as one async worker receives them: slots that server 0 hands out as the
workers ask (ps/dispatch.py), behind the trainer's BatchFeed, and the plan worker 0 sends it at
the start."""

from __future__ import annotations

from typing import Any, Callable, Iterable

from ..scheme import BatchFeed
from .dispatch import BatchDispatcher, SlotPlan, SlotQueue


class SlotFeed(BatchFeed):
    """The trainer's view of the slots server 0 hands this worker (scheme.BatchFeed);
    ``fetch(count, epoch)`` asks for ``count`` more and returns them."""

    def __init__(self, queue: SlotQueue, depth: int, fetch: Callable[[int, int], Iterable[int]]):
        self.queue = queue
        self.num_parts = queue.plan.num_parts
        self.depth = depth  # slots this worker holds ahead: 1 + what its source reads ahead
        self.fetch = fetch

    def next_part(self, epoch: int) -> tuple[int, int, int] | None:
        q = self.queue
        if not q.queued and not q.exhausted:
            for slot in self.fetch(max(1, self.depth - len(q.training)), epoch):
                q.receive(int(slot))
        return q.next_of_epoch(epoch)

    def part_trained(self) -> tuple[int, int, int] | None:
        return self.queue.trained()


def plan_message(plan: SlotPlan, state: dict[str, Any] | None) -> dict[str, Any]:
    """What server 0 gets of the job's batch plan: a checkpoint's position in it, or, from a
    checkpoint written without one (lock-step rounds, an older version), the start of the
    checkpoint's step."""
    position = (state.get("server_state") or {}).get("dispatch") if state else None
    if position is None and state is not None:
        position = {"plan": plan.as_list(), "outstanding": [],
                    "next": plan.first_slot(state["epoch"], state.get("step", 0))}
    if position is not None:
        note = BatchDispatcher(plan).load_state_dict(position)  # as server 0 will
        if note:
            print(f"hvdtrain: warning: {note}", flush=True)
    return {"plan": plan.as_list(), "state": position}
