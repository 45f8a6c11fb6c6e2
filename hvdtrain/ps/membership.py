"""Which workers an async job still has: a worker that dies (SIGKILL, OOM, its node gone) need
not end the job when the launcher keeps the other ranks running (Open MPI with
``--mca orte_enable_recovery 1``). Server 0 notices the death as silence past --timeout-s
(silence.py; Open MPI 4.1 reports no error for a dead peer: a send to it stays pending), drops
the worker from the rounds, the staleness bounds and the batch plan (its outstanding batches go
to the survivors), and tells the other servers and the live workers (survivors.py). Without
recovery, a silent worker ends the job as before, and the message says how to launch for
recovery."""

from __future__ import annotations

import os
import signal
import sys
import time
from array import array
from dataclasses import asdict, dataclass

import numpy as np

from ..exit_codes import EXIT_NO_FINALIZE
from . import slot_waiters
from .protocol import Kind, Tag, make_header
from .waiting import StuckError, wait_any

RECOVERY_FLAGS = "--mca orte_enable_recovery 1 --mca orte_abort_on_non_zero_status 0"
LAUNCH_HINT = (f"to keep an async job training when a worker dies, launch it with "
               f"`mpirun {RECOVERY_FLAGS} ...`")
LAUNCHERS = ("mpirun", "mpiexec", "orterun", "orted", "prterun")


def recovery_enabled(env=None) -> bool:
    """Whether the launcher keeps the other ranks running when one dies: mpirun hands its
    ``--mca`` settings to every rank as OMPI_MCA_* variables."""
    value = (os.environ if env is None else env).get("OMPI_MCA_orte_enable_recovery", "")
    return value.strip().lower() in ("1", "true", "yes", "enabled")


def fail_launcher(code: int) -> None:
    """Under recovery, mpirun exits 0 even when every rank exits non-zero or calls MPI_Abort
    (measured with Open MPI 4.1): a failed job would look like a success to Slurm, Kubernetes
    and scripts. SIGTERM to the launcher (this rank's parent) ends it with exit code 1."""
    if code == 0 or not recovery_enabled():
        return
    if _launcher_name() in LAUNCHERS:
        _let_launcher_read_output()
        os.kill(os.getppid(), signal.SIGTERM)


