"""`hvdtrain compare` stopped in the middle of a run (compare/runner.py): the run's job, in a
session of its own that neither Ctrl-C nor a SIGTERM to compare reaches, is stopped with it.
Before, a killed compare left the run's mpirun and ranks training on (and, in the slow-link
lab, its network namespaces behind: a SIGTERM skipped every finally clause)."""

import os
import signal
import subprocess
import sys
import time

import pytest

# The child compare: Ctrl-C at a terminal raises KeyboardInterrupt, but a job started in the
# background (CI's, nohup's) inherits SIGINT ignored, so the child puts Python's handler back.
CHILD = """
import signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)
from hvdtrain.compare.runner import _attempt, stop_on_sigterm
with open(sys.argv[2], "w") as log, stop_on_sigterm():
    _attempt(["sh", "-c", "echo $$ > " + sys.argv[1] + "; exec sleep 60"], log, 120)
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 128 + signal.SIGTERM),
                                       (signal.SIGINT, -signal.SIGINT)])  # Ctrl-C
def test_a_stopped_compare_stops_the_run_under_way(tmp_path, sig, code):
    pidfile = tmp_path / "job.pid"
    compare = subprocess.Popen([sys.executable, "-c", CHILD, str(pidfile),
                                str(tmp_path / "log")], stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while not (pidfile.is_file() and pidfile.read_text().strip()):
            assert time.monotonic() < deadline and compare.poll() is None, "no job started"
            time.sleep(0.05)
        job = int(pidfile.read_text())
        assert alive(job)
        compare.send_signal(sig)
        assert compare.wait(timeout=30) == code, compare.stderr.read().decode()
        deadline = time.monotonic() + 10
        while alive(job) and time.monotonic() < deadline:  # killed, then reaped by compare
            time.sleep(0.05)
        assert not alive(job), "the run's job outlived compare"
    finally:
        if compare.poll() is None:
            compare.kill()
            compare.wait()
