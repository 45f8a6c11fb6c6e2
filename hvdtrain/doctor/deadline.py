"""The doctor's deadline for a probe rank that no doctor launched (``mpirun ... hvdtrain
doctor``, ``srun ... hvdtrain doctor``). At the deadline rank 0 says why, in a problem line and in
doctor.json, and every rank exits 2 (not fit), which ends the launcher's job.

Two guards: a thread in the rank, which runs while the rank waits in MPI (mpi4py lets go of the
GIL there) and exits 2, three seconds before the deadline; and, at the deadline, ``python -m
hvdtrain.doctor.deadline PID SECONDS RANK JSON``, a process of its own for a rank that holds the
GIL (MPI's start-up, waiting for a rank that never started), which reports the same way and
kills it: the launcher then exits 137 (mpirun), and doctor.json says NOT fit. It leaves as soon
as its rank has ended."""

from __future__ import annotations

import os
import signal
import sys
import time

from ..processes import process_alive
from .problem import Problem
from .verdict import unfinished_report, write_and_judge

POLL_S = 0.5
GRACE_S = 3.0  # the process's deadline after the thread's


def report(seconds: float, rank: int, path: str) -> None:
    """At rank 0: the problem line, doctor.json, the verdict."""
    if rank != 0:
        return
    problem = Problem(
        "hosts", f"the ranks did not finish within {seconds:g} s: a rank hung, or MPI could "
        "not connect two hosts",
        "run the doctor with the job's launcher line (hvdtrain doctor mpirun ...), which "
        "names the step and the hosts; check the firewall between the hosts, or raise "
        "--timeout")
    print(problem.line(), flush=True)
    write_and_judge(path, unfinished_report(None, [problem], 0), 1, sys.stdout)


class Guards:
    """Both guards of one rank, stopped once the rank is done (before MPI's finalize)."""

    def __init__(self, seconds: float, rank: int, path: str) -> None:
        import subprocess
        import threading

        # the thread first, the process at the deadline itself: the doctor ends within it
        early = seconds - GRACE_S if seconds >= 2 * GRACE_S else seconds / 2
        self.timer = threading.Timer(early, self._expire, (early, rank, path))
        self.timer.daemon = True
        self.timer.start()
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "hvdtrain.doctor.deadline", str(os.getpid()),
                 f"{seconds:g}", str(rank), path])
        except OSError:
            self.process = None

    @staticmethod
    def _expire(seconds: float, rank: int, path: str) -> None:
        report(seconds, rank, path)
        os._exit(2)

    def stop(self) -> None:
        self.timer.cancel()
        if self.process is not None:
            self.process.kill()
            self.process.wait()


def main(argv: list[str]) -> int:
    pid, seconds, rank, path = int(argv[0]), float(argv[1]), int(argv[2]), argv[3]
    ends = time.monotonic() + seconds
    while time.monotonic() < ends:
        if not process_alive(pid):
            return 0
        time.sleep(POLL_S)
    if not process_alive(pid):  # the rank's own thread ended it meanwhile
        return 0
    report(seconds, rank, path)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
