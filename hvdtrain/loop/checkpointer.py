"""The run folder and its checkpoint: which folder this run owns (locked, see run_lock.py),
whether the run continues a checkpoint, reading it on the right processes, and when to write the
next (every N epochs, every N steps, at the end).

A run folder's checkpoint is only ever replaced by the run that owns it: a fresh run refuses a
--run-dir that holds one unless it continues it (--resume, --auto-resume), --resume A --run-dir B
refuses a B that holds another run's, and --resume FILE alone (which writes into FILE's folder)
refuses a FILE that is not that folder's latest checkpoint, such as best.pt. Worker 0 decides and
reads; the scheme tells the others (see scheme.group.main_decides), so a bad file stops every
rank with the same message.
"""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

from .. import checkpoint
from ..config import Config, ConfigError
from ..faults.inject import FiredRecord, record_folder
from ..models import count_parameters
from ..run_lock import LOCK_NAME, FolderLock
from ..scheme import Progress, UpdateScheme
from ..trackers.state import CheckpointRecord
from . import own_state
from .checkpoint_writer import CheckpointWriter
from .hooks import TrainingError
from .resume_source import global_batch, note_changes, resume_source


def default_run_dir(cfg: Config, data_name: str, model_name: str) -> Path:
    run = cfg.run
    if run.run_dir:
        return Path(run.run_dir)
    if run.resume:  # keep writing into the run being resumed
        return checkpoint.checkpoint_path(run.resume).parent
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    label = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{run.mode}-{data_name}-{model_name}")[:80]
    return Path("runs") / f"{stamp}-{label}"


def checkpoint_due(run, epochs_done: int) -> bool:
    """Whether a run writes its checkpoint once ``epochs_done`` epochs are done: every
    --checkpoint-every epochs, and after the last (the simulator asks it too, compare/sim/)."""
    every = run.checkpoint_every
    return epochs_done == run.epochs or bool(every and epochs_done % every == 0)


def make_fresh_folder(folder: Path) -> Path:
    """``folder``, or ``folder-2``, ``folder-3``... when a run that started in the same second
    took it: mkdir is atomic, so two runs never get the same default folder."""
    candidate, n = folder, 1
    while True:
        try:
            candidate.mkdir(parents=True)
            return candidate
        except FileExistsError:
            n += 1
            candidate = folder.with_name(f"{folder.name}-{n}")


def remove_if_unused(folder: Path) -> None:
    """Remove a run folder that this run created and left with nothing but its lock (it was
    refused before it wrote anything), so that a refused run leaves no folder behind."""
    try:
        if {p.name for p in folder.iterdir()} <= {LOCK_NAME}:
            (folder / LOCK_NAME).unlink(missing_ok=True)
            folder.rmdir()
    except OSError:
        pass  # in use again, or not ours to remove: leave it


def run_identity(cfg: Config, workload, model) -> dict[str, Any]:
    """What must match for a checkpoint to be loadable into this run."""
    return {"mode": cfg.run.mode, "model": workload.name, **workload.identity(),
            "num_parameters": count_parameters(model), "optimizer": cfg.optim.optimizer}


