"""Which checkpoint a run continues, if any: --resume, or the run folder's own under
--auto-resume, and the refusals that keep a run folder's checkpoint from being replaced by
another run (see checkpointer.py). Worker 0 decides; the scheme tells the others
(scheme.group.main_decides), so a bad choice stops every rank with the same message."""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

from .. import checkpoint
from ..config import Config, DataConfig, RunConfig
from ..scheme import Progress, UpdateScheme


def resume_source(run: RunConfig, run_dir: Path, auto_resume: bool,
                  scheme: UpdateScheme) -> str | None:
    """--resume, or the run folder's checkpoint under --auto-resume; None for a fresh run.
    ``run_dir``: the folder this run writes into (claimed by the checkpointer)."""
    path = run_dir / checkpoint.CHECKPOINT_NAME
    if run.resume and run.run_dir:
        return _resume_into_other_folder(run, run_dir, auto_resume, scheme)
    if run.resume:
        _check_resume_is_latest(run, run_dir, scheme)
        return run.resume
    if not run.run_dir:
        return None

    def decide() -> dict[str, str] | None:
        if not path.exists():
            return None
        if auto_resume:
            return {"resume": run.run_dir}
        return {"error": (
            f"{run.run_dir} already holds a checkpoint ({path}) and this run would "
            f"overwrite it; continue that run with --resume {run.run_dir} (or "
            f"--auto-resume), or pass another --run-dir for a new run")}

    decision = scheme.group.main_decides(decide)
    if decision and "error" in decision:
        raise checkpoint.CheckpointError(decision["error"])
    if decision and scheme.group.leads():
        print(f"hvdtrain: continuing the checkpoint in {run.run_dir}", flush=True)
    return decision["resume"] if decision else None


def _check_resume_is_latest(run: RunConfig, run_dir: Path, scheme: UpdateScheme) -> None:
    """--resume FILE without --run-dir writes into FILE's folder, which is right only when
    FILE is that folder's latest checkpoint. Another file there (best.pt, a copy of an older
    checkpoint) would replace the run's checkpoint.pt and mix a second branch into its log,
    so it is refused with the command that branches into a new folder. Refused rather than
    sent to a new default folder: a requeued job repeats its command, and with a new folder
    each time it would start from FILE again and lose what it trained; with --run-dir NEW,
    --auto-resume continues NEW's own checkpoint (_resume_into_other_folder)."""
    path = run_dir / checkpoint.CHECKPOINT_NAME

    def decide() -> dict[str, str] | None:
        source = checkpoint.checkpoint_path(run.resume)
        if not path.exists() or source.resolve() == path.resolve():
            return None
        beside = checkpoint.checkpoint_beside(source)
        if beside is not None and beside.is_file():  # loop/own_state.py, ps/shard_file.py
            what = {"server": "a parameter server's shard",
                    "worker": "a worker's own state"}[checkpoint.file_owner(source)]
            return {"error": f"--resume {run.resume}: {source.name} is "
                             f"{checkpoint.not_a_checkpoint(what, beside)}"}
        if not source.exists():  # a best.pt that --keep-best never wrote: no branch either
            kept = sorted(p.name for p in run_dir.glob("*.pt")
                          if checkpoint.file_owner(p) is None)
            return {"error": f"--resume {run.resume}: there is no {source.name} in {run_dir} "
                             f"(its checkpoints: {', '.join(kept)}); continue the run with "
                             f"--resume {run_dir}"}
        if source.is_file() and not zipfile.is_zipfile(source):  # the log, a note: no branch
            return {"error": f"--resume {run.resume}: {source.name} is not a checkpoint (not a "
                             f"torch zip archive); continue the run with --resume {run_dir}"}
        branch = run_dir.with_name(f"{run_dir.name}-from-{source.stem}")
        return {"error": (
            f"--resume {run.resume}: {source.name} is not the latest checkpoint of "
            f"{run_dir} ({path} is), and this run would write into that folder, "
            f"replacing its checkpoint.pt and mixing a second branch into its log; train "
            f"from {source.name} in a new folder with --resume {run.resume} --run-dir "
            f"{branch}, or continue the run itself with --resume {run_dir}")}

    decision = scheme.group.main_decides(decide)
    if decision:
        raise checkpoint.CheckpointError(decision["error"])


