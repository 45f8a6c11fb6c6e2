"""The interface between the training loop and an update scheme (sync/: HorovodSync,
ps.client.ParameterServerClient, and the elastic variant of the first).

A scheme implements the members marked *required*, here and in its Group (the workers
together: sums, broadcasts, the lead, the stop vote); everything else is a hook whose default,
written once here, is right for a scheme with a fixed set of processes. The trainer talks to a
scheme only through these classes, so it never branches on the mode.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from .replica import BatchStats, Replica
from .requeue import rank_started

if TYPE_CHECKING:
    from .loop.step_times import RankStepTimes

T = TypeVar("T")


@dataclass
class Progress:
    """Where training stands: the epoch under way, steps done in it, steps done in all. Elastic
    training commits it with the model and restores it after a worker is lost or added."""

    epoch: int = 0
    step: int = 0
    global_step: int = 0
    workers: int = 1  # how many workers counted `step` (the global batch it is counted in)


class PendingSum:
    """The result of a sum across workers that may still be in flight (see sum_later)."""

    def __init__(self, values: list[float] | None = None):
        self._values = values

    def ready(self) -> bool:
        return self._values is not None

    def wait(self) -> list[float]:
        assert self._values is not None
        return self._values


class BatchFeed:
    """Pieces of the epochs' sync plan handed to this worker one at a time by the job (async
    training: a fast worker takes more of them), instead of a fixed share per worker. A piece is
    (epoch, step, part): batch ``step`` of worker ``part``'s share of ``epoch``."""

    num_parts: int  # the workers the plan is cut for

    def next_part(self, epoch: int) -> tuple[int, int, int] | None:
        """The next piece to read while ``epoch`` is under way; None when the epoch's pieces
        are all handed out (or training is over)."""
        raise NotImplementedError

    def part_trained(self) -> tuple[int, int, int] | None:
        """After a step: the piece it trained."""
        raise NotImplementedError


