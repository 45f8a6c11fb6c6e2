"""``hvdtrain run LAUNCHER ...``: run a launcher (mpirun, horovodrun, srun, or hvdtrain train
alone) so that a preemption ends the job with exit code 75 (requeue me), whatever signals the
scheduler sends: Kubernetes sends SIGTERM to the container's first process, Slurm to every
process of the job, and both send SIGKILL after a grace period.

Why a wrapper: the launchers turn a SIGTERM or SIGINT into an abort. Open MPI's mpirun passes a
SIGTERM on to the ranks odls_base_sigkill_timeout seconds later, kills them as long again after,
and exits 1 whatever they returned; only a SIGUSR1 it forwards at once, then exits with the
ranks' code. horovodrun kills its ranks 5 s after a SIGTERM or SIGINT (its safe_shell_exec), and
exits 1 with a traceback when a rank exits with anything but 0. So this process stands between
the scheduler and the launcher:

- the launcher runs in a session of its own, so a terminal's Ctrl-C or a signal to this
  process's group reaches this process only;
- the first SIGTERM, SIGINT or SIGUSR1 is passed on as SIGUSR1 to every process of the
  launcher's tree that handles it: mpirun, which forwards it to every rank on every host, and
  the ranks on this host (horovodrun does not handle it, and is left alone). One rank is enough:
  the others learn of the stop from it (scheme.group.agree_to_stop, or the servers). A later
  signal is passed on as it is, and ends the launcher its own way;
- mpirun gets OMPI_MCA_odls_base_sigkill_timeout=60 unless it is set, so that ranks that Slurm
  signals directly have time for their checkpoint before mpirun's own abort kills them;
- a rank on this host that stopped with a checkpoint records it in the file named by
  PREEMPTED_FILE_ENV and exits 0 (cli.py), so that the launcher ends without an error of its
  own; when one did, this process exits 75 whatever the launcher returned, and otherwise with
  the launcher's code. Ranks elsewhere exit 75, which mpirun passes on after a SIGUSR1;
- once the record is there and no rank is left on this host, the launcher has LINGER_S seconds
  to end: mpirun that got a SIGTERM itself (Slurm) waits out its sigkill timeout once or twice
  even when every rank has ended, longer than a scheduler's grace period;
- a stop that comes while the ranks start, before every rank on this host has said that it has
  started (rank_started, in the file named by RANKS_FILE_ENV), is not passed on: mpirun
  would forward the SIGUSR1 to ranks that have no handler yet and die of it (then wait about 120 s in its abort), and a rank with one
  would first finish its start-up, which can take longer than a grace period. Nothing has
  trained yet, or a step or two of a rank that started first, which --auto-resume trains
  again: so the launcher and every process of its session are ended at once, and this process
  exits 75. A launcher whose ranks never say so (a command that is not hvdtrain, ranks only on
  other hosts) is ended the same way;
- the ranks on this host write their exit codes to that file too, and this process exits with
  the first non-zero one when there is one: mpirun under its recovery settings exits 0 or 1,
  and horovodrun 1, whatever code its ranks returned (2: bad input). A rank that refused its
  input (2) or failed (1) ends the job, and so does one that died without a code (killed,
  137) where the launcher does not survive it: LINGER_S later, or at once on a stop, the
  launcher and its processes are ended, rather than waiting out mpirun's abort under the
  sigkill timeout above (about 120 s), and the job exits with that code, not 75: a requeue
  of bad input would only be refused again.

This module imports nothing heavy (no torch): the wrapper must install its handler at once.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .exit_codes import EXIT_BAD_INPUT, EXIT_PREEMPTED, STOP_SIGNALS

PREEMPTED_FILE_ENV = "HVDTRAIN_PREEMPTED_FILE"
RANKS_FILE_ENV = "HVDTRAIN_RANKS_FILE"  # "ready PID LOCAL_SIZE" and "exit PID CODE" lines
SIGKILL_TIMEOUT_ENV = "OMPI_MCA_odls_base_sigkill_timeout"
SIGKILL_TIMEOUT_S = "60"  # one step plus a checkpoint write, as in deploy/
RESCAN_S = 0.5  # how often ranks that install their handlers late are looked for
LINGER_S = 5.0


def add_parser(commands) -> None:
    p = commands.add_parser(
        "run", help="run a launcher so that a preemption (SIGTERM) exits 75 after the checkpoint",
        description="Run LAUNCHER ARGS... (mpirun, horovodrun, srun, or hvdtrain train itself) "
                    "and pass a SIGTERM, SIGINT or SIGUSR1 on to the ranks as a stop, so that "
                    "the job ends after a checkpoint with exit code 75, which the Slurm and "
                    "Kubernetes files in deploy/ requeue. Example: hvdtrain run mpirun -np 4 "
                    "hvdtrain train --run-dir RUN --auto-resume",
        allow_abbrev=False)
    p.add_argument("launch_command", nargs=argparse.REMAINDER, metavar="LAUNCHER ARGS")


class StopRelay:
    """The wrapper's handler for the stop signals, installed before anything else it does (the
    flags, the launcher): a signal that lands meanwhile is recorded, never the end of it."""

    def __init__(self) -> None:
        self.received: list[int] = []
        self.launcher: subprocess.Popen | None = None
        self._previous = {sig: signal.signal(sig, self._handle) for sig in STOP_SIGNALS}

    def _handle(self, signum, frame) -> None:
        self.received.append(signum)
        if len(self.received) > 1 and self.launcher is not None:  # a second signal: the
            _send(self.launcher.pid, signum)  # launcher's own way, at once

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def main(args, relay: StopRelay | None = None) -> int:
    relay = relay or StopRelay()
    try:
        return _run(args.launch_command, relay)
    finally:
        relay.restore()


def _run(command: list[str], relay: StopRelay) -> int:
    if not command:
        print("hvdtrain run: give the command to run, e.g. hvdtrain run mpirun -np 2 hvdtrain "
              "train --run-dir RUN --auto-resume", file=sys.stderr, flush=True)
        return EXIT_BAD_INPUT
    if relay.received:  # before the launcher started: nothing to stop
        return _ended_before_training(relay)
    with tempfile.TemporaryDirectory(prefix="hvdtrain-run-") as folder:
        record, ranks = Path(folder) / "preempted", Path(folder) / "ranks"
        env = {**os.environ, PREEMPTED_FILE_ENV: str(record), RANKS_FILE_ENV: str(ranks)}
        env.setdefault(SIGKILL_TIMEOUT_ENV, SIGKILL_TIMEOUT_S)
        try:
            relay.launcher = subprocess.Popen(command, env=env, start_new_session=True,
                                              preexec_fn=_end_with_this_process)
        except OSError as e:
            print(f"hvdtrain run: cannot start {command[0]} ({e.strerror or e}); give a "
                  "launcher on PATH, e.g. hvdtrain run mpirun -np 2 hvdtrain train",
                  file=sys.stderr, flush=True)
            return EXIT_BAD_INPUT
        code = _supervise(relay, record, ranks)
        for folder in mpirun_session_folders(relay.launcher.pid):  # ended by force
            shutil.rmtree(folder, ignore_errors=True)
        if code is None:
            return _ended_before_training(relay)
        if record.exists():
            print(f"hvdtrain run: the job stopped after its checkpoint; exit {EXIT_PREEMPTED} "
                  f"(requeue: the same command with --auto-resume continues it)"
                  + (f"; the launcher's exit code {code}, and any error it printed, report that "
                     "stop" if code else ""), file=sys.stderr, flush=True)
            return EXIT_PREEMPTED
        return _job_code(code, ranks, stopped=bool(relay.received))


def _ended_before_training(relay: StopRelay) -> int:
    name = signal.Signals(relay.received[0]).name
    ended = ("the launcher and its processes were ended" if relay.launcher is not None else
             "the launcher was not started")
    print(f"hvdtrain run: {name} while the job started, before its ranks could stop at a step; "
          f"{ended}; exit {EXIT_PREEMPTED} (requeue: the same command continues it)",
          file=sys.stderr, flush=True)
    return EXIT_PREEMPTED


def _job_code(code: int, ranks: Path, stopped: bool) -> int:
    """The launcher's code, or the first non-zero code that a rank on this host returned where
    the launcher's says something else (mpirun's recovery settings: 0 or 1; horovodrun: 1)."""
    failed = _first_failure(ranks)
    # 137: a rank was killed, and the others' codes (1: Horovod shut down) followed from it
    if failed and failed != code and code != 128 + signal.SIGKILL:
        print(f"hvdtrain run: exit {failed}, the ranks' own code (the launcher's: {code})",
              file=sys.stderr, flush=True)
        return failed
    if stopped and code not in (0, EXIT_PREEMPTED) and not failed:
        print(f"hvdtrain run: the launcher exited {code} after the stop, and no rank recorded "
              "a checkpoint of it", file=sys.stderr, flush=True)
    return code


def _first_failure(ranks: Path) -> int:
    """The first error code a rank on this host recorded (0: none)."""
    return next((c for c in rank_lines(ranks, "exit").values() if c not in (0, EXIT_PREEMPTED)),
                0)


def _failed(ranks: Path) -> int:
    code = _first_failure(ranks)
    print(f"hvdtrain run: exit {code}, the ranks' own code; the launcher and the other ranks "
          "were ended", file=sys.stderr, flush=True)
    return code


def rank_lines(path: Path, kind: str) -> dict[int, int]:
    """PID -> value of the ``kind`` lines the ranks wrote (tell_wrapper), in order."""
    found: dict[int, int] = {}
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        words = line.split()
        if len(words) == 3 and words[0] == kind and words[1].isdigit() and \
                words[2].lstrip("-").isdigit():
            found.setdefault(int(words[1]), int(words[2]))
    return found


def ranks_ready(path: Path) -> bool:
    """Whether every rank on this host has said that it has started (rank_started): as many
    ready lines as the local size any of them names."""
    ready = rank_lines(path, "ready")
    return bool(ready) and len(ready) >= max(ready.values())


def rank_started(survivable: bool = False) -> None:
    """In a rank: tell `hvdtrain run` that this rank has started, its stop handler in place and
    its start-up over (MPI, the model, the checkpoint, the first broadcast: the trainer's first
    epoch, or a server's loop), so that a stop now costs a step and a checkpoint. A stop that
    comes before every rank on the host has said so ends the job's processes at once instead:
    a rank would first have to finish its start-up, which can take longer than a grace
    period, and a rank without a handler yet would die of it."""
    from .core_binding import local_size_hint
    from .loop.preemption import process_signals
    from .ps.membership import recovery_enabled

    tell_wrapper("ready", local_size_hint())
    # Its exit is recorded (cli.ended), and the job does not go on without it (no --elastic,
    # no mpirun recovery): gone without an exit line, it died, and so did the job (job_failed).
    if not (survivable or recovery_enabled() or process_signals.in_fit):
        tell_wrapper("watched", 1)


def tell_wrapper(kind: str, value: int) -> None:
    """In a rank under `hvdtrain run`: a line for the wrapper (``ready`` with the number of
    ranks on this host, once it has started; ``exit`` with its exit code)."""
    path = os.environ.get(RANKS_FILE_ENV)
    if not path:
        return
    try:
        with open(path, "a") as f:  # one short append per line: the ranks' lines never mix
            f.write(f"{kind} {os.getpid()} {value}\n")
    except OSError:
        pass  # another host's rank: the wrapper goes by the launcher's code


def _supervise(relay: StopRelay, record: Path, ranks: Path) -> int | None:
    """The launcher's exit code, or None where a stop came before the ranks had started and
    the launcher's processes were ended."""
    launcher = relay.launcher
    lingering_since: float | None = None  # the ranks here have ended after their checkpoint
    failed_since: float | None = None  # a rank here failed, or died (job_failed)
    died: int | None = None  # ... the PID of one that died without an exit code
    stopped: set[int] = set()  # processes sent the stop, so each gets it once
    started = False  # every rank here had started at some point: the stop is passed on
    while True:
        try:
            code = launcher.wait(timeout=RESCAN_S)
            break
        except subprocess.TimeoutExpired:
            pass
        started = started or ranks_ready(ranks)
        if failed_since is None and job_failed(ranks):
            failed_since, died = time.monotonic(), rank_died(ranks)
        if failed_since is not None and (relay.received or
                                         time.monotonic() - failed_since > LINGER_S):
            # The job is over: mpirun's abort of the other ranks waits out the sigkill timeout
            # set above, twice (about 120 s), and a stop meanwhile is no preemption to requeue.
            end_session(launcher)
            # The launcher's code now tells of that end (137 where its child's SIGKILL came
            # first, which read as a killed rank), so the code is the ranks' own.
            code = _died(died) if died is not None else _failed(ranks)
            break
        if relay.received and not started:
            end_session(launcher)
            return None
        handlers = _stop_handlers(launcher.pid)
        if relay.received:
            for pid in handlers - stopped:
                _send(pid, signal.SIGUSR1)
                stopped.add(pid)
        if lingering_since is None and record.exists() and not handlers - {launcher.pid}:
            lingering_since = time.monotonic()
        if lingering_since is not None and time.monotonic() - lingering_since > LINGER_S:
            code = _end_lingering(launcher)
            break
    return code if code >= 0 else 128 - code  # killed by a signal: the shell's convention


def job_failed(ranks: Path) -> bool:
    """Whether a rank on this host ended the job: it recorded an error's exit code (2: it
    refused its input; 1: an error in training, which ends the others too, Horovod's shutdown
    or MPI_Abort), or a rank watched for it died without a word (killed: 137, an out-of-memory
    kill; rank_started)."""
    exits = rank_lines(ranks, "exit")
    return any(code not in (0, EXIT_PREEMPTED) for code in exits.values()) or \
        rank_died(ranks, exits) is not None


def rank_died(ranks: Path, exits: dict[int, int] | None = None) -> int | None:
    """A watched rank (rank_started) that is gone without recording its exit code (``exits``:
    the exit lines, where the caller has read them already)."""
    exits = rank_lines(ranks, "exit") if exits is None else exits
    return next((pid for pid in rank_lines(ranks, "watched")
                 if pid not in exits and not _alive(pid)), None)


def _died(pid: int) -> int:
    """The job's code where a rank died of a signal, which its launcher can no longer say once
    it is ended (it waited out its sigkill timeout twice to say so): 137, SIGKILL's, the
    kernel's out-of-memory killer's and kill -9's."""
    code = 128 + signal.SIGKILL
    print(f"hvdtrain run: rank PID {pid} on this host ended without an exit code (killed, most "
          f"often by the kernel's out-of-memory killer or kill -9); the launcher and the other "
          f"ranks were ended; exit {code}", file=sys.stderr, flush=True)
    return code


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"  # a zombie has ended: its parent has not reaped it yet


def _end_lingering(launcher: subprocess.Popen) -> int:
    """Nothing of the job is left to wait for (the record says so). Two SIGINTs: mpirun's
    forced end, which still writes out the ranks' last lines; then a kill."""
    _send(launcher.pid, signal.SIGINT)
    time.sleep(0.2)
    _send(launcher.pid, signal.SIGINT)
    try:
        return launcher.wait(timeout=LINGER_S)
    except subprocess.TimeoutExpired:
        launcher.kill()
        return launcher.wait()


def end_session(launcher: subprocess.Popen) -> None:
    """End the launcher and every process of its session (its ranks, and any that left its
    tree). The ranks get SIGKILL; mpirun then aborts the job, which with the sigkill timeout
    set above takes it about 120 s, so it gets two SIGINTs (its forced end, as a second Ctrl-C),
    and a SIGKILL if still there after a moment (its session folder is then removed:
    mpirun_session_folders)."""
    for pid in session_members(launcher.pid) - {launcher.pid}:
        _send(pid, signal.SIGKILL)
    for _ in range(2):
        _send(launcher.pid, signal.SIGINT)
        time.sleep(0.2)
    try:
        launcher.wait(timeout=2.0)
    except subprocess.TimeoutExpired:
        pass
    for pid in session_members(launcher.pid):  # a rank started meanwhile, or the launcher
        _send(pid, signal.SIGKILL)
    launcher.wait()


def mpirun_session_folders(pid: int) -> list[Path]:
    """Open MPI's folder for mpirun ``pid`` (its ranks' shared-memory files, PMIx sockets),
    which a mpirun ended by force (end_session, _end_lingering) leaves behind:
    <tmpdir>/ompi.<host>.<uid>/pid.<pid>."""
    base = Path(os.environ.get("OMPI_MCA_orte_tmpdir_base") or tempfile.gettempdir())
    return [path for path in base.glob(f"ompi.*.{os.getuid()}/pid.{pid}") if path.is_dir()]


def session_members(session: int) -> set[int]:
    """The processes of session ``session`` (the launcher's: start_new_session) and of its
    tree, from /proc."""
    found = set(process_tree(session))
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 3 and fields[3] == str(session):  # state ppid pgrp session
            found.add(int(stat.parent.name))
    return found


def _stop_handlers(root: int) -> set[int]:
    """``root`` and the processes below it that handle SIGUSR1: mpirun and the ranks. Those that
    do not (horovodrun, its helpers, shells, loader processes) would die of it."""
    return {pid for pid in process_tree(root) if _handles(pid, signal.SIGUSR1)}


def process_tree(root: int) -> list[int]:
    """``root`` and every process below it, from /proc."""
    found, frontier = [], [root]
    while frontier:
        pid = frontier.pop()
        found.append(pid)
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                frontier += map(int, (task / "children").read_text().split())
            except OSError:
                continue
    return found


def _handles(pid: int, sig: int) -> bool:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except OSError:
        pass
    return False


def _send(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _end_with_this_process() -> None:
    """In the launcher, before it starts: a SIGTERM when this process dies (even of SIGKILL), so
    that the launcher, in a session of its own, is not left running."""
    PR_SET_PDEATHSIG = 1
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass  # not Linux: the launcher outlives a killed wrapper, as it would without one
