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

A rank stuck in running code (a user's forward that never returns, a data loader that waits on
a dead file system) keeps beating, as its peers waiting in the collective do. So once a stall
has lasted half the timeout, each rank also writes where its main thread is into its heartbeat
file (sys._current_frames, as py-spy would show it): the message then names the rank that is
not waiting for the others, and the line of code it is in. The lead also ends the run log with
a stop line that says why, as any error that ends training does.
"""

from __future__ import annotations

import os
import socket
import sys
import sysconfig
import threading
import time
import traceback
from pathlib import Path
from typing import Callable

from ..requeue import tell_wrapper

HEARTBEAT_DIR = ".heartbeat"
BEAT_S = 1.0
STOPPED_AFTER_S = 5.0  # a heartbeat this old: the process is not running
# Where a rank's main thread waits for its peers: the collectives' Python frames (an MPI or
# Horovod call itself is C, so the innermost Python frame is its wrapper).
COLLECTIVE_PATHS = ("/horovod/", "/mpi4py/", "/torch/distributed/")
WAITS = "waits in a collective"
STOP_LINE_S = 5.0  # the most the run log's stop line may delay the end of a stalled job


def main_thread_place() -> str:
    """Where the main thread is now: ``WAITS (file: function)`` inside a collective, or the
    innermost line of code it runs outside Python's standard library, ``in FILE:LINE
    (function)``, and the library's function it waits in (a queue, a lock, a socket)."""
    frame = sys._current_frames().get(threading.main_thread().ident)
    if frame is None:
        return "in an unknown place"
    stack = traceback.extract_stack(frame)
    for entry in reversed(stack):
        if any(part in entry.filename for part in COLLECTIVE_PATHS):
            return f"{WAITS} ({Path(entry.filename).name}: {entry.name})"
    stdlib = sysconfig.get_paths()["stdlib"]
    own = [e for e in stack if not e.filename.startswith(stdlib)] or stack
    place = f"in {own[-1].filename}:{own[-1].lineno} ({own[-1].name})"
    last = stack[-1]
    return place if last is own[-1] else f"{place}, inside {Path(last.filename).name}: {last.name}"


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
        self.on_stall: Callable[[str], None] | None = None  # the lead's run log: a stop line

    @property
    def heartbeat_file(self) -> Path:
        return self.folder / f"rank-{self.rank}"

    def start(self, run_dir: Path, on_stall: Callable[[str], None] | None = None) -> None:
        """``on_stall(message)``: called before the process ends (the run log's stop line)."""
        if not self.timeout_s:
            return
        self.folder, self.on_stall = run_dir / HEARTBEAT_DIR, on_stall
        self._write_heartbeat()
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

    def _write_heartbeat(self, place: str | None = None) -> None:
        """"HOST PID", and where the main thread is once a stall is under way."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            self.heartbeat_file.write_text(f"{socket.gethostname()} {os.getpid()}\n"
                                           + (f"{place}\n" if place else ""))
        except OSError:
            pass  # no heartbeat: the watchdog still ends a stuck job, it just names nobody

    def _watch(self) -> None:
        woke, seen, placed = time.monotonic(), self.doing, False
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
            idle = now - self._last
            if idle > self.timeout_s / 2:  # the peers read it when they fire
                self._write_heartbeat(main_thread_place())
                placed = True
            elif placed:  # the stall is over: a place read later would be stale
                self._write_heartbeat()
                placed = False
            else:
                try:
                    os.utime(self.heartbeat_file)
                except OSError:
                    pass
            if idle > self.timeout_s:
                self._fire(idle)

    def _fire(self, idle: float) -> None:
        what = self.what_stalled(idle)
        print(f"hvdtrain: error (rank {self.rank}): {what}", file=sys.stderr, flush=True)
        if self.on_stall is not None:  # best effort, and briefly: the job must end regardless
            told = threading.Thread(target=_quietly, args=(self.on_stall, what),
                                    daemon=True)  # a tracker's sink may hang where the job did
            told.start()
            told.join(STOP_LINE_S)
        # `hvdtrain run` reads a rank gone without its code as killed (137, "out of memory")
        tell_wrapper("exit", self.exit_code)
        os._exit(self.exit_code)  # the main thread is stuck in C: nothing else ends it

    def what_stalled(self, idle: float) -> str:
        return (f"no progress in {idle:.0f} s (--stall-timeout-s {self.timeout_s:g}) while "
                f"{self.doing_text}; {self.stopped_ranks()}; ending the job")

    def stopped_ranks(self) -> str:
        now, stopped, unseen = time.time(), [], []
        places, hosts = {self.rank: main_thread_place()}, {self.rank: " (this rank)"}
        for rank in range(self.size):
            if rank == self.rank:
                continue
            path = self.folder / f"rank-{rank}"
            try:
                age = now - path.stat().st_mtime
                host_pid, _, place = path.read_text().partition("\n")
            except (OSError, ValueError):
                unseen.append(rank)
                continue
            where = f" (PID {host_pid.split()[1]} on host {host_pid.split()[0]})" \
                if len(host_pid.split()) == 2 else ""
            if age > STOPPED_AFTER_S:
                stopped.append(f"rank {rank}{where}, silent for {age:.0f} s")
            elif place.strip():
                places[rank] = place.strip()
                hosts[rank] = where
        if stopped:
            return "stopped answering: " + "; ".join(stopped)
        if unseen and len(unseen) == self.size - 1:
            return ("cannot tell which rank stopped: no other rank's heartbeat is visible in "
                    f"{self.folder} (a run folder that is not shared between hosts)")
        return _running_ranks(places, hosts, unseen)


def _quietly(call: Callable[[str], None], message: str) -> None:
    try:
        call(message)
    except Exception:
        pass


def _running_ranks(places: dict[int, str], hosts: dict[int, str], unseen: list[int]) -> str:
    """Every visible rank still runs: the ones that do not wait for the others hold them up."""
    working = {r: p for r, p in sorted(places.items()) if not p.startswith(WAITS)}
    waiting = sorted(r for r, p in places.items() if p.startswith(WAITS))
    if working and waiting:
        held = "; ".join(f"rank {r}{hosts.get(r, '')} is {p}" for r, p in working.items())
        return (f"{held}, while rank(s) {', '.join(map(str, waiting))} wait for it in a "
                "collective: that code never returned (a hang in your code or a data loader), "
                "or took longer than --stall-timeout-s")
    alive = "every other rank is still running" if not unseen else \
        f"ranks {unseen} are not visible, the others are still running"
    return (f"{alive}: a rank may be stuck outside training (in your code or a data "
            "loader), a step takes longer than --stall-timeout-s, or (sync) the ranks "
            "wait in different collectives (Horovod's 'Missing ranks' lines above name them)")