def _resume_into_other_folder(run: RunConfig, run_dir: Path, auto_resume: bool,
                              scheme: UpdateScheme) -> str:
    """--resume A --run-dir B: B's own checkpoint, when it has one, belongs to the run in B.
    Under --auto-resume that is this run, requeued after it wrote B's checkpoint (which is
    newer than A); otherwise it is another run, and resuming A would overwrite it."""
    path = run_dir / checkpoint.CHECKPOINT_NAME

    def decide() -> dict[str, str]:
        if not path.exists() or \
                checkpoint.checkpoint_path(run.resume).resolve() == path.resolve():
            return {"resume": run.resume}
        if auto_resume:
            return {"resume": str(run_dir), "note": (
                f"hvdtrain: {run_dir} holds this run's own checkpoint, newer than "
                f"--resume {run.resume}; continuing it")}
        return {"error": (
            f"--resume {run.resume} --run-dir {run.run_dir}: {path} holds another "
            f"run's checkpoint, which this run would overwrite; continue that run with "
            f"--resume {run.run_dir}, add --auto-resume if it is this run requeued, or pass "
            "another --run-dir")}

    decision = scheme.group.main_decides(decide)
    if "error" in decision:
        raise checkpoint.CheckpointError(decision["error"])
    if "note" in decision and scheme.group.leads():
        print(decision["note"], flush=True)
    return decision["resume"]


# What decides the samples a run trains and tests on. A resume that changed the split tested
# on samples the checkpoint had trained on (digits, --data-seed 1: test_acc 0.93 against 0.91
# for the same run uninterrupted), and one that changed the data trained on other samples;
# neither was said (a resume may mean to fine-tune on other data, so it is not refused).
DATA_IDENTITY = ("dataset", "dataset_args", "data_path", "test_fraction", "data_seed",
                 "synthetic_samples", "synthetic_shape", "synthetic_classes")


def global_batch(planned: dict[str, Any], progress: Progress, batch_size: int) -> int:
    """The checkpoint's global batch (``planned``: its run options; ``batch_size``: this
    run's, where it has none). An epoch is one order of global batches: with the same global
    batch, however split, the order is the uninterrupted run's (2 x 32 onto 1 x 64)."""
    batch = planned.get("batch_size")
    return (batch if isinstance(batch, int) else batch_size) * progress.workers


def note_changes(source: str, data: dict[str, Any] | None, written: int, cfg: Config,
                 num_workers: int) -> None:
    """Worker 0's warnings, where a resume with something left to train reads its data in
    another order (``written``: the checkpoint's global batch) or other data (``data``: the
    checkpoint's data options)."""
    if written != cfg.run.batch_size * num_workers:
        print(f"hvdtrain: warning: checkpoint was written with a global batch of {written} "
              f"samples, this run's is {cfg.run.batch_size} x {num_workers} workers; the "
              "data order differs from an uninterrupted run", flush=True)
    note_data_change(data, cfg.data, source)


def note_data_change(saved: dict[str, Any] | None, data: DataConfig, source: str) -> None:
    """Warn where the checkpoint's run read other data, or split it otherwise."""
    if not isinstance(saved, dict):
        return

    def plain(value: Any) -> Any:
        return list(value) if isinstance(value, (tuple, list)) else value

    changed = [f"--{name.replace('_', '-')} {plain(saved[name])!r} -> {plain(now)!r}"
               for name in DATA_IDENTITY if name in saved
               for now in [getattr(data, name)] if plain(saved[name]) != plain(now)]
    if changed:
        print(f"hvdtrain: warning: the checkpoint {source} was trained on other data or another "
              f"split ({', '.join(changed)}): this run's test split may hold samples it trained "
              "on, so its test figures can read too high; resume with the checkpoint's data "
              "options to continue the same run", flush=True)