class Group:
    """The workers of a run as one group: what the loop asks of all of them together (sums,
    the lead's broadcasts and decisions, the stop vote, the evaluation's meeting), whichever
    scheme updates the model. A scheme builds its own (``UpdateScheme.group``); the members
    marked *required* have no default."""

    # --- required ---------------------------------------------------------------------------
    def workers(self) -> tuple[int, int]:
        """(this worker's index, number of workers); may change between calls (elastic)."""
        raise NotImplementedError

    def sum_across_workers(self, values: list[float]) -> list[float]:
        raise NotImplementedError

    def broadcast_object(self, obj: Any) -> Any:
        """Worker 0's ``obj`` on every worker."""
        raise NotImplementedError

    # --- hooks with defaults ------------------------------------------------------------------
    def leads(self) -> bool:
        """Whether this worker is the lead: it decides for the others (main_decides), evaluates
        where one worker does, writes the checkpoints and the log. Worker 0, and in async
        training, once worker 0 is lost, the lowest live worker (ps/survivors.py)."""
        return self.workers()[0] == 0

    def when_leading(self, take_lead: Callable[[], None]) -> None:
        """``take_lead()`` is called on the worker that becomes the lead during the run (async,
        after the lead's loss): the trainer hands it the lead's roles (loop/lead.py). Schemes
        whose lead never moves, or whose new lead starts the epochs again (elastic), ignore it."""

    def main_decides(self, decide: Callable[[], T]) -> T:
        """``decide()`` as the lead (worker 0) computes it, known to every worker: the lead
        reads files and the others learn its answer, so a bad file stops all ranks alike
        instead of hanging them. Collective."""
        return self.broadcast_object(decide() if self.leads() else None)

    def sum_later(self, values: list[float]) -> PendingSum:
        """A sum across workers that the caller may collect later. Blocking by default; the
        async scheme overrides it so that a fast worker never waits for a slow one's epoch."""
        return PendingSum(self.sum_across_workers(values))

    def sums_posted_everywhere(self, posted: int) -> int:
        """After a stop, given how many sum_later sums this worker posted: how many every worker
        posted (the fewest), so that the log waits for those and leaves out the later ones,
        which a worker that stopped sooner never joins. Collective where sums are non-blocking;
        a blocking sum completed when it was posted."""
        return posted

    @property
    def steps_agree(self) -> bool:
        """Whether every worker runs the same steps, so that per-step figures (step lines) can
        be summed across workers; without it a step line is this worker's own."""
        return True

    @property
    def eval_partition(self) -> tuple[int, int] | None:
        """(index, parts) of the test split this worker scores, or None to score nothing."""
        return self.workers()

    def evaluating(self) -> contextlib.AbstractContextManager:
        """The context an evaluation runs in, with the trainer's evaluation clock inside it, so
        that no worker trains off that clock. Sync ranks meet first (each evaluates a share): a
        rank that waited for a slower one inside the evaluation would count the wait as
        evaluation, and the training clock (which leaves evaluations out) would lose it; waited
        for before, it counts as training, as the next step would have counted it. Async with
        --eval-pauses-workers: the others stop at their next push, and sleep afterwards what
        they computed meanwhile (ps/pauses.py EvalPauses.resume)."""
        return contextlib.nullcontext()

    # What this worker keeps of its own at each checkpoint, which the lead's checkpoint lacks
    # (async DiLoCo: the worker's inner optimizer): None, or an object with a ``name`` and
    # state_dict()/load_state_dict(). Every worker but the lead writes it beside each checkpoint
    # and loads it back on resume, before the scheme's start() (loop/own_state.py), with no
    # collective: an async worker reaches its checkpoints alone. Sync schemes need none (their
    # ranks meet at a checkpoint: sync/local_rounds_scheme.py averages or gathers there).
    own_state: Any = None

    # Where the checkpoint being written or resumed lies and its position: (its path, the
    # position part of loop/own_state.py's tag). The checkpointer sets it before the scheme's
    # state_dict() and, on resume, before its start(). Read by a scheme whose other processes
    # write their part of a checkpoint themselves (async: each parameter server its shard,
    # ps/shard_file.py), so that the lead's checkpoint moves no model across the network.
    checkpoint_place: tuple[str, dict[str, Any]] | None = None

    # The workers' mean seconds between the two votes before the one the last agree_to_stop
    # read, the same on every worker (0: it read none): what loop/stop_cadence.py spaces the
    # votes by. A group that does not measure it keeps 0, and is asked after every step.
    vote_gap_s = 0.0

    def agree_to_stop(self, wants: bool) -> bool:
        """After a step (every few steps where steps agree: loop/stop_cadence.py): whether the
        job stops now, because this worker ``wants`` to (a stop signal arrived) or another did.
        Every worker must get the same answer at the same step, so a distributed group
        overrides this; one process just answers itself."""
        return wants

    @property
    def stall_timeout_s(self) -> float:
        """Seconds without progress after which this process ends the job (0: never); for a
        group whose waits have no timeout of their own (see loop/watchdog.py)."""
        return 0.0


class Batches:
    """Where each worker's batches come from, epoch by epoch; the defaults are a fixed, equal
    share of every epoch per worker (``UpdateScheme.batches``)."""

    def batch_feed(self, steps_per_epoch: int, epochs: int, lookahead: int) -> BatchFeed | None:
        """Where this worker's batches come from: None for its own fixed share of every epoch
        (every worker runs the same steps: sync, lock-step rounds); else a feed of pieces the
        job hands out (async). Called before start(), only for a source that can read any
        batch on its own; ``lookahead``: batches the source reads ahead of training."""
        return None

    def batch_shares(self) -> list[int] | None:
        """Each worker's samples per step in the epoch about to start (--balance: unequal
        shares of the global batch, adding up to --batch-size x workers), or None for
        --batch-size each. Asked by the epoch plan before every epoch, after the previous
        epoch's step_times_measured; it must be the same on every worker."""
        return None

    def step_times_measured(self, times: RankStepTimes, epoch: int) -> dict | None:
        """An epoch's step times of every worker (loop/step_times.py) and the epoch (from 1), on
        each worker that took part in the epoch line's sum, once the sum is in: in sync at the
        epoch's end, on every rank alike, before the next epoch's batches are planned. What it
        returns (a dict, or None) goes into the epoch line."""
        return None