class Checkpointer:
    def __init__(self, cfg: Config, scheme: UpdateScheme, run_dir: Path,
                 identity: Callable[[], dict[str, Any]], model_state: Callable[[], dict]):
        self.cfg = cfg
        self.run = cfg.run
        self.scheme = scheme
        self.run_dir = run_dir
        self.identity = identity        # what must match for a checkpoint to load into this run
        self.model_state = model_state  # this run's model.state_dict(), to name a mismatch
        self.resumed_from: str | None = None
        self.lock: FolderLock | None = None
        self.taken_over = False  # this worker became the lead mid-run (take_over)
        self._made_folder = False  # claim() created the run folder (release() may remove it)
        # The --stop-at target that the resumed checkpoint's run reached already (restore)
        self.finished_target: str | None = None
        # Elastic training starts processes during the run (an added host); they find the
        # checkpoint this run wrote and must continue the run, so elastic implies auto-resume.
        self.auto_resume = cfg.run.auto_resume or cfg.sync.elastic
        # Other components' own state (state_dict/load_state_dict), saved under their names.
        self.components: dict[str, Any] = {}
        if cfg.run.tracker:  # --tracker's run ids (tracker.json) ride in every checkpoint
            self.components["trackers"] = CheckpointRecord(lambda: self.run_dir, cfg.run.resume)
        if cfg.run.inject_faults and record_folder(cfg.run.run_dir, cfg.run.resume):
            # the faults fired so far: a resume into another folder meets none of them again
            self.components["faults_fired"] = FiredRecord(lambda: self.run_dir, cfg.run.resume)
        # --async-checkpoint: writes in a background thread (checkpoint_writer.py), on worker 0
        self.writer = CheckpointWriter() if cfg.run.async_checkpoint else None

    @property
    def path(self) -> Path:
        return self.run_dir / checkpoint.CHECKPOINT_NAME

    def _is_main(self) -> bool:
        return self.scheme.group.leads()

    # --- the folder -----------------------------------------------------------------------------
    def claim(self) -> Path:
        """Collective: worker 0 locks the run folder (a default folder gets a name no other run
        has) and every worker learns which folder it is. Held until release()."""
        chosen = bool(self.run.run_dir or self.run.resume)

        def decide() -> dict[str, Any] | None:
            if not self._is_main():  # elastic: every process decides; rank 0 alone locks
                return None
            try:
                # (a --run-dir that is a file was refused by config.check_writable_folder)
                folder = self.run_dir if chosen else make_fresh_folder(self.run_dir)
                self._made_folder = not chosen or not folder.exists()
                lock = FolderLock(folder)
                lock.acquire()
            except ConfigError as e:
                return {"error": str(e)}
            except OSError as e:
                return {"error": f"--run-dir {self.run_dir}: cannot create it ({e.strerror or e}); "
                                 "pass a folder you can write to"}
            self.lock = lock
            return {"run_dir": str(folder)}

        answer = self.scheme.group.main_decides(decide)
        if answer and "error" in answer:
            raise ConfigError(answer["error"])
        if answer:
            self.run_dir = Path(answer["run_dir"])
        return self.run_dir

    def take_over(self) -> None:
        """This worker became the lead mid-run (async, loop/lead.py): it holds the run folder's
        lock from here on, since the kernel freed the lost lead's with its process, and
        removes a checkpoint write that the lost lead left half done."""
        self.taken_over = True
        self._hold_lock()
        for tmp in checkpoint.remove_stale_temporaries(self.run_dir):
            print(f"hvdtrain: removed {tmp}, left by the lost lead's unfinished checkpoint "
                  "write", flush=True)

    def _hold_lock(self) -> None:
        """Take the run folder's lock if this lead does not hold it; a lost lead that is
        frozen rather than dead still holds it, so the next checkpoint tries again."""
        if self.lock is not None:
            return
        lock = FolderLock(self.run_dir)
        try:
            lock.acquire()
        except ConfigError:  # FolderInUse: held for this same job by the frozen process
            return
        self.lock = lock

    def release(self) -> None:
        """Where the run ends, also after an error: the write in flight finishes first (a
        write error not yet raised is printed, so that no other error hides it)."""
        try:
            self.finish_writes()
        except Exception as e:  # noqa: BLE001 - printed, not raised: see the docstring
            print(f"hvdtrain: error: {e}", flush=True)
        if self.lock is not None:
            self.lock.release()
            self.lock = None
            if self._made_folder:
                remove_if_unused(self.run_dir)

    # --- resume ---------------------------------------------------------------------------------
    def restore(self, num_workers: int) -> tuple[dict[str, Any] | None, Progress]:
        """(the checkpoint's state where it was read, else None; where training starts)."""
        if self._is_main() and self.run_dir.is_dir():
            for tmp in checkpoint.remove_stale_temporaries(self.run_dir):
                print(f"hvdtrain: removed {tmp}, left by a process killed while it wrote a "
                      "checkpoint", flush=True)
        source = resume_source(self.run, self.run_dir, self.auto_resume, self.scheme)
        self.resumed_from = source
        if source is None:
            return None, Progress(workers=num_workers)
        state: dict[str, Any] | None = None

        def read() -> dict[str, Any]:
            nonlocal state
            try:
                state = checkpoint.load(source)
                identity = self.identity()
                # The parameter count last: the state check names the first tensor that differs.
                checkpoint.check_compatible(
                    state, {k: v for k, v in identity.items() if k != "num_parameters"}, source)
                checkpoint.check_model_state(state["model"], self.model_state(), source)
                checkpoint.check_compatible(state, identity, source)
            except checkpoint.CheckpointError as e:
                return {"error": str(e)}
            planned = ((state.get("config") or {}).get("run") or {})
            return {"progress": Progress(state["epoch"], state.get("step", 0),
                                         state["global_step"], state["num_workers"]),
                    "finished": state.get("finished"), "planned": planned,
                    "data": (state.get("config") or {}).get("data")}

        answer = self.scheme.group.main_decides(read)
        if "error" in answer:
            raise checkpoint.CheckpointError(answer["error"])
        progress = answer["progress"]
        self.finished_target = self._target_reached(answer.get("finished"))
        self._check_branch_has_work(progress, checkpoint.checkpoint_path(source))
        written = global_batch(answer.get("planned", {}), progress, self.run.batch_size)
        self._check_epochs_left(progress, source, answer.get("planned", {}), num_workers)
        self._note_schedule(answer.get("planned", {}).get("epochs"), progress)
        if state is not None:
            for name, component in self.components.items():
                component.load_state_dict(state.get(name))
        self.scheme.group.checkpoint_place = self._place(checkpoint.checkpoint_path(source),
                                                         progress)
        self._restore_own_state(checkpoint.checkpoint_path(source), progress)
        if self._is_main() and (progress.epoch, progress.step) < (self.run.epochs, 0):
            note_changes(source, answer.get("data"), written, self.cfg, num_workers)
        return state, progress

    def _own_tag(self, progress: Progress) -> dict[str, Any]:
        return own_state.position(self.identity(), progress.epoch, progress.step,
                                  self.scheme.group.workers()[0])

    def _place(self, path: Path, progress: Progress) -> tuple[str, dict[str, Any]]:
        """Group.checkpoint_place for the checkpoint ``path`` at ``progress``: the path as
        every process of the job finds it, whatever folder it started in."""
        return str(path.resolve()), own_state.checkpoint_position(
            self.identity(), progress.epoch, progress.step)

    def _restore_own_state(self, source: Path, progress: Progress) -> None:
        """A worker other than the lead takes its own state back from its file beside the
        checkpoint (own_state.py), or says why it starts from the lead's."""
        own = self.scheme.group.own_state
        if own is not None and not self._is_main():
            own_state.restore(own, source, self._own_tag(progress))

    def _target_reached(self, finished: dict[str, Any] | None) -> str | None:
        """How the checkpoint's run reached this run's --stop-at target, where it ended there
        (the record of loop/stopping.py); None where it did not, or this run asks for another
        target (or none), and so trains on."""
        if not finished or not self.run.stop_at.strip() or \
                finished.get("target") != self.run.stop_at.strip():
            return None
        return str(finished.get("reached"))

    def _check_branch_has_work(self, progress: Progress, source: Path) -> None:
        """--resume FINISHED --run-dir NEW would leave NEW with a header and nothing else:
        refused before the log is opened (release() removes the folder that claim made)."""
        run = self.run
        done = progress.epoch == run.epochs or self.finished_target is not None
        if not (done and run.resume and run.run_dir and
                source.resolve() != self.path.resolve()):
            return
        why = (f"reached its --stop-at target ({self.finished_target})" if self.finished_target
               else f"has finished all {run.epochs} epoch(s)")
        further = ("another --stop-at target, or none" if self.finished_target
                   else f"--epochs {progress.epoch + 1} or more")
        raise ConfigError(f"--resume {run.resume} --run-dir {run.run_dir}: the checkpoint "
                          f"{why}; nothing is left to train into {run.run_dir}. Pass "
                          f"{further} to train further from it")

    def _check_epochs_left(self, progress: Progress, source: str, planned: dict,
                           num_workers: int) -> None:
        epochs, step = self.run.epochs, progress.step
        trained = f"{progress.epoch} epoch(s)" + (
            f" and {step} step(s) of epoch {progress.epoch + 1}" if step else "")
        if progress.epoch > epochs or (progress.epoch == epochs and step):
            raise ConfigError(
                f"--epochs {epochs}: the checkpoint {source} has trained {trained} already, "
                f"more than this run asks for; to train further pass --epochs "
                f"{progress.epoch + 1} or more (the learning-rate schedule follows --epochs)")
        batch = planned.get("batch_size")
        if step and isinstance(batch, int) and batch != self.run.batch_size:
            # Its steps count global batches of the old size: the position is the samples they
            # took, a whole number of this run's global batches (sync's epoch is one order of
            # global batches); else the rest of the epoch would train some samples twice or
            # skip some, without a word. Async's plan is the job's, and is not converted.
            samples, ours = step * batch * progress.workers, self.run.batch_size * num_workers
            if self.run.mode != "sync" or samples % ours:
                raise ConfigError(
                    f"--batch-size {self.run.batch_size}: the checkpoint {source} stopped inside "
                    f"an epoch ({trained}) trained with --batch-size {batch} x "
                    f"{progress.workers} workers, {samples} samples"
                    + (f", no whole number of this run's global batches of {ours}"
                       if self.run.mode == "sync" else "")
                    + f"; finish that epoch with --batch-size {batch} (and --epochs "
                    f"{progress.epoch + 1}), then go on with the new size")
            progress.step, progress.workers = samples // ours, num_workers
        if progress.epoch == epochs and self._is_main():
            print(f"hvdtrain: the checkpoint {source} has finished all {epochs} epoch(s); "
                  f"nothing is left to train (pass --epochs {epochs + 1} or more to train "
                  "further)", flush=True)

    def _note_schedule(self, planned: Any, progress: Progress) -> None:
        """A decaying --lr-schedule follows --epochs: a resume that plans another number of
        epochs than the checkpoint's run goes on along the new schedule, so a cosine that had
        decayed to its end rises again. Said once, since nothing else shows it."""
        epochs, schedule = self.run.epochs, self.cfg.optim.lr_schedule
        if (schedule == "constant" or not isinstance(planned, int) or planned == epochs
                or not progress.global_step or not self._is_main()):
            return
        print(f"hvdtrain: note: the checkpoint's run planned {planned} epoch(s) and this one "
              f"{epochs}; --lr-schedule {schedule} follows --epochs, so the rate goes on from "
              f"epoch {progress.epoch + 1} along the {epochs}-epoch schedule, not the one the "
              f"checkpoint trained on (a decay that had ended rises again)", flush=True)

    # --- cadence --------------------------------------------------------------------------------
    def step_done(self, before: int, progress: Progress, steps_per_epoch: int) -> None:
        """After a step from global step ``before`` to ``progress.global_step`` (more than one
        for an async worker, whose steps skip the others')."""
        every = self.run.checkpoint_steps
        # The epoch's last step is left to epoch_done, which writes its own checkpoint.
        if every and progress.global_step // every > before // every and \
                progress.step < steps_per_epoch:
            self.save(progress)

    def epoch_done(self, progress: Progress, last: bool = False) -> None:
        if last or checkpoint_due(self.run, progress.epoch):
            self.save(progress)

    def save(self, progress: Progress, path: Path | None = None) -> Path | None:
        """A checkpoint after ``progress.epoch`` whole epochs and ``progress.step`` steps of the
        next one, to ``path`` (default: checkpoint.pt). Collective (the async scheme asks the
        servers); worker 0 writes it, now or (--async-checkpoint) from a copy in the background,
        after the write before it. A worker with state of its own (group.own_state: async
        DiLoCo's inner optimizer) writes that beside it, now (own_state.py)."""
        path = path or self.path
        self.scheme.group.checkpoint_place = self._place(path, progress)
        state = self.scheme.state_dict()
        if not self._is_main():
            own = self.scheme.group.own_state  # its own state, beside the lead's checkpoint
            return None if own is None else \
                own_state.save(own.state_dict(), path, self._own_tag(progress))
        if self.taken_over:
            self._hold_lock()
        state = {**state, "identity": self.identity(), "epoch": progress.epoch,
                 "step": progress.step, "global_step": progress.global_step,
                 "num_workers": progress.workers, "config": self.cfg.to_record(),
                 **{name: c.state_dict() for name, c in self.components.items()}}
        where = (f"epoch {progress.epoch}" if not progress.step
                 else f"epoch {progress.epoch + 1}, step {progress.step}")
        if self.writer is None:
            return self._write(state, path, where)
        self.writer.submit(state, lambda copy: self._write(copy, path, where))
        return path

    def finish_writes(self) -> None:
        """Wait for the checkpoint write in flight (--async-checkpoint); TrainingError if it
        failed. Before a stop is reported and before the process ends."""
        if self.writer is not None:
            self.writer.wait()

    def _write(self, state: dict[str, Any], path: Path, where: str) -> Path:
        try:
            return checkpoint.save_atomic(state, path)
        except checkpoint.CheckpointWriteError as e:  # full disk, quota, lost mount
            kept = (f"the previous checkpoint {path} is intact; free space and continue "
                    f"with --resume {self.run_dir}" if path.exists()
                    else "no earlier checkpoint exists")
            raise TrainingError(f"could not write the {where} checkpoint to {path} "
                                f"({e}); {kept}") from None
