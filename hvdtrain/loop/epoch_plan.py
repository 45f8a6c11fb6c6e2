"""Which batches this worker trains on in each epoch: the number of steps every worker runs,
the first step after a resume, the seeding that makes a resume replay exactly, and the
rescaling of a position inside an epoch to another number of workers. Under async training the
job hands the epoch's batches out one at a time instead (scheme.BatchFeed): then an epoch ends
when its batches are used up, whoever trained them, and the position is the job's."""

from __future__ import annotations

import os
from typing import Any, Iterator

import torch

from ..config import ConfigError, OptimConfig, RunConfig
from ..data.batches import BatchSource
from ..optim import learning_rate
from ..scheme import BatchFeed, Progress, UpdateScheme


class EpochPlan:
    def __init__(self, run: RunConfig, source: BatchSource):
        self.run = run
        self.source = source
        self.worker, self.num_workers = 0, 1
        self.steps_per_epoch = 0
        # the global step less the place in this world's epochs: a resume's, after the steps
        # of another number of workers (rescale); 0 for a run that started here
        self.global_offset = 0
        self.feed: BatchFeed | None = None
        self.scheme: UpdateScheme | None = None  # asked for each epoch's shares (--balance)
        self.samples_agreed = False  # the workers' sample counts were compared (once a run)

    def bind_world(self, worker: int, num_workers: int, group: Any = None) -> None:
        """This worker's place; with its ``group`` (scheme.Group) of 2 or more workers, a check
        that every worker holds as many training samples as the lead (collective)."""
        run = self.run
        self.worker, self.num_workers = worker, num_workers
        # Not under horovodrun's elastic mode: a process that joins there binds in its start,
        # while the others bind in their reset, and the collectives would not pair (a hang).
        # Once: the trainer binds again as its epochs start, and the data has not changed.
        if group is not None and num_workers > 1 and not self.samples_agreed and \
                os.environ.get("HOROVOD_ELASTIC") != "1":
            self._check_same_samples(group)
            self.samples_agreed = True
        full = self.source.steps_per_epoch(run.batch_size, num_workers)
        if full == 0:
            raise ConfigError(
                f"--batch-size: the training split has {self.source.num_samples} samples, fewer "
                f"than one global batch of {run.batch_size} x {num_workers} workers; lower "
                "--batch-size")
        self.steps_per_epoch = min(full, run.max_steps_per_epoch or full)

    def _check_same_samples(self, group: Any) -> None:
        """Ranks that each passed their own data (hvdtrain.fit under mpirun, a file sharded by
        hand) run different numbers of steps, and a sync job hung in its first collective past
        the shorter one's end, until the stall timeout blamed a stall."""
        own = self.source.num_samples
        lead = group.broadcast_object(own)
        differ = int(group.sum_across_workers([float(own != lead)])[0])
        if differ:
            raise ConfigError(
                f"the training data: {differ} worker(s) hold another number of samples than "
                f"worker 0's {lead}" + (f" (this one, worker {self.worker}, {own})"
                                        if own != lead else "")
                + "; every worker must pass the same whole dataset, which hvdtrain shards among "
                "them itself: load all of it on every rank, with the same seed")

    @property
    def total_steps(self) -> int:
        return self.steps_per_epoch * self.run.epochs

    def learning_rate(self, progress: Progress, optim: OptimConfig, lr_scale: float) -> float:
        """--lr's schedule (warm-up, decay; optim.learning_rate) at ``progress``'s place in
        this world's plan: its epoch and step in it. Not the global step, which counts the
        steps taken: after a resume (or an elastic reset) with another number of sync workers
        it counts the earlier epochs in the old world's steps, and a cosine schedule reached 0
        epochs before the end (2 -> 3 ranks of 6 epochs trained the last two at lr 0). With a
        feed the two are the same: the job's position."""
        place = progress.epoch * self.steps_per_epoch + progress.step
        return learning_rate(place, self.total_steps, self.steps_per_epoch, optim, lr_scale)

    def rescale(self, progress: Progress) -> None:
        """A position inside an epoch counted by a different number of workers (an elastic reset,
        or --resume from a step checkpoint with another world size) becomes the step of this
        world's global batch that has seen about the same share of the epoch's samples. A
        feed's global step, the job's place in its epochs, goes on from where it was: counted
        in this world's epochs afresh, a resume with more workers (fewer steps each) had gone
        back below the steps the log and the trackers had already seen."""
        if progress.step and progress.workers != self.num_workers:
            progress.step = min(self.steps_per_epoch,
                                progress.step * progress.workers // self.num_workers)
        elif progress.step > self.steps_per_epoch:
            raise ConfigError(
                f"the checkpoint stopped at step {progress.step} of epoch {progress.epoch + 1}, "
                f"past this run's {self.steps_per_epoch} steps per epoch (--max-steps-per-epoch "
                f"{self.run.max_steps_per_epoch or 'unset'}, --batch-size {self.run.batch_size}):"
                f" resume with --max-steps-per-epoch {progress.step} or more to finish that "
                "epoch, then lower it")
        progress.workers = self.num_workers
        self.global_offset = progress.global_step - self._place(progress)

    def seed_epoch(self, epoch: int) -> None:
        # Seeded per (epoch, worker) before the epoch's batches are read, so that the data's
        # randomness (a loader's worker seeds) replays on a resume from the epoch's end.
        torch.manual_seed(self.run.seed * 100_003 + epoch * 1009 + self.worker)

    def seed_step(self, epoch: int, step: int) -> None:
        """Seeded per (epoch, step, worker) once the step's batch is read, before it trains:
        the model's randomness (dropout) replays exactly on a resume from inside an epoch too.
        Seeded per epoch only, the resumed steps drew the epoch's first steps' dropout masks,
        and the run ended with other weights than an uninterrupted one."""
        torch.manual_seed((((self.run.seed * 100_003 + epoch) * 1_000_003 + step) * 1009
                           + self.worker) % 2**63)

    def use_feed(self, feed: BatchFeed | None) -> None:
        self.feed = feed

    def ask_for_feed(self, scheme: UpdateScheme) -> None:
        """Where the data can be read in any order, the scheme may hand out the batches instead
        (scheme.batches.batch_feed). The scheme is also asked for each epoch's shares of the
        global batch (scheme.batches.batch_shares), which the source must be able to cut."""
        self.scheme = scheme
        if scheme.batches.batch_shares() is not None and not self.source.takes_shares:
            raise ConfigError(f"--balance: the training data ({self.source.describe()}) cannot "
                              "be cut into unequal shares of each global batch; drop --balance")
        if self.source.random_access:
            self.use_feed(scheme.batches.batch_feed(self.steps_per_epoch, self.run.epochs,
                                            self.source.lookahead))

    def batches(self, progress: Progress) -> Iterator[tuple[Any, Any]]:
        """This worker's batches for the rest of the epoch under way."""
        self.seed_epoch(progress.epoch)
        if self.feed is not None:
            return self.source.part_batches(self._pieces(self.feed, progress.epoch),
                                            self.feed.num_parts, self.run.batch_size,
                                            self.run.seed)
        shares = self.scheme.batches.batch_shares() if self.scheme is not None else None
        return self._seeded_steps(self.source.train_batches(
            progress.epoch, self.worker, self.num_workers, self.run.batch_size, self.run.seed,
            first_step=progress.step, steps=self.steps_per_epoch, shares=shares),
            progress.epoch, progress.step)

    def _seeded_steps(self, batches: Iterator[tuple[Any, Any]], epoch: int,
                      first_step: int) -> Iterator[tuple[Any, Any]]:
        for step, batch in enumerate(batches, first_step):
            self.seed_step(epoch, step)  # after the read: the data's randomness is the epoch's
            yield batch

    @staticmethod
    def _pieces(feed: BatchFeed, epoch: int) -> Iterator[tuple[int, int, int]]:
        while (piece := feed.next_part(epoch)) is not None:
            yield piece

    def finish_epoch(self, progress: Progress) -> None:
        """The epoch under way is done. With a feed the job's position is its end, whoever
        trained its last batches (this worker's last one may be earlier in it)."""
        progress.epoch, progress.step = progress.epoch + 1, 0
        if self.feed is not None:
            progress.global_step = self._place(progress) + self.global_offset

    def advance(self, progress: Progress) -> int:
        """After a step: one step further, or, with a feed, at the job's position of the
        piece just trained (a fast worker's steps skip the pieces others trained). Returns the
        global step before it."""
        before = progress.global_step
        if self.feed is None:
            progress.step, progress.global_step = progress.step + 1, progress.global_step + 1
            return before
        piece = self.feed.part_trained()
        if piece is not None and piece[0] == progress.epoch:  # not an earlier epoch's leftover
            progress.step = piece[1] + 1
            progress.global_step = self._place(progress) + self.global_offset
        return before

    def _place(self, progress: Progress) -> int:
        return progress.epoch * self.steps_per_epoch + progress.step
