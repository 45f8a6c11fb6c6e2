"""Which checkpoint a run continues, if any: --resume, or the run folder's own under
--auto-resume, and the refusals that keep a run folder's checkpoint from being replaced by
another run (see checkpointer.py). Worker 0 decides; the scheme tells the others
(scheme.group.main_decides), so a bad choice stops every rank with the same message."""

from __future__ import annotations

import zipfile
from pathlib import Path

from .. import checkpoint
from ..config import RunConfig
from ..scheme import UpdateScheme


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