class UpdateScheme:
    """What the trainer asks of an update scheme: how it attaches to the replica (which it keeps
    as ``self.replica``), steps and saves its state. What the trainer asks of the workers
    together is the scheme's ``group``; where their batches come from, its ``batches``."""

    group: Group  # set by the subclass's constructor
    batches = Batches()  # a fixed, equal share per worker; stateless, so one serves every scheme

    # --- required ---------------------------------------------------------------------------
    @property
    def lr_scale(self) -> float:
        """Multiplier of one worker's learning rate that the combined update can take."""
        raise NotImplementedError

    def attach(self, replica: Replica) -> None:
        """Take the replica and build what updates it (optimizer, flat buffers)."""
        raise NotImplementedError

    def start(self, state: dict[str, Any] | None, resuming: bool) -> None:
        """Collective: bring every replica to the same starting point. ``state`` is the
        checkpoint on the processes that read it (see Group.main_decides), None elsewhere."""
        raise NotImplementedError

    def step(self, x: Any, y: Any, lr: float) -> BatchStats:
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint holds of the model and optimizer; may be collective."""
        raise NotImplementedError

    # --- hooks with defaults ------------------------------------------------------------------
    def eval_replica(self, closing: bool = False) -> Replica:
        """The replica whose weights are evaluated, inside group.evaluating(): the one attach()
        took, which a subclass keeps as ``self.replica`` (sync averages its buffers first; the
        async scheme pulls fresh weights; plain local SGD's round under way ends there, and
        DiLoCo's goes on while the model its workers last agreed on is scored). ``closing``:
        the evaluation closes an epoch, whose end shares the model anyway, so a round under
        way ends here and the model scored is the one the epoch's checkpoint saves. It runs
        on the training clock, before the evaluation's own time starts: the evaluation's moment
        is when its weights were taken, and a round's exchange is training's own work, which
        the round would have done a few steps later. (Charged to the evaluation, async DiLoCo's
        rounds cut at every evaluation crossed issue 43's slow link off the clock, and its time
        to target read a third of its wall time.)"""
        replica = getattr(self, "replica", None)
        assert replica is not None, "call attach() first"
        return replica

    def run(self, loop: Callable[[], None], progress: Progress) -> None:
        """Run the epochs; an elastic scheme runs them again after a reset."""
        rank_started()  # its start-up is over: `hvdtrain run` may pass a stop on to it now
        loop()

    def step_done(self, progress: Progress) -> None:
        """After every step (elastic: commit every N steps)."""

    def epoch_done(self, progress: Progress) -> None:
        """After every epoch's checkpoint."""

    def take_wait_seconds(self) -> float:
        """Seconds of the last step spent waiting for the other workers (in the collective, or
        for the server's reply), then 0 until the next step; the rest of the step is this
        worker's compute (loop/step_times.py). A scheme with nothing to wait for keeps 0."""
        return 0.0

    def take_epoch_metrics(self) -> dict:
        """Figures of the scheme's own for this epoch's log line (a GPU worker's copies); then
        reset."""
        return {}

    def end_of_training(self) -> bool:
        """Before the last evaluation and checkpoint, which must see every worker's update.
        True when another worker stopped early for a stop signal (async: workers that finish
        their epochs do not take part in the others' stop)."""
        return False

    def close(self) -> dict[str, Any] | None:
        """Shut down; may return figures for the log's closing line."""
        return None
