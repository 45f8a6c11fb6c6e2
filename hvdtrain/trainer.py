"""The shared training loop: epochs, evaluation, metrics, checkpoints.

It knows nothing of Horovod or MPI. The update scheme behind it (sync.HorovodSync or
ps.client.ParameterServerClient) fits the small interface below, and the loop never branches on
which scheme it drives.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Protocol

import torch

from . import checkpoint
from .config import Config, ConfigError, parse_straggler
from .data import Dataset, epoch_batches, eval_shard
from .metrics import JsonlLog, ProgressBar, package_versions
from .models import count_parameters
from .optim import learning_rate
from .replica import BatchStats, Replica
from .runtime import Runtime


@dataclass
class Progress:
    """Where training stands: the epoch under way, steps done in it, steps done in all. Elastic
    training commits it with the model and restores it after a worker is lost or added."""

    epoch: int
    step: int
    global_step: int
    workers: int  # how many workers counted `step` (the global batch it is counted in)


class UpdateScheme(Protocol):
    lr_scale: float                           # multiplier of one worker's learning rate
    reads_checkpoint_everywhere: bool         # every process loads --resume (no broadcast)
    eval_partition: tuple[int, int] | None    # (index, parts) of the test split to score, or None

    def attach(self, replica: Replica) -> None: ...
    def start(self, state: dict[str, Any] | None) -> None: ...   # collective; state on main only
    def workers(self) -> tuple[int, int]: ...  # (this worker's index, workers): may change
    def run(self, loop: Callable[[], None], progress: Progress) -> None: ...  # loop(), or retried
    def step_done(self, progress: Progress) -> None: ...    # elastic: commit every N steps
    def epoch_done(self, progress: Progress) -> None: ...
    def step(self, x: torch.Tensor, y: torch.Tensor, lr: float) -> BatchStats: ...
    def sum_across_workers(self, values: list[float]) -> list[float]: ...
    def broadcast_object(self, obj: Any) -> Any: ...
    def eval_replica(self) -> Replica: ...
    def end_of_training(self) -> None: ...
    def state_dict(self) -> dict[str, Any]: ...
    def close(self) -> dict[str, Any] | None: ...


class TrainingError(RuntimeError):
    """Training cannot go on (for example the loss became NaN). The message says where and why."""


@dataclass
class EpochResult:
    epoch: int
    train_loss: float
    train_acc: float
    test_loss: float | None
    test_acc: float | None
    seconds: float
    samples_per_sec: float


class Trainer:
    def __init__(self, cfg: Config, runtime: Runtime, scheme: UpdateScheme, dataset: Dataset,
                 replica: Replica):
        self.cfg = cfg
        self.runtime = runtime
        self.scheme = scheme
        self.dataset = dataset
        self.replica = replica
        # In-memory datasets live on the training device; a batch is then one index lookup.
        self.x_train = dataset.x_train.to(replica.device)
        self.y_train = dataset.y_train.to(replica.device)
        self._bind_world()
        run = cfg.run
        self.run_dir = self._choose_run_dir() if self.is_main else None
        self.log: JsonlLog | None = None
        self.bar = ProgressBar(enabled=self.is_main and run.progress)
        self.global_step = 0
        self.start_epoch = 0
        self.start_step = 0  # steps already done in start_epoch (a mid-epoch checkpoint)
        self.start_workers = self.num_workers  # the number of workers that counted start_step
        self.history: list[EpochResult] = []
        self.progress = Progress(0, 0, 0, self.num_workers)

    def _bind_world(self) -> None:
        """Everything that depends on which worker this is and how many there are. Called again
        when elastic training resumes with a different set of workers."""
        self.worker_rank, self.num_workers = self.scheme.workers()
        self.is_main = self.worker_rank == 0  # elastic: another process, after rank 0 died
        run = self.cfg.run
        full_steps = len(epoch_batches(len(self.x_train), run.batch_size, 0, self.num_workers, 0,
                                       run.seed))
        if full_steps == 0:
            raise ConfigError(
                f"--batch-size: the training split has {len(self.x_train)} samples, fewer than one "
                f"global batch of {run.batch_size} x {self.num_workers} workers; lower --batch-size")
        self.steps_per_epoch = min(full_steps, run.max_steps_per_epoch or full_steps)
        self.total_steps = self.steps_per_epoch * run.epochs
        part = self.scheme.eval_partition
        shard = eval_shard(len(self.dataset.x_test), *part) if part else slice(0, 0)
        self.evaluates = part is not None
        device = self.replica.device
        self.x_test = self.dataset.x_test[shard].to(device)
        self.y_test = self.dataset.y_test[shard].to(device)
        # --straggler: the last worker sleeps after each step (for comparing the schemes).
        factor, delay = parse_straggler(run.straggler)
        is_straggler = run.straggler and self.worker_rank == self.num_workers - 1
        self.straggle = (factor, delay) if is_straggler else None

    # --- set-up ----------------------------------------------------------------------------
    def _choose_run_dir(self) -> Path:
        run = self.cfg.run
        if run.run_dir:
            return Path(run.run_dir)
        if run.resume:  # keep writing into the run being resumed
            return checkpoint.checkpoint_path(run.resume).parent
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        return Path("runs") / f"{stamp}-{run.mode}-{self.cfg.data.dataset}-{self.cfg.model.model}"

    def identity(self) -> dict[str, Any]:
        """What must match for a checkpoint to be loadable into this run."""
        return {"mode": self.cfg.run.mode, "model": self.cfg.model.model,
                "input_shape": list(self.dataset.input_shape),
                "num_classes": self.dataset.num_classes,
                "num_parameters": count_parameters(self.replica.model),
                "optimizer": self.cfg.optim.optimizer}

    def _resume_source(self) -> str | None:
        """--resume, or the run folder's checkpoint under --auto-resume; None for a fresh run.
        A fresh run never overwrites a checkpoint: a --run-dir that holds one is an error unless
        the run continues it. Rank 0 decides and tells the others, like _resume."""
        run = self.cfg.run
        if run.resume:
            return run.resume
        decision: dict[str, str] | None = None
        existing = Path(run.run_dir) / checkpoint.CHECKPOINT_NAME if run.run_dir else None
        if (self.is_main or self.scheme.reads_checkpoint_everywhere) and existing \
                and existing.exists():
            # Elastic training starts processes during the run (an added host); they find the
            # checkpoint this run wrote and must continue the run, so elastic implies auto-resume.
            if run.auto_resume or self.scheme.reads_checkpoint_everywhere:
                decision = {"resume": run.run_dir}
            else:
                decision = {"error": (
                    f"{run.run_dir} already holds a checkpoint ({existing}) and this run would "
                    f"overwrite it; continue that run with --resume {run.run_dir} (or "
                    f"--auto-resume), or pass another --run-dir for a new run")}
        decision = self.scheme.broadcast_object(decision)
        if decision and "error" in decision:
            raise checkpoint.CheckpointError(decision["error"])
        if decision and self.is_main:
            print(f"hvdtrain: continuing the checkpoint in {run.run_dir}", flush=True)
        return decision["resume"] if decision else None

    def _resume(self) -> dict[str, Any] | None:
        """Rank 0 reads the checkpoint; every rank learns whether that worked before any tensor
        moves, so a bad file stops all ranks with the same message instead of hanging them.
        Returns the state on rank 0 (None elsewhere), for the scheme's start(). A scheme without
        start-up collectives (elastic) has every process read the file itself instead."""
        path = self.cfg.run.resume
        state, error = None, None
        if self.is_main or self.scheme.reads_checkpoint_everywhere:
            try:
                state = checkpoint.load(path)
                checkpoint.check_compatible(state, self.identity(), path)
            except checkpoint.CheckpointError as e:
                error = str(e)
        error = self.scheme.broadcast_object(error)
        if error:
            raise checkpoint.CheckpointError(error)
        progress = self.scheme.broadcast_object(
            {"epoch": state["epoch"], "step": state.get("step", 0),
             "global_step": state["global_step"], "num_workers": state["num_workers"]}
            if state else None)
        if progress["num_workers"] != self.num_workers and self.is_main:
            print(f"warning: checkpoint was written with {progress['num_workers']} workers, this "
                  f"run has {self.num_workers}; the data order differs from an uninterrupted run",
                  flush=True)
        self.start_epoch, self.global_step = progress["epoch"], progress["global_step"]
        self.start_step = progress["step"]
        self.start_workers = progress["num_workers"]
        return state

    def _save(self, epoch: int, step: int = 0) -> Path | None:
        """A checkpoint after `epoch` whole epochs and `step` steps of the next one."""
        state = self.scheme.state_dict()  # may be collective (the async scheme asks the servers)
        if not self.is_main:
            return None
        path = self.run_dir / checkpoint.CHECKPOINT_NAME
        try:
            return checkpoint.save_atomic(
                {**state, "identity": self.identity(), "epoch": epoch, "step": step,
                 "global_step": self.global_step, "num_workers": self.num_workers,
                 "config": self.cfg.to_dict()}, path)
        except checkpoint.CheckpointWriteError as e:  # full disk, quota, lost mount
            kept = (f"the previous checkpoint {path} is intact; free space and continue with "
                    f"--resume {self.run_dir}" if path.exists() else "no earlier checkpoint exists")
            where = f"epoch {epoch}" if not step else f"epoch {epoch + 1}, step {step}"
            raise TrainingError(f"could not write the {where} checkpoint to {path} "
                                f"({e}); {kept}") from None

    # --- the loop --------------------------------------------------------------------------
    def fit(self) -> list[EpochResult]:
        run = self.cfg.run
        self.scheme.attach(self.replica)
        run.resume = self._resume_source()  # the same on every rank: the schemes read it too
        self.scheme.start(self._resume() if run.resume else None)
        if self.is_main:
            self.log = JsonlLog(self.run_dir / "metrics.jsonl", append=bool(run.resume))
            self.log.write("header", config=self.cfg.to_dict(), world_size=self.runtime.size,
                           num_workers=self.num_workers, launcher=self.runtime.launcher,
                           device=self.replica.describe(), versions=package_versions(),
                           dataset=self.dataset.describe(),
                           num_parameters=count_parameters(self.replica.model),
                           steps_per_epoch=self.steps_per_epoch, resumed_from_epoch=self.start_epoch,
                           resumed_from_step=self.start_step)
            print(f"hvdtrain: {run.mode} training of {self.cfg.model.model} "
                  f"({count_parameters(self.replica.model):,} parameters) on {self.dataset.describe()}"
                  f"; {self.num_workers} worker(s), launcher: {self.runtime.launcher}, "
                  f"device: {self.replica.describe()}; logging to {self.run_dir}", flush=True)
        started = time.perf_counter()
        self.progress = Progress(self.start_epoch, self.start_step, self.global_step,
                                 self.start_workers)
        try:
            self.scheme.run(lambda: self._epochs(started), self.progress)
            summary = self.scheme.close()
            if self.log and summary:
                self.log.write("scheme", **summary)
        finally:
            if self.log:
                self.log.close()
        return self.history

    def _epochs(self, started: float) -> None:
        """The epochs from self.progress on. An elastic scheme may run this again after a reset,
        with the progress of its last commit and a new set of workers."""
        run = self.cfg.run
        self._bind_world()
        self._follow_main()
        self._rescale_progress()
        self.global_step = self.progress.global_step
        while self.progress.epoch < run.epochs:
            epoch = self.progress.epoch
            result = self._train_epoch(epoch, started, first_step=self.progress.step)
            self.history.append(result)
            self.progress.epoch, self.progress.step = epoch + 1, 0
            last = epoch + 1 == run.epochs
            if last or (run.checkpoint_every and (epoch + 1) % run.checkpoint_every == 0):
                self._save(epoch + 1)
            self.scheme.epoch_done(self.progress)

    def _rescale_progress(self) -> None:
        """A position inside an epoch counted by a different number of workers (an elastic reset,
        or --resume from a step checkpoint with another world size) becomes the step of this
        world's global batch that has seen about the same share of the epoch's samples."""
        p = self.progress
        if p.step and p.workers != self.num_workers:
            p.step = min(self.steps_per_epoch, p.step * p.workers // self.num_workers)
        p.workers = self.num_workers

    def _follow_main(self) -> None:
        """After an elastic reset that lost rank 0, the process that is rank 0 now takes over the
        metrics log and the checkpoints (elastic requires a shared --run-dir), and a process that
        is no longer rank 0 stops writing them."""
        if self.is_main and self.log is None:
            self.run_dir = Path(self.cfg.run.run_dir)
            self.log = JsonlLog(self.run_dir / "metrics.jsonl", append=True)
            print(f"hvdtrain: this process is rank 0 now; it continues the log and the "
                  f"checkpoints in {self.run_dir}", flush=True)
        elif not self.is_main and self.log is not None:
            self.log.close()
            self.log = None

    def _train_epoch(self, epoch: int, started: float, first_step: int = 0) -> EpochResult:
        run = self.cfg.run
        batches = epoch_batches(len(self.x_train), run.batch_size, self.worker_rank,
                                self.num_workers, epoch, run.seed)[: self.steps_per_epoch]
        # The part of the epoch after a mid-epoch checkpoint or an elastic commit.
        batches = batches[first_step:]
        # Seeded per (epoch, worker) so that dropout-like randomness replays exactly on a resume
        # from an epoch's end (from inside one, the replay starts at the epoch's first step).
        torch.manual_seed(run.seed * 100_003 + epoch * 1009 + self.worker_rank)
        self.replica.model.train()
        self.bar.start_epoch(epoch + 1, run.epochs, len(batches))
        loss_sum, correct, count = 0.0, 0.0, 0
        t0 = time.perf_counter()
        lr = self._learning_rate()  # for the epoch line, also when no step is left (a resume)
        for i, idx in enumerate(batches):
            lr = self._learning_rate()
            index = torch.from_numpy(idx).to(self.x_train.device)
            step_started = time.perf_counter()
            stats = self.scheme.step(self.x_train[index], self.y_train[index], lr)
            step_loss = stats.loss_sum.item()
            if self.straggle:
                factor, delay = self.straggle
                time.sleep((factor - 1) * (time.perf_counter() - step_started) + delay)
            if not math.isfinite(step_loss):
                raise TrainingError(f"loss became {step_loss} at epoch {epoch + 1}, step {i + 1} "
                                    f"(global step {self.global_step + 1}); lower --lr or check "
                                    "the data. The last checkpoint is kept unchanged.")
            loss_sum += step_loss
            correct += stats.correct.item()
            count += stats.count
            self.global_step += 1
            self.progress.step, self.progress.global_step = first_step + i + 1, self.global_step
            self.scheme.step_done(self.progress)
            if run.checkpoint_steps and self.global_step % run.checkpoint_steps == 0 \
                    and i + 1 < len(batches):  # the epoch's end writes its own checkpoint
                self._save(epoch, step=first_step + i + 1)
            if run.log_steps:
                g_loss, g_count = self.scheme.sum_across_workers([step_loss, stats.count])
                if self.log:
                    self.log.write("step", epoch=epoch + 1, step=self.global_step, lr=lr,
                                   loss=g_loss / g_count)
            self.bar.update((time.perf_counter() - t0) / (i + 1), loss_sum / count, correct / count)
        seconds = time.perf_counter() - t0
        if epoch + 1 == run.epochs:
            self.scheme.end_of_training()  # the last evaluation and checkpoint see every update
        g_loss, g_correct, g_count = self.scheme.sum_across_workers([loss_sum, correct, count])
        # g_count is 0 only when a resume (elastic, or a step checkpoint under another number
        # of workers) left no step of this epoch to run.
        result = EpochResult(epoch + 1, g_loss / max(g_count, 1), g_correct / max(g_count, 1),
                             None, None, seconds, g_count / seconds)
        if (epoch + 1) % run.eval_every == 0 or epoch + 1 == run.epochs:
            result.test_loss, result.test_acc = self.evaluate()
        summary = (f"epoch {epoch + 1}/{run.epochs} - loss: {result.train_loss:.4f} - acc: "
                   f"{result.train_acc:.4f}"
                   + (f" - test_loss: {result.test_loss:.4f} - test_acc: {result.test_acc:.4f}"
                      if result.test_acc is not None else "")
                   + f" - {result.samples_per_sec:,.0f} samples/s - lr: {lr:.4g}")
        self.bar.end_epoch()
        if self.is_main:
            print(summary, flush=True)
        if self.log:
            self.log.write("epoch", epoch=epoch + 1, step=self.global_step, lr=lr,
                           workers=self.num_workers,
                           train_loss=result.train_loss, train_acc=result.train_acc,
                           test_loss=result.test_loss, test_acc=result.test_acc,
                           epoch_seconds=round(seconds, 4),
                           samples_per_sec=round(result.samples_per_sec, 2),
                           wall_seconds=round(time.perf_counter() - started, 3),
                           **self.replica.take_epoch_metrics())
        return result

    def _learning_rate(self) -> float:
        return learning_rate(self.global_step, self.total_steps, self.steps_per_epoch,
                             self.cfg.optim, self.scheme.lr_scale)

    def evaluate(self) -> tuple[float | None, float | None]:
        """Test loss and accuracy over the whole test split: each evaluating worker scores its
        part and the parts are summed (sync), or worker 0 scores it all (async)."""
        if not self.evaluates:
            return None, None
        stats = self.scheme.eval_replica().evaluate(self.x_test, self.y_test)
        loss, correct, count = self.scheme.sum_across_workers(
            [stats.loss_sum.item(), stats.correct.item(), stats.count])
        return loss / count, correct / count
