"""A replacement joins (--max-restarts R): after server 0 drops a lost worker (membership.py),
it starts a new worker process in its place with MPI_Comm_spawn, running the same command. The
newcomer takes the lost worker's index, pulls the current parameters and asks server 0 for
batches of the job's plan like any worker (newcomer.py is its side).

Only server 0 takes part in the spawn (``COMM_SELF.Spawn``): the live workers may be inside
their own collectives, and the dead rank can join none. So the newcomer reaches the job through
one intercommunicator to server 0 (routes.py), which is why --max-restarts needs --num-servers
1, and why it needs the job's batch plan (no --bsp: lock-step rounds give each worker a fixed
share, which a newcomer would start again from the first epoch). It joins none of the workers'
collectives (the epochs' metric sums, the end's agreement): those stay the survivors'
(survivors.py), whose sums stay matched one for one; the epoch lines' figures are theirs, and
the newcomer's pushes are counted by the server (the scheme line's ``workers_replaced``).

While the newcomer starts, the survivors train on: a job whose batches are all handed out by
the time it has joined ends with the newcomer's first request for one.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from dataclasses import asdict, dataclass

from ..errors import ConfigError
from .membership import LAUNCH_HINT, recovery_enabled
from .protocol import Tag

# The newcomer's start: python, torch, the data set, then its MPI_Init answers the spawn (3 to
# 13 s measured here with Open MPI 4.1 on a busy machine); a longer one is taken for a failure.
SPAWN_WAIT_S = 120.0


def check_restarts(max_restarts: int, recovery: bool) -> None:
    """--max-restarts needs mpirun's recovery: without it a lost worker ends the job. (Its
    other needs, --mode async, one server and no --bsp, are the config package's checks.)"""
    if max_restarts and not recovery:
        raise ConfigError(f"--max-restarts {max_restarts}: without mpirun's recovery settings a "
                          f"lost worker ends the job, so none would be replaced; {LAUNCH_HINT}, "
                          "or drop --max-restarts")


def should_replace(max_restarts: int, started: int, finished: bool) -> bool:
    """Whether a lost worker gets a replacement: fewer than --max-restarts were started, and
    the job's batches are not all handed out (a newcomer would find nothing to train)."""
    return started < max_restarts and not finished


def start_clock(pushes: int, clocks: list[float]) -> int:
    """The newcomer's clock: the lost worker's pushes, or the slowest live worker's clock if
    that is further, so that a staleness bound (--staleness) never holds the others back
    while the newcomer catches up with pushes its predecessor never made."""
    live = [c for c in clocks if not math.isinf(c)]
    return int(max([pushes, min(live)] if live else [pushes]))


def job_step(dispatcher) -> int:
    """The job's global step where the plan's next fresh batch is: the newcomer fires no
    injected fault due at or before it (faults fire once per job)."""
    if dispatcher is None:
        return 0
    plan = dispatcher.plan
    epoch, step, _ = plan.locate(min(dispatcher.next, plan.total - 1))
    return epoch * plan.steps_per_epoch + step


@dataclass
class Replaced:
    worker: int
    after_s: float       # seconds since the server started serving, when it joined
    pid: int             # the newcomer's process
    spawn_s: float       # how long the spawn took
    pushes_before: int   # what the lost worker had pushed
    clock_at_join: int   # where the newcomer's clock started (start_clock)
    pushes: int = 0      # the newcomer's own pushes, at the end
    host: str = ""       # where MPI_Comm_spawn started it


