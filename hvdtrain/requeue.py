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
  the others learn of the stop from it (UpdateScheme.agree_to_stop, or the servers). A later
  signal is passed on as it is, and ends the launcher its own way;
- mpirun gets OMPI_MCA_odls_base_sigkill_timeout=60 unless it is set, so that ranks that Slurm
  signals directly have time for their checkpoint before mpirun's own abort kills them;
- a rank on this host that stopped with a checkpoint records it in the file named by
  PREEMPTED_FILE_ENV and exits 0 (cli.py), so that the launcher ends without an error of its
  own; when one did, this process exits 75 whatever the launcher returned, and otherwise with
  the launcher's code. Ranks elsewhere exit 75, which mpirun passes on after a SIGUSR1;
- once the record is there and no rank is left on this host, the launcher has LINGER_S seconds
  to end: mpirun that got a SIGTERM itself (Slurm) waits out its sigkill timeout once or twice
  even when every rank has ended, longer than a scheduler's grace period.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .exit_codes import EXIT_BAD_INPUT, EXIT_PREEMPTED
from .loop.preemption import STOP_SIGNALS

PREEMPTED_FILE_ENV = "HVDTRAIN_PREEMPTED_FILE"
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


def main(args) -> int:
    command = args.launch_command
    if not command:
        print("hvdtrain run: give the command to run, e.g. hvdtrain run mpirun -np 2 hvdtrain "
              "train --run-dir RUN --auto-resume", file=sys.stderr, flush=True)
        return EXIT_BAD_INPUT
    with tempfile.TemporaryDirectory(prefix="hvdtrain-run-") as folder:
        record = Path(folder) / "preempted"
        env = {**os.environ, PREEMPTED_FILE_ENV: str(record)}
        env.setdefault(SIGKILL_TIMEOUT_ENV, SIGKILL_TIMEOUT_S)
        try:
            launcher = subprocess.Popen(command, env=env, start_new_session=True,
                                        preexec_fn=_end_with_this_process)
        except OSError as e:
            print(f"hvdtrain run: cannot start {command[0]} ({e.strerror or e}); give a "
                  "launcher on PATH, e.g. hvdtrain run mpirun -np 2 hvdtrain train",
                  file=sys.stderr, flush=True)
            return EXIT_BAD_INPUT
        code = _supervise(launcher, record)
        if record.exists():
            print(f"hvdtrain run: the job stopped after its checkpoint; exit {EXIT_PREEMPTED} "
                  f"(requeue: the same command with --auto-resume continues it)"
                  + (f"; the launcher's exit code {code}, and any error it printed, report that "
                     "stop" if code else ""), file=sys.stderr, flush=True)
            return EXIT_PREEMPTED
        return code


def _supervise(launcher: subprocess.Popen, record: Path) -> int:
    received: list[int] = []
    lingering_since: float | None = None  # the ranks here have ended after their checkpoint

    def handle(signum, frame):
        received.append(signum)
        if len(received) > 1:  # a second signal: the launcher's own way, at once
            _send(launcher.pid, signum)

    previous = {sig: signal.signal(sig, handle) for sig in STOP_SIGNALS}
    stopped: set[int] = set()  # processes sent the stop, so each gets it once
    try:
        while True:
            try:
                code = launcher.wait(timeout=RESCAN_S)
                break
            except subprocess.TimeoutExpired:
                pass
            handlers = _stop_handlers(launcher.pid)
            if received:
                for pid in handlers - stopped:
                    _send(pid, signal.SIGUSR1)
                    stopped.add(pid)
            if lingering_since is None and record.exists() and not handlers - {launcher.pid}:
                lingering_since = time.monotonic()
            if lingering_since is not None and time.monotonic() - lingering_since > LINGER_S:
                # Nothing of the job is left to wait for (the record says so). Two SIGINTs:
                # mpirun's forced end, which still writes out the ranks' last lines; then a kill.
                _send(launcher.pid, signal.SIGINT)
                time.sleep(0.2)
                _send(launcher.pid, signal.SIGINT)
                try:
                    code = launcher.wait(timeout=LINGER_S)
                    break
                except subprocess.TimeoutExpired:
                    launcher.kill()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return code if code >= 0 else 128 - code  # killed by a signal: the shell's convention


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
