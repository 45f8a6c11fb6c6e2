"""``python -m hvdtrain.doctor.deadline PID SECONDS RANK JSON``: the doctor's deadline for a
probe rank that no doctor launched (``mpirun ... hvdtrain doctor``). A rank blocked in MPI (a
peer that hangs, two hosts MPI cannot connect) runs no Python, so a process of its own watches
it: at the deadline, rank 0's says why in a problem line and doctor.json, and each rank is
killed, which ends the launcher's job. It leaves as soon as its rank has ended."""

from __future__ import annotations

import os
import signal
import sys
import time

from .problem import Problem
from .verdict import unfinished_report, write_json

POLL_S = 0.5


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def main(argv: list[str]) -> int:
    pid, seconds, rank, path = int(argv[0]), float(argv[1]), int(argv[2]), argv[3]
    ends = time.monotonic() + seconds
    while time.monotonic() < ends:
        if not alive(pid):
            return 0
        time.sleep(POLL_S)
    if rank == 0:
        problem = Problem(
            "hosts", f"the ranks did not finish within {seconds:g} s: a rank hung, or MPI could "
            "not connect two hosts",
            "run the doctor with the job's launcher line (hvdtrain doctor mpirun ...), which "
            "names the step and the hosts; check the firewall between the hosts, or raise "
            "--timeout")
        print(problem.line(), flush=True)
        write_json(path, unfinished_report(None, [problem], 0))
        print("doctor: NOT fit (1 problem)", flush=True)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