def _launcher_name() -> str:
    """The name of this rank's parent process ("" where it cannot be read)."""
    try:
        with open(f"/proc/{os.getppid()}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def _let_launcher_read_output(limit_s: float = 2.0) -> None:
    """Wait until the launcher has read what this rank printed (its error) out of the pipes it
    gave the rank: a launcher stopped with its pipes unread drops those lines, and a CI run once
    ended a job non-zero with no word from any rank. FIONREAD counts the unread bytes of a pipe
    from either end. Then a moment for the launcher to write them out."""
    import fcntl
    import stat
    import termios

    unread = array("i", [0])
    deadline = time.monotonic() + limit_s
    for fd in (sys.stderr.fileno(), sys.stdout.fileno()):
        try:
            if not stat.S_ISFIFO(os.fstat(fd).st_mode):
                continue  # a terminal or a file: nothing to wait for
            while time.monotonic() < deadline:
                fcntl.ioctl(fd, termios.FIONREAD, unread)
                if unread[0] == 0:
                    break
                time.sleep(0.01)
        except (OSError, ValueError):
            continue
    time.sleep(0.2)


def lost_server_note(run_dir) -> str:
    """A worker stuck on the servers: the job cannot go on without one of them."""
    from ..checkpoint import intact_note

    return ("no worker can go on without every parameter server (each holds a shard of the "
            "parameters); " + intact_note(run_dir, "rerun the same command with --auto-resume "
                                                   "(or fix the cause)"))


def exit_code_without_finalize(env=None) -> int:
    """The exit code of a process that ends without MPI_Finalize: EXIT_NO_FINALIZE where
    mpirun ignores non-zero exits (``orte_abort_on_non_zero_status 0``, in RECOVERY_FLAGS),
    else 0, since there a non-zero exit would end the job. Open MPI 4.1's daemon on a host
    other than mpirun's tells mpirun of the first process of a job there that exits 0 without
    MPI_Finalize, or dies, and of no later one: mpirun would wait for the others forever
    (measured across two hosts, docs/async.md). A non-zero exit is an ordinary end to it,
    reported once all of the job's processes there have ended, unless one of them died."""
    env = os.environ if env is None else env
    value = env.get("OMPI_MCA_orte_abort_on_non_zero_status", "").strip().lower()
    return EXIT_NO_FINALIZE if value in ("0", "false", "no", "disabled") else 0


def exit_without_finalize() -> None:
    """The last thing a process does after a lost worker (registered with atexit): MPI_Finalize
    hangs with a dead member in the job (seen here with Open MPI 4.1: the survivors' finalize
    never returned after the run's last line), and under recovery mpirun takes a process that
    exits without it as done. Its exit code does not reach mpirun's (mpirun exits 0), but it
    decides whether mpirun learns of the exit at all (exit_code_without_finalize)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code_without_finalize())


class WorkerLost(Exception):
    """This worker was declared lost while it was frozen or cut off: its batches went to the
    survivors and the servers refuse its pushes (ledger.py), so it leaves the job without
    MPI_Finalize (exit_without_finalize), and the job goes on without it, or has ended
    (Membership.job_ended). Its exit is no failure of the job."""


ENDED_WAIT_S = 0.5  # for the words to lost workers to leave: a dead one never takes its own


@dataclass
class Loss:
    worker: int
    after_s: float   # seconds since the server started serving
    pushes: int      # what it had pushed (its clock at its last push)
    silent_s: float  # how long it had been silent when it was dropped


class Membership:
    """A server's record of the workers it lost, and the drop itself."""

    def __init__(self, index: int, recovery: bool | None = None, replacements=None):
        self.index = index
        self.recovery = recovery_enabled() if recovery is None else recovery
        self.lost: list[Loss] = []
        self.gone: set[int] = set()  # lost and not replaced
        self.started = time.perf_counter()
        self.dropped = 0  # drops the server's loop has not yet counted off its active workers
        self.replacements = replacements  # server 0 with --max-restarts: replacement.py

    @property
    def lost_workers(self) -> list[int]:
        return [loss.worker for loss in self.lost]

    def lead(self, num_workers: int) -> int:
        """The worker that evaluates, checkpoints and collects the servers' statistics: the
        lowest one never lost (a replacement never leads: it joins no worker collective)."""
        lost = set(self.lost_workers)
        return next((w for w in range(num_workers) if w not in lost), 0)

    def check(self, server, now: float) -> int:
        """Server 0 drops a worker silent past --timeout-s when the launcher can recover, or
        ends the job as before (StuckError) when it cannot. The other servers wait for server
        0's word (Kind.LOST), so that every process agrees on who is lost. Returns the number
        of workers dropped since the last call (by this check, a wait, or server 0's word)."""
        self._scan(server, now)
        dropped, self.dropped = self.dropped, 0
        return dropped

    def _joined(self, server, now: float) -> bool:
        """A replacement's spawn is over (replacement.py): it joined, or it failed and its
        worker is lost for good, which the loop's count of active workers takes off."""
        outcome = self.replacements.poll(server, now) if self.replacements else 0
        if outcome == 1:
            self.gone.discard(self.replacements.replaced[-1].worker)
        elif outcome == -1:
            self.dropped += 1
        return outcome != 0

    def _scan(self, server, now: float) -> bool:
        # Also while the job stops (a stop signal, a --stop-at target: the live workers wait in
        # the end-of-training agreement for a dead one) and while an evaluation pauses the
        # workers (--eval-pauses-workers): the evaluating worker and those held are silent by
        # design, but a dead one never arrives to be held, and a job that evaluates every few
        # steps would otherwise never look for it.
        # The evaluating worker announced itself QUIET (silence.py bounds that by --timeout-s).
        waiting = [*server.engine.held(), server.pauses.held]
        joined = self._joined(server, now)
        worker = server.silence.overdue(now, server.engine.clocks, waiting)
        if worker is not None and not self.recovery:
            raise StuckError(f"{server.silence.describe(worker, now, server.engine.clocks)}; "
                             f"{LAUNCH_HINT}")
        dropped = worker is not None and self.index == 0 and bool(self.drop(server, worker, now))
        return dropped or joined

    def receive(self, server, status) -> None:
        """Receive the next request header from any worker into ``server.header`` (with
        --max-restarts, from a replacement's link too: routes.py), or raise StuckError."""
        routed = self._routed(server)
        requests = self._post_requests(server)
        try:
            index = self.wait(server, requests, status)
        except BaseException:
            if routed:
                server.comm.cancel()
            else:
                requests[0].Cancel()
            raise
        if routed:
            server.comm.take(index, server.header, status)

    def wait(self, server, requests: list, status) -> int:
        """Server 0's wait for the next request. Under recovery it checks for silent workers
        every second meanwhile: when the live workers all wait for a lost one (the end of
        training is collective), no request comes that would start the check."""
        MPI, timeout_s = server.MPI, server.cfg.ps.timeout_s
        if not (self.recovery and self.index == 0 and timeout_s):
            try:
                return wait_any(MPI, requests, timeout_s, server._describe_wait, status)
            except StuckError:
                # No request at all: the live workers may all wait for a silent one (at the
                # end of training): name it, rather than say that nobody sent anything.
                self.check(server, time.perf_counter())
                raise
        start = time.monotonic()
        while True:
            try:
                return wait_any(MPI, requests, 1.0, server._describe_wait, status)
            except StuckError:
                if self._scan(server, time.perf_counter()) or self.starting:
                    start = time.monotonic()  # a replacement that starts is no hang
                    requests = self._requests_after_join(server, requests)
                elif time.monotonic() - start > timeout_s:  # as wait_any says it
                    raise StuckError(f"{server._describe_wait()} (waited {timeout_s:g} s, "
                                     "--timeout-s); a process has stopped or hangs. Raise "
                                     "--timeout-s if it may pause this long.") from None

    @staticmethod
    def _routed(server) -> bool:
        """Whether requests arrive over routes.py's links (--max-restarts), one per worker,
        rather than from any rank of one communicator."""
        return hasattr(server.comm, "post_requests")

    @classmethod
    def _post_requests(cls, server) -> list:
        """The receives of the next request header: one from any rank, or with routes.py one
        per link."""
        if cls._routed(server):
            return server.comm.post_requests(server.header, Tag.REQUEST)
        return [server.comm.Irecv(server.header, source=server.MPI.ANY_SOURCE, tag=Tag.REQUEST)]

    @classmethod
    def _requests_after_join(cls, server, requests: list) -> list:
        """A replacement that joined meanwhile has a link of its own to listen on."""
        return cls._post_requests(server) if cls._routed(server) else requests

    @property
    def starting(self) -> bool:
        return self.replacements is not None and self.replacements.pending is not None

    def drop(self, server, worker: int, now: float) -> int:
        if worker in self.gone or server.engine.is_done(worker):
            return 0
        self.gone.add(worker)
        pushes = int(server.engine.clock(worker))
        self.lost.append(Loss(worker, round(now - self.started, 3), pushes,
                              round(now - server.silence.last_heard[worker], 3)))
        server.engine.on_lost(worker)  # no round, bound or pause counts on it, no reply goes
        server.load.pushes_reported[worker] = pushes
        server.pauses.held.pop(worker, None)
        if server.pauses.paused_by == worker:  # it died evaluating: the held replies go out
            server._send_all(server.silence.resumed(
                server.pauses.resume(now, server.engine.clocks, server.engine.stopping), now))
        server.silence.quiet.discard(worker)
        server.silence.waiting_for_others.discard(worker)
        slot_waiters.give_back(server, worker)  # its batches go to the survivors, waiters first
        self.dropped += 1
        if self.index == 0:
            self._tell(server, worker, pushes)
        server.engine.release()
        if self.index == 0:
            left = len(self.gone) < server.num_workers
            print(f"hvdtrain: worker {worker} (rank {worker}) lost: silent for "
                  f"{self.lost[-1].silent_s:.0f} s after {pushes} pushes; " +
                  ("training goes on with the other workers" if left else "it was the last"),
                  file=sys.stderr, flush=True)
            if self.replacements and self.replacements.replace(server, worker, pushes):
                self.dropped -= 1  # the loop's count keeps it: its replacement is on its way
            self._check_anyone_left(server)
        return 1

    def _check_anyone_left(self, server) -> None:
        """Every worker lost, none replaced: nothing is left to train, and the job ends with an
        error now (it used to wait --timeout-s more, then list the lost workers as done)."""
        if len(self.gone) < server.num_workers or self.starting:
            return
        lost = ", ".join(f"worker {loss.worker} after {loss.pushes} pushes" for loss in self.lost)
        raise StuckError(f"every worker was lost ({lost}): no worker is left to train; rerun "
                         "the same command with --auto-resume to continue from the last "
                         "checkpoint")

    def _tell(self, server, worker: int, pushes: int) -> None:
        """The other servers first, then every live worker (survivors.py reads it)."""
        header = make_header(Kind.LOST, clock=pushes, worker=worker)
        for rank in server.topology.server_ranks()[1:]:
            server.comm.Send(header, dest=rank, tag=Tag.REQUEST)
        word = np.array([worker, pushes], dtype=np.int64)
        for w in range(server.num_workers):
            if not server.engine.is_done(w) and w not in self.lost_workers:  # a newcomer
                # is exempt from the survivors' collectives (replacement.py): no word for it
                server.comm.Send(word, dest=w, tag=Tag.LOST)

    def job_ended(self, server) -> None:
        """Server 0, once every server has stopped serving (after the job's last collective): a
        lost worker that was only frozen would wake to wait for replies that never come, then
        end the finished job with an error. Its own process is told (Tag.ENDED) on the base
        communicator, which reaches it rather than its replacement (routes.py), and leaves
        quietly (survivors.py)."""
        if self.index != 0 or not self.lost:
            return
        base = getattr(server.comm, "base", server.comm)
        sends = [base.Isend(np.array([loss.worker, loss.pushes], dtype=np.int64),
                            dest=loss.worker, tag=Tag.ENDED) for loss in self.lost]
        deadline = time.monotonic() + ENDED_WAIT_S
        while not server.MPI.Request.Testall(sends) and time.monotonic() < deadline:
            time.sleep(0.01)

    def report(self, load=None) -> dict:
        replaced = {}
        if self.replacements is not None and load is not None:
            self.replacements.finish(load.pushes_reported)
            replaced = self.replacements.report()
        return {"workers_lost": [asdict(loss) for loss in self.lost], **replaced} \
            if self.lost else {}
