"""A replacement worker's side (--max-restarts, replacement.py): a process that MPI_Comm_spawn
started runs the same ``hvdtrain train`` command, finds its parent, and trains as the worker
it replaces.

Its COMM_WORLD holds itself alone; the job is server 0 at the other end of its parent
intercommunicator, which ``Routes`` (routes.py) puts at the servers' job rank, so the worker's
code sends to the servers as any worker does. It needs no INIT: the servers hold the current
parameters, and it pulls them first. It joins none of the workers' collectives (the survivors
keep their own communicator, survivors.py): its epoch figures stay its own, it evaluates and
writes nothing (worker 0 does), and it ends when server 0 hands out no more batches, or stops
it, like any worker. Its BatchNorm buffers, if the model has any, are its own initial ones.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import sys
import time
import traceback
from typing import Any

from ..faults.schedule import parse_faults
from ..scheme import PendingSum
from .async_group import AsyncGroup
from .client import ParameterServerClient
from .protocol import Tag
from .routes import Routes
from .shared_memory import HostWindow

WELCOME_WAIT_S = 60.0  # server 0 sends the welcome right after its spawn returns


def parent_link():
    """The intercommunicator to server 0 when this process is a replacement, else None."""
    from mpi4py import MPI

    parent = MPI.Comm.Get_parent()
    return None if parent == MPI.COMM_NULL else parent


def faults_after(schedule: str, step: int) -> str:
    """The injected faults a replacement may still fire: none due at or before the job's step
    where it joins (each fires once per job, and its predecessor's may be what it replaces)."""
    kept = [f for f in parse_faults(schedule)
            if (f.last_step if f.kind == "slow" else f.step) > step]
    return ";".join(f.text() for f in kept)


def receive_welcome(parent) -> dict[str, Any]:
    """Server 0's word: which worker this process is, the job's size, its clock; answered with
    this process's pid and host, which server 0 logs (MPI_Comm_spawn picks the host)."""
    request = parent.irecv(source=0, tag=Tag.INFO)
    deadline = time.monotonic() + WELCOME_WAIT_S
    while True:
        done, welcome = request.test()
        if done:
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"no word from parameter server 0 in {WELCOME_WAIT_S:g} s")
        time.sleep(0.001)
    parent.send({"pid": os.getpid(), "host": socket.gethostname()}, dest=0, tag=Tag.INFO)
    return welcome


class NewcomerClient(ParameterServerClient):
    """The async scheme on a replacement: the servers' client, without the workers'
    collectives and without the start-up that seeds the servers."""

    def __init__(self, cfg, runtime, comm, worker_comm, topology, welcome: dict[str, Any]):
        super().__init__(cfg, runtime, comm, worker_comm, topology)
        self.worker_rank = int(welcome["worker"])
        self.is_main = False
        self.clock = int(welcome["clock"])  # where server 0 put it (replacement.start_clock)
        self.group = NewcomerGroup(self)

    def start(self, state: dict[str, Any] | None, resuming: bool) -> None:
        self.host = HostWindow(self.comm, 0, enabled=False)  # no window: messages only
        self.pull()  # the servers' current parameters
        self.started = True

    def _regroup(self) -> bool:
        self.survivors.poll()  # none is sent to it; nothing to regroup with
        return False

    def agree(self, value: int, op, what: str) -> int:
        return value


class NewcomerGroup(AsyncGroup):
    """A replacement's group: it joins none of the workers' collectives, so each is its own."""

    def sum_later(self, values: list[float]) -> PendingSum:
        return PendingSum(list(values))

    def sum_across_workers(self, values: list[float]) -> list[float]:
        return list(values)

    def broadcast_object(self, obj: Any) -> Any:
        return obj


def newcomer_config(cfg, job_step: int):
    """The command's settings for the replacement: it starts from the servers' parameters,
    not from a checkpoint, and fires no fault that was due before it joined."""
    run = dataclasses.replace(cfg.run, resume=None, auto_resume=False,
                              inject_faults=faults_after(cfg.run.inject_faults, job_step))
    return dataclasses.replace(cfg, run=run)


def run_newcomer(cfg, workload, model, parent, build_trainer, finished):
    """This process's whole part of the job, as a replacement. It never calls MPI_Finalize,
    which would wait for its parent (server 0 skips it after a lost worker, membership.py); a
    failure ends this process alone, and server 0 takes it for lost."""
    import atexit

    from mpi4py import MPI

    from ..layout import Layout
    from ..runtime import Runtime, configure_torch, detect_launcher, pick_device
    from .membership import exit_without_finalize

    atexit.register(exit_without_finalize)
    try:
        parent.Set_errhandler(MPI.ERRORS_RETURN)
        welcome = receive_welcome(parent)
        cfg = newcomer_config(cfg, int(welcome["job_step"]))
        size, worker = int(welcome["world_size"]), int(welcome["worker"])
        runtime = Runtime(rank=worker, size=size, local_rank=0, local_size=1,
                          device=pick_device(cfg.run.device, 0), launcher=detect_launcher())
        configure_torch(cfg.run, size)
        layout = Layout.build(cfg, size, 0, 1)
        comm = Routes(parent, MPI.ANY_SOURCE)
        for server in layout.topology.server_ranks():
            comm.link(server, parent)
        scheme = NewcomerClient(cfg, runtime, comm, MPI.COMM_SELF, layout.topology, welcome)
        trainer = build_trainer(cfg, runtime, layout, scheme, workload, model)
        trainer.fit()
        workload.close()
    except BaseException:  # noqa: BLE001 - this process alone ends; the job goes on
        traceback.print_exc()
        print(f"hvdtrain: error: the replacement worker (pid {os.getpid()}) failed; server 0 "
              "takes it for lost", file=sys.stderr, flush=True)
        os._exit(1)
    print(f"hvdtrain: replacement worker {worker} (pid {os.getpid()}) done after "
          f"{scheme.clock - int(welcome['clock'])} pushes", file=sys.stderr, flush=True)
    return finished(trainer.history, trainer.run_dir, trainer, trainer.stopping.verdict)
