"""The async workers as a group (scheme.py Group), as the trainer sees them: their own
collectives (worker_group.py), each of which first tells the servers not to wait for this
worker; the stop votes (stop_votes.py); worker 0's evaluation, alone, with the others paused
or not (worker_pauses.py); and the job's batches, handed out by server 0 (slot_feed.py)."""

from __future__ import annotations

from typing import Any

from ..rules.registry import server_rules
from ..scheme import BatchFeed, Batches, Group, PendingSum
from .dispatch import SlotPlan, SlotQueue
from .slot_feed import SlotFeed


class AsyncGroup(Group):
    """The workers of ``client``'s job (a ParameterServerClient: not imported, which would
    close an import loop)."""

    def __init__(self, client):
        self.client = client

    def workers(self) -> tuple[int, int]:
        return self.client.worker_rank, self.client.topology.num_workers

    def leads(self) -> bool:
        return self.client.is_main  # after the lead's loss, the lowest live worker

    def when_leading(self, take_lead) -> None:
        self.client.peers.take_lead = take_lead

    @property
    def steps_agree(self) -> bool:
        return self.client.feed is None

    @property
    def eval_partition(self) -> tuple[int, int] | None:
        # Worker 0 scores the whole test split with the servers' current parameters; the other
        # workers keep training instead of waiting for it.
        return (0, 1) if self.client.is_main else None

    def sum_across_workers(self, values: list[float]) -> list[float]:
        self.client.going_idle()
        return self.sum_later(values).wait()

    def sum_later(self, values: list[float]) -> PendingSum:
        """A non-blocking sum over the workers (worker_group.py)."""
        return self.client.peers.sum_later(values)

    def sums_posted_everywhere(self, posted: int) -> int:
        # On stop_comm, after end_of_training: every stopped worker gets here once, whichever
        # step it stopped at, while worker_comm may still hold the sums the others never join.
        return self.client.agree(posted, self.client.MPI.MIN, "the end of its log")

    def broadcast_object(self, obj: Any) -> Any:
        self.client.going_idle()
        return self.client.peers.broadcast(obj)

    def evaluating(self):
        # worker_pauses.py: as if the job froze while worker 0 evaluates (--eval-pauses-workers)
        client = self.client
        evaluates = client.started and self.eval_partition is not None
        if client.started and not evaluates:
            client.model_read_by_worker_0()
        return client.pauses.evaluating(client.clock, evaluates)

    def agree_to_stop(self, wants: bool) -> bool:
        return self.client.stops.agree_to_stop(wants)  # stop_votes.py


class JobBatches(Batches):
    """Progress is the job's (ps/dispatch.py): server 0 hands out the epochs' batches as the
    workers ask, so a fast worker takes more of them and an epoch ends when its batches are
    used up."""

    def __init__(self, client):
        self.client = client

    def batch_feed(self, steps_per_epoch: int, epochs: int, lookahead: int) -> BatchFeed | None:
        """The round policy says where that holds (its ``fixed_shares``): plain --bsp keeps a
        fixed share per worker, as every round takes one batch of each; backup workers take the
        job's batches, or a straggler whose gradients are dropped would train most of its share
        alone at the end (issue 25)."""
        client = self.client
        num_workers = client.topology.num_workers
        if server_rules(client.cfg.ps, num_workers).policy.fixed_shares:
            return None
        plan = SlotPlan(steps_per_epoch, num_workers, epochs)
        # One slot ahead of what the source reads ahead: the next one arrives with each push's
        # reply, so the worker never waits for the hand-out.
        # Ask server 0 for more (at the start, and whenever the source reads further ahead
        # than the replies have brought).
        client.feed = SlotFeed(SlotQueue(plan), depth=1 + lookahead, fetch=lambda count, epoch:
                               client.link.request_slots(count, epoch, client.clock))
        return client.feed
