"""``--stall-timeout-s`` as a watchdog: a rank that makes no progress (no step, no evaluation,
no checkpoint) for that long ends the job with a message, instead of waiting forever in a
collective that a stopped peer will never join.

Horovod's own stall check is not enough: it runs in Horovod's background loop, which blocks in
MPI itself once a peer stops answering (measured: after ``kill -STOP`` of rank 1 under mpirun,
rank 0 spun at full CPU for minutes), and under Gloo the job ends through Gloo's own timeout,
whatever the flag says. This thread needs neither: Horovod waits with the GIL released, so the
thread runs while the main thread is stuck, and ``os._exit`` ends the process, which makes the
launcher end the others.

Which rank stopped: each rank's thread touches a heartbeat file under ``<run folder>/.heartbeat``
every second. A stopped or frozen process stops touching it, a rank that waits in a collective
does not. When the watchdog fires it names the ranks whose heartbeat is old. Ranks on another
host are seen only when the run folder is shared (it usually is: checkpoints must be); otherwise
the message says it cannot tell.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from pathlib import Path

HEARTBEAT_DIR = ".heartbeat"
BEAT_S = 1.0
STOPPED_AFTER_S = 5.0  # a heartbeat this old: the process is not running


class StallWatchdog:
    def __init__(self, timeout_s: float, rank: int, size: int, exit_code: int = 1):
        self.timeout_s = timeout_s
        self.rank, self.size = rank, size
        self.folder = Path(HEARTBEAT_DIR)  # inside the run folder, once start() knows it
        self.exit_code = exit_code
        self.doing: str | int = "starting"  # a global step: stepped() (see doing_text)
        self._last = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def heartbeat_file(self) -> Path:
        return self.folder / f"rank-{self.rank}"

    def start(self, run_dir: Path) -> None:
        if not self.timeout_s:
            return
        self.folder = run_dir / HEARTBEAT_DIR
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            self.heartbeat_file.write_text(f"{socket.gethostname()} {os.getpid()}\n")
        except OSError:
            pass  # no heartbeat: the watchdog still ends a stuck job, it just names nobody
        self.beat("starting")
        self._thread = threading.Thread(target=self._watch, name="hvdtrain-watchdog",
                                        daemon=True)
        self._thread.start()

    def beat(self, doing: str) -> None:
        """Progress was made; ``doing`` says what this rank does next (for the message)."""
        self._last = time.monotonic()
        self.doing = doing

    def stepped(self, global_step: int) -> None:
        """A step was made, ``global_step`` steps in all: the beat of the step loop, one store
        (no clock read, no text per step). The watching thread sees the count move on within
        a second (BEAT_S), and says "in step N+1" should the next step not come."""
        self.doing = global_step

    @property
    def doing_text(self) -> str:
        doing = self.doing
        return f"in step {doing + 1}" if isinstance(doing, int) else doing

    def stop(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        try:
            self.heartbeat_file.unlink()
            self.folder.rmdir()  # the last rank to finish removes the folder
        except OSError:
            pass

    def _watch(self) -> None:
        woke, seen = time.monotonic(), self.doing
        while not self._stop.wait(BEAT_S):
            now = time.monotonic()
            if self.doing != seen and isinstance(self.doing, int):
                self._last = max(self._last, now)  # stepped since the last look (late by <1 s)
            seen = self.doing
            if now - woke > 5 * BEAT_S:
                # This process was not running (SIGSTOP, a frozen container): the time it lost is
                # not its peers' fault. (mpirun sends SIGCONT to a stopped rank before killing it.)
                self._last += now - woke - BEAT_S
            woke = now
            try:
                os.utime(self.heartbeat_file)
            except OSError:
                pass
            idle = now - self._last
            if idle > self.timeout_s:
                print(self.describe(idle), file=sys.stderr, flush=True)
                os._exit(self.exit_code)  # the main thread is stuck in C: nothing else ends it

    def describe(self, idle: float) -> str:
        return (f"hvdtrain: error (rank {self.rank}): no progress in {idle:.0f} s "
                f"(--stall-timeout-s {self.timeout_s:g}) while {self.doing_text}; "
                f"{self.stopped_ranks()}; ending the job")

    def stopped_ranks(self) -> str:
        now, stopped, unseen = time.time(), [], []
        for rank in range(self.size):
            if rank == self.rank:
                continue
            path = self.folder / f"rank-{rank}"
            try:
                age = now - path.stat().st_mtime
                host_pid = path.read_text().split()
            except (OSError, ValueError):
                unseen.append(rank)
                continue
            if age > STOPPED_AFTER_S:
                where = f" (PID {host_pid[1]} on host {host_pid[0]})" if len(host_pid) == 2 else ""
                stopped.append(f"rank {rank}{where}, silent for {age:.0f} s")
        if stopped:
            return "stopped answering: " + "; ".join(stopped)
        if unseen and len(unseen) == self.size - 1:
            return ("cannot tell which rank stopped: no other rank's heartbeat is visible in "
                    f"{self.folder} (a run folder that is not shared between hosts)")
        alive = "every other rank is still running" if not unseen else \
            f"ranks {unseen} are not visible, the others are still running"
        return (f"{alive}: a rank may be stuck outside training (in your code or a data "
                "loader), or a step takes longer than --stall-timeout-s")