class Replacements:
    """Server 0's side: the decision, the spawn, and the newcomer's place in the books.

    MPI_Comm_spawn returns once the new process has started MPI, seconds later (python, torch,
    the data set), so it runs in a thread of its own (mpi4py asks for MPI_THREAD_MULTIPLE) while
    the server's loop goes on serving the survivors; the loop takes the newcomer into the books
    when the thread is done (``poll``)."""

    def __init__(self, max_restarts: int):
        self.max_restarts = max_restarts
        self.started_at = time.perf_counter()
        self.replaced: list[Replaced] = []
        self.started = 0  # spawns started, the pending one included
        # the lost worker, its pushes, the spawn's start, its thread, and what the thread got
        self.pending: tuple[int, int, float, threading.Thread, dict] | None = None
        self.counted = False  # finish() has run

    @classmethod
    def at_server(cls, max_restarts: int, index: int) -> "Replacements | None":
        """Server 0 starts the replacements, under recovery; the other servers start none."""
        return cls(max_restarts) if max_restarts and index == 0 and recovery_enabled() else None

    def replace(self, server, worker: int, pushes: int) -> bool:
        """Start a worker in ``worker``'s place; True if one is on its way (``poll`` says when
        it has joined, or that it failed)."""
        finished = server.dispatcher is not None and server.dispatcher.finished
        if self.pending is not None or not should_replace(self.max_restarts, self.started,
                                                          finished):
            why = ("another replacement is starting" if self.pending is not None else
                   f"--max-restarts {self.max_restarts} used up" if not finished else
                   "every batch of the job's plan is trained")
            print(f"hvdtrain: worker {worker} not replaced: {why}", file=sys.stderr, flush=True)
            return False
        self.started += 1

        def welcome() -> dict:  # in the spawn thread, once the process has started
            return {"worker": worker, "world_size": server.comm.Get_size(),
                    "clock": start_clock(pushes, list(server.engine.clocks.clocks)),
                    "job_step": job_step(server.dispatcher)}

        result: dict = {}
        thread = threading.Thread(target=self._spawn, args=(server.MPI, welcome, result),
                                  name=f"hvdtrain-spawn-{worker}", daemon=True)
        self.pending = (worker, pushes, time.perf_counter(), thread, result)
        thread.start()
        return True

    def poll(self, server, now: float) -> int:
        """Whether the pending spawn is over: 1 if the newcomer joined the books now, -1 if it
        failed (its worker stays lost), 0 otherwise."""
        if self.pending is None:
            return 0
        worker, pushes, t0, thread, result = self.pending
        if thread.is_alive() and now - t0 < SPAWN_WAIT_S:
            return 0
        self.pending = None
        if "child" not in result:
            why = result.get("error", f"no answer from the new process in {SPAWN_WAIT_S:g} s")
            print(f"hvdtrain: worker {worker} not replaced: the spawn failed ({why}); training "
                  "goes on with the other workers", file=sys.stderr, flush=True)
            return -1
        self._join(server, worker, result["child"], result["clock"], now)
        self.replaced.append(Replaced(worker, round(now - self.started_at, 3), result["pid"],
                                      round(now - t0, 3), pushes, result["clock"],
                                      host=result["host"]))
        print(f"hvdtrain: worker {worker} replaced by a new process (pid {result['pid']}) "
              f"on host {result['host']} after {now - t0:.1f} s; it starts from the servers' "
              "current parameters", file=sys.stderr, flush=True)
        return 1

    @staticmethod
    def _spawn(MPI, welcome, result: dict) -> None:
        """In the spawn thread: start the process, tell it who it is (``welcome()``), and
        learn its pid and host."""
        try:
            info = MPI.Info.Create()
            info.Set("wdir", os.getcwd())
            child = MPI.COMM_SELF.Spawn(sys.executable, args=["-m", "hvdtrain", *sys.argv[1:]],
                                        maxprocs=1, info=info)
            info.Free()
            child.Set_errhandler(MPI.ERRORS_RETURN)
            word = welcome()
            child.send(word, dest=0, tag=Tag.INFO)
            answer = child.recv(source=0, tag=Tag.INFO)
            result.update(pid=int(answer["pid"]), host=str(answer["host"]))
            result.update(clock=word["clock"], child=child)
        except Exception as e:  # noqa: BLE001 - reported by poll; the job trains on
            result["error"] = f"{type(e).__name__}: {e}"

    def _join(self, server, worker: int, child, clock: int, now: float) -> None:
        """The newcomer is worker ``worker`` again: its clock, its batches and its silence
        count as a live worker's; its messages travel through ``child``."""
        server.comm.link(worker, child)
        server.engine.rejoin(worker, clock)
        server.shard.shared_grads.pop(worker, None)  # on no host window: messages only
        server.load.last_push_of[worker] = None
        server.load.intervals[worker].clear()
        server.silence.last_heard[worker] = now
        if server.dispatcher is not None:
            server.dispatcher.told_none.discard(worker)

    def finish(self, pushes_reported: list[int]) -> None:
        """At the end: each newcomer's own pushes (its last clock, at its DONE or its loss,
        less where it started), and the job's count of ``worker``'s pushes made true again
        (the lost worker's and the newcomer's own), in place."""
        if self.counted:
            return
        self.counted = True
        for entry in self.replaced:
            entry.pushes = int(pushes_reported[entry.worker]) - entry.clock_at_join
            pushes_reported[entry.worker] = entry.pushes_before + entry.pushes

    def report(self) -> dict:
        return {"workers_replaced": [asdict(r) for r in self.replaced]} if self.replaced else {}


def restarts_allowed(max_restarts: int) -> None:
    """At the start of an async job, on every rank alike (launch.py)."""
    check_restarts(max_restarts, recovery_enabled())
