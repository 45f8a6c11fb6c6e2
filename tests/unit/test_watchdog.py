"""loop/watchdog.py: where a stalled rank is, read from its main thread, and what the watchdog
says and logs before it ends a job whose ranks all still run (one stuck in its own code)."""

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

from hvdtrain.loop import watchdog
from hvdtrain.requeue import RANKS_FILE_ENV
from hvdtrain.loop.watchdog import HEARTBEAT_DIR, WAITS, StallWatchdog, main_thread_place


def test_the_main_threads_place_is_its_innermost_line():
    seen = []

    def look():
        time.sleep(0.3)  # the main thread is in stuck_forward by then
        seen.append(main_thread_place())

    def stuck_forward():
        looker.join()

    looker = threading.Thread(target=look)
    looker.start()
    stuck_forward()
    # the innermost line outside the standard library, and the library call it waits in
    assert seen[0].startswith(f"in {__file__}:"), seen
    assert seen[0].endswith("(stuck_forward), inside threading.py: _wait_for_tstate_lock"), seen


def test_the_rank_outside_the_collective_is_named(tmp_path, monkeypatch):
    folder = tmp_path / HEARTBEAT_DIR
    folder.mkdir()
    (folder / "rank-1").write_text("hostb 4242\nin /home/u/model.py:9 (forward)\n")
    (folder / "rank-2").write_text("hostc 4343\n")  # no place written: not stalled long yet
    monkeypatch.setattr(watchdog, "main_thread_place", lambda: f"{WAITS} (mpi_ops.py: sync)")
    dog = StallWatchdog(10, rank=0, size=3)
    dog.folder = folder
    told = dog.stopped_ranks()
    assert told.startswith("rank 1 (PID 4242 on host hostb) is in /home/u/model.py:9 (forward), "
                           "while rank(s) 0 wait for it in a collective"), told
    (folder / "rank-1").write_text("hostb 4242\n")  # every rank waits, or none said yet
    assert dog.stopped_ranks().startswith("every other rank is still running")


def test_a_stalled_rank_says_where_it_is_and_leaves_a_stop_line(tmp_path):
    (tmp_path / HEARTBEAT_DIR).mkdir()
    code = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from hvdtrain.loop.watchdog import StallWatchdog
        run = Path({str(tmp_path)!r})
        (run / ".heartbeat" / "rank-1").write_text("hostb 77\\nwaits in a collective (x.py: y)\\n")
        dog = StallWatchdog(2, rank=0, size=2)
        dog.start(run, lambda message: (run / "stop-line").write_text(message))
        def user_forward():
            time.sleep(60)
        user_forward()
    """)
    started = time.monotonic()
    ranks = tmp_path / "ranks"  # `hvdtrain run` read a rank gone without its code as killed
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env={**os.environ, RANKS_FILE_ENV: str(ranks)})
    assert proc.returncode == 1 and time.monotonic() - started < 30, proc.stderr
    kind, _, code = ranks.read_text().split()
    assert (kind, code) == ("exit", "1")
    assert "hvdtrain: error (rank 0): no progress in 2 s (--stall-timeout-s 2) while starting; " \
           "rank 0 (this rank) is in <string>:" in proc.stderr, proc.stderr
    assert "(user_forward), while rank(s) 1 wait for it in a collective" in proc.stderr
    logged = (tmp_path / "stop-line").read_text()
    assert logged.startswith("no progress in 2 s") and "(user_forward)" in logged
