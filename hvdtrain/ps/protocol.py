"""The parameter server's wire protocol and the arithmetic behind it, free of MPI calls. The update
rules that the server applies live in hvdtrain/rules/.

Every message travels on a private communicator (``COMM_WORLD.Dup()``) with one of the named tags
below. A request is a fixed header of ``HEADER_LEN`` int64 words; tensors follow as float32
buffers in chunks of at most ``chunk_elems`` elements, so the server can update chunk i while
chunk i+1 is still on the wire. Tensors never go through pickle; only small control-path
dictionaries (statistics, checkpoint metadata) do. Between a server and a worker on the same host
the tensors stay in an MPI shared-memory window (``shared_memory.py``) and only the header and a
READY word per updated chunk travel as messages.

The rank layout, which ranks serve and which train, is layout.py's Topology.
"""

from __future__ import annotations

import struct
from enum import IntEnum

import numpy as np

from ..errors import ConfigError


class Tag(IntEnum):
    REQUEST = 11   # header, worker -> server
    GRAD = 12      # gradient chunk, worker -> server
    PARAMS = 13    # parameter chunk, server -> worker (and worker 0 -> server in INIT)
    ACK = 14       # reply without parameters: the worker may go on
    STATE = 15     # optimizer-state chunk, either direction (checkpoint save / restore)
    INFO = 16      # small pickled dict on the control path
    READY = 17     # one word, server -> worker on the same host: chunk i is updated in the window
    STOP = 18      # one word, server -> every worker, once: stop after the current step (a signal)
    VERDICT = 19   # --backup-workers: a round's members, server 0 -> the other servers
    DEBT = 20      # float64, server 0 -> a worker, before a reply: seconds it computed during an
                   # evaluation's pause, which it then sleeps (--eval-pauses-workers)
    LOST = 22      # int64 [worker, pushes], server 0 -> each live worker: that worker is lost
    SLOT = 21      # int64 slots of the job's batch plan, server 0 -> a worker (ps/dispatch.py);
                   # worker -> server 0: the slots an async DiLoCo push lists (SLOT_LIST)
    ENDED = 23     # int64 [worker, pushes], server 0 -> a lost worker's own process once the
                   # servers serve no more: nothing will answer it, and it leaves
                   # (Membership.job_ended)


class Kind(IntEnum):
    INIT = 1   # worker 0 -> server: initial parameters (and optimizer state on resume)
    PUSH = 2   # a gradient; the reply is PARAMS (when WANT_PARAMS) or ACK
    PULL = 3   # just send the current parameters
    SAVE = 4   # write your shard beside a checkpoint; send clocks and version
    DONE = 5   # this worker has finished
    IDLE = 6   # --backup-workers (to server 0) and --eval-pauses-workers (to every server): the
               # worker pushes nothing until its next push (it waits for the other workers,
               # e.g. at the end of training); no reply
    ROUND = 7  # --backup-workers, server 0 -> the other servers: a round closed with these
               # members (a VERDICT message follows)
    DROP = 8   # --backup-workers, server 0 -> the other servers: this worker's push was late
    PAUSE = 9  # --eval-pauses-workers, worker 0 -> every server: it evaluates; hold the other
               # workers' replies until its RESUME, and server 0 charges each of them the time
               # it computed meanwhile (Tag.DEBT); no reply
    RESUME = 10
    SLOTS = 11  # worker -> server 0: hand me `size` batch slots (Tag.SLOT replies, NO_SLOT when
                # none is left); H_SLOT: the epoch it is in. Under recovery the reply may be held
                # (ps/slot_waiters.py)
    LOST = 13  # server 0 -> the other servers: worker H_WORKER is lost (ps/membership.py)
    QUIET = 12  # worker -> every server: busy with its own work (an evaluation, a checkpoint
                # write) until its next push, so its silence is no sign of a hang; no reply


# Header words: the request kind; the worker's clock (pushes made, this one included); its learning
# rate as float64 bits; flags; a size (parameter count for INIT, batch samples for PUSH, slots
# asked for by SLOTS); the sending worker's index; and, on a PUSH with WANT_SLOT, the batch slot
# whose gradient it carries (on SLOTS, the epoch the worker is in).
HEADER_LEN = 7
H_KIND, H_CLOCK, H_LR, H_FLAGS, H_SIZE, H_WORKER, H_SLOT = range(HEADER_LEN)
WANT_PARAMS = 1
HAS_STATE = 2
WANTS_STOP = 4  # on a PUSH: this worker got a stop signal (loop/preemption.py)
NO_GRADIENT = 8  # on a PUSH: no gradient follows (an fp16 step that overflowed was skipped);
                 # it counts for the clocks and rounds, and changes no parameter
WANT_SLOT = 16  # on a PUSH: it trained slot H_SLOT of the job's batch plan; server 0 marks it
               # done and hands out the next (one Tag.SLOT word, sent before any reply)
HAS_PLAN = 32  # on INIT to server 0: the job's batch plan follows (a pickled dict, Tag.INFO)
SLOT_LIST = 64  # on a PUSH with WANT_SLOT (async DiLoCo: a round of several batches): H_SLOT is
                # a count k, and the k slots follow to server 0 (int64, Tag.SLOT), then the
                # worker's time per step in microseconds (0: unmeasured); server 0 marks them
                # done and answers with k new ones and the fastest worker's step time, in one
                # Tag.SLOT message (--dynamic-local-steps)


def make_header(kind: Kind, clock: int = 0, lr: float = 0.0, flags: int = 0, size: int = 0,
                worker: int = 0, slot: int = -1) -> np.ndarray:
    header = np.zeros(HEADER_LEN, dtype=np.int64)
    header[H_KIND], header[H_CLOCK], header[H_FLAGS] = kind, clock, flags
    header[H_SIZE], header[H_WORKER], header[H_SLOT] = size, worker, slot
    header[H_LR] = lr_to_word(lr)
    return header


def lr_to_word(lr: float) -> int:
    """A float64 carried bit-for-bit in an int64 header word."""
    return struct.unpack("<q", struct.pack("<d", lr))[0]


def word_to_lr(word: int) -> float:
    return struct.unpack("<d", struct.pack("<q", int(word)))[0]


# --- shards and chunks -----------------------------------------------------------------------
def shard_bounds(total: int, num_servers: int) -> list[tuple[int, int]]:
    """Split [0, total) into num_servers contiguous ranges whose sizes differ by at most one."""
    if num_servers < 1 or total < num_servers:
        raise ConfigError(f"cannot split {total} parameters across {num_servers} servers; "
                          "use fewer servers than parameters")
    base, extra = divmod(total, num_servers)
    bounds, start = [], 0
    for s in range(num_servers):
        end = start + base + (1 if s < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds


def chunk_bounds(length: int, chunk_elems: int) -> list[tuple[int, int]]:
    """Split [0, length) into consecutive chunks of at most chunk_elems elements."""
    chunk_elems = max(1, chunk_elems)
    return [(a, min(a + chunk_elems, length)) for a in range(0, length, chunk_elems)]


def chunk_elements(chunk_mb: float) -> int:
    return max(1, int(chunk_mb * 1024 * 1024) // 4)  # float32
