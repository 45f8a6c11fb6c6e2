"""Preemption: SIGTERM (Kubernetes before it kills a pod, Slurm at the time limit, mpirun when it
is told to stop), SIGUSR1 (Slurm's ``--signal`` warning) and SIGINT (Ctrl-C) end training at a
step boundary with a step checkpoint instead of losing up to an epoch.

The handler only records the signal; the stopping component (stopping.py) asks the update scheme
after every step whether any worker has one (scheme.group.agree_to_stop), so every rank stops
after the same step and rank 0 writes the checkpoint. The job then exits with EXIT_PREEMPTED,
and ``--auto-resume`` continues from that step with the weights an uninterrupted run would have
had.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any, TextIO

from ..exit_codes import EXIT_PREEMPTED, STOP_SIGNALS, early_stops


class StopSignals:
    """Records the first stop signal; a second SIGINT interrupts at once (a user who means it)."""

    def __init__(self) -> None:
        self.received: str | None = None
        self._previous: dict[int, object] = {}
        # Whether this process says what the signal does. A parameter server does not: its
        # workers say it when a scheduler stops the job, and when mpirun ends the job because
        # a worker failed (a NaN loss), the server's "a checkpoint and exit 75" was untrue,
        # printed after the worker's real error.
        self.announce = True
        # Whether training has started (stopping.py, where the epochs start). A signal before
        # it is most often mpirun ending the job because another rank failed to start (a bad
        # flag, an unreadable checkpoint): "if a rank died, launch with recovery" was wrong
        # advice there, printed after that rank's real error.
        self.started = False
        self.in_fit = False  # hvdtrain.fit: no exit code, no flags (install)

    def install(self, in_fit: bool = False) -> None:
        """``in_fit``: under hvdtrain.fit, which returns after the stop instead of exiting."""
        self.received, self.started, self.in_fit = None, False, in_fit
        sys.stdout, sys.stderr = OutputThatMayBeGone.wrap(sys.stdout, sys.stderr)
        if threading.current_thread() is not threading.main_thread():
            return  # Python delivers signals to the main thread only: an embedding app's job
        for sig in STOP_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        if early_stops:  # while the process started (the command line's first handlers)
            self._handle(getattr(signal, early_stops[0]), None)
            early_stops.clear()

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
        sys.stdout, sys.stderr = OutputThatMayBeGone.unwrap(sys.stdout, sys.stderr)

    def _handle(self, signum: int, frame) -> None:
        if self.received is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        first = self.received is None
        self.received = self.received or signal.Signals(signum).name
        if first and self.announce:
            try:  # os.write: print() may be inside another print of this thread when it lands
                os.write(2, f"hvdtrain: {self.received} received by PID {os.getpid()}: "
                            f"{self._what_it_does(signum)}\n".encode())
            except OSError:
                pass  # the reader of this output is gone (OutputThatMayBeGone)

    def _what_it_does(self, signum: int) -> str:
        if self.in_fit:
            return ("finishing the current step, then a checkpoint; fit() then returns with "
                    "its preempted field set (call it again with auto_resume=True to continue)")
        if self.started:
            return (f"finishing the current step, then a checkpoint and exit {EXIT_PREEMPTED} "
                    f"(resume with --auto-resume){_mpirun_hint(signum)}{_recovery_hint(signum)}")
        return (f"before training started: {_start_hint()}it stops within its first steps, "
                f"with a checkpoint, and exits {EXIT_PREEMPTED}{_mpirun_hint(signum)}")


class OutputThatMayBeGone:
    """A training process's output, for as long as its stop signals are handled (install to
    restore): mpirun, told to stop, closes the ranks' output before its SIGTERM reaches them,
    and a write then fails (EIO, EPIPE). Where that error reached the training loop, a
    preempted run's stop line read "failed: [Errno 32] Broken pipe", with no checkpoint,
    instead of "preempted: SIGTERM". What is written to nobody is dropped; the run's log and
    checkpoints are files, and the stop signal that follows is handled as any other."""

    def __init__(self, stream: TextIO):
        self._stream = stream

    @classmethod
    def wrap(cls, *streams: Any) -> list[Any]:
        return [s if isinstance(s, cls) or s is None else cls(s) for s in streams]

    @classmethod
    def unwrap(cls, *streams: Any) -> list[Any]:
        return [s._stream if isinstance(s, cls) else s for s in streams]

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError:
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError:
            pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _mpirun_hint(signum: int) -> str:
    """Open MPI's mpirun forwards SIGTERM and SIGINT to the ranks and kills them
    odls_base_sigkill_timeout seconds later, 1 by default: too short for a checkpoint."""
    if signum == signal.SIGUSR1 or "OMPI_COMM_WORLD_RANK" not in os.environ or \
            "OMPI_MCA_odls_base_sigkill_timeout" in os.environ:
        return ""
    return ("; note: mpirun kills its ranks 1 s after a SIGTERM unless started with "
            "OMPI_MCA_odls_base_sigkill_timeout=60 (or more) in its environment")


def _start_hint() -> str:
    """Under mpirun, before training: most likely mpirun ending the job because another rank
    failed to start (a refused flag), so that comes first, and the stop only where it was not."""
    if "OMPI_COMM_WORLD_RANK" not in os.environ:
        return ""
    return ("if mpirun sent it, another rank's error above says why the job ends, and this rank "
            "ends with it; if a scheduler did, ")


def _recovery_hint(signum: int) -> str:
    """Without recovery, mpirun ends the whole job with SIGTERM when one rank dies."""
    from ..ps.membership import LAUNCH_HINT, recovery_enabled

    if signum != signal.SIGTERM or "OMPI_COMM_WORLD_RANK" not in os.environ or \
            recovery_enabled():
        return ""
    return f"; if mpirun sent it because a rank died: {LAUNCH_HINT}"


# The process's one set of handlers: the launch layer installs them for the whole life of a
# process's role (trainer or parameter server), so that a signal that lands while a role starts
# or ends is recorded too, rather than killing the process with the default action.
process_signals = StopSignals()
