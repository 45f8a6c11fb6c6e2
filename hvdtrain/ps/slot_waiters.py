"""Server 0's side of the job's batch slots on the wire (the plan is dispatch.py's): it sends each
worker its slots, and under mpirun's recovery settings it holds the SLOTS requests that find
none left while a lost worker's slots may still come back (BatchDispatcher.ask), so that a
loss noticed after the survivors used up the plan still has its batches trained.

Only an explicit request is held, sent when the worker's queue is empty; a push's next slot is
never held (NONE_YET instead), since a worker still training would then wait for a worker that
may be waiting for its slot. A held worker is silent by design and pushes nothing until its
answer, so it is quiet for the silence check and idle for rounds and staleness bounds (as
Kind.IDLE), or another worker's reply could wait for its clock while it waits for that worker's
slot. Every event that may change an answer asks the dispatcher again (``answer``). Each
function takes server 0's ParameterServer; its state is the dispatcher's.
"""

from __future__ import annotations

import time

import numpy as np

from .protocol import Tag


def hand_out(server, worker: int, count: int = 1, listed: bool = False) -> None:
    """A push's next slot (``count`` of them for a round of async DiLoCo that trained as many,
    ``listed``, then the fastest worker's step time), sent before its reply (which may be held):
    never held itself."""
    slots = [server.dispatcher.take(worker) for _ in range(count)]
    if listed:
        times = [t for t in server.step_times.values() if t > 0]
        slots.append(min(times) if times else 0)
    _send(server, worker, slots)
    answer(server)  # the push completed a slot, maybe the last one a waiter counted on


def receive_list(server, worker: int, count: int) -> list[int]:
    """The ``count`` slots that a push of async DiLoCo lists (protocol.SLOT_LIST); the step
    time that follows them goes to ``server.step_times``."""
    words = np.empty(count + 1, dtype=np.int64)
    server.comm.Recv(words, source=worker, tag=Tag.SLOT)
    if words[-1] > 0:
        server.step_times[worker] = int(words[-1])
    return [int(s) for s in words[:-1]]


def ask(server, worker: int, count: int, epoch: int) -> None:
    """A SLOTS request: ``count`` slots for a worker in ``epoch`` whose queue is empty."""
    slots = server.dispatcher.ask(worker, count, epoch)
    if slots is None:  # held: it waits for the servers, not hung; no round counts on it
        server.silence.quiet.add(worker)
        server.engine.on_idle(worker)
    else:
        _send(server, worker, slots)
    answer(server)  # another waiter may have counted on this worker's slots


def answer(server) -> None:
    """Send the held requests whose answer is known now."""
    if server.dispatcher is None:
        return
    for worker, slots in server.dispatcher.answers():
        # back to training: its silence counts from now, and rounds count on it again
        server.silence.quiet.discard(worker)
        server.silence.last_heard[worker] = time.perf_counter()
        server.engine.on_active(worker)
        _send(server, worker, slots)


def give_back(server, worker: int) -> None:
    """A lost worker's outstanding slots go to the waiters first (membership.drop)."""
    if server.dispatcher is not None:
        server.dispatcher.give_back(worker)
        answer(server)


def closed(server, worker: int) -> None:
    """``worker`` sent DONE: slots it still holds (it stopped) will never come back."""
    if server.dispatcher is not None:
        server.dispatcher.closed.add(worker)
        answer(server)


def stop(server) -> None:
    """The job stops (a stop signal, a --stop-at target): nobody waits for a slot."""
    if server.dispatcher is not None:
        server.dispatcher.stopped = True
        answer(server)


def _send(server, worker: int, slots: list[int]) -> None:
    server.comm.Send(np.array(slots, dtype=np.int64), dest=worker, tag=Tag.SLOT)
    if server.dispatcher.finished_pushing(worker) and server.engine.on_finished(worker):
        server.engine.release()  # nobody waits for its clock any more
