"""What the ranks measure together over MPI: each host's clock against rank 0's, the run folder
seen from every rank, a point-to-point test between every pair of hosts, and an allreduce over
all ranks. Thin code that communicates; the judging is in the *_checks modules.

Bandwidth is the payload of one direction: the sender sends bursts of k messages back to back,
the receiver answers each burst's last with a byte, and the rate is the bytes over that time less
the answers' latency. One message first drains any token bucket on the path (tc tbf's burst),
then bursts of 1, 2, 4... messages go until they fill ``target_s``: a rate measured over 0.3 s
of traffic is the link's, not its bucket's, and the doubling stops at the budget however slow
the link."""

from __future__ import annotations

import math
import os
import secrets
import time
from itertools import combinations
from pathlib import Path

CTRL, DATA, ACK = 71, 72, 73  # message tags of the link test
PROBE_PREFIX = ".hvdtrain-doctor-"
MAX_MESSAGES = 256  # in one burst


def leaders(hosts: list[str]) -> dict[str, int]:
    """Host -> its lowest rank, in the order of those ranks."""
    found: dict[str, int] = {}
    for rank, host in enumerate(hosts):
        found.setdefault(host, rank)
    return found


def clock_offsets(comm, hosts: list[str], rounds: int = 5) -> dict[str, float]:
    """Each host's clock minus rank 0's (seconds), NTP's way: rank 0 sends, the host's leader
    answers with its time, and the round with the shortest round trip counts. Rank 0 only."""
    rank, offsets = comm.Get_rank(), {hosts[0]: 0.0}
    for host, leader in leaders(hosts).items():
        if leader == 0:
            continue
        if rank == leader:
            for _ in range(rounds):
                comm.recv(source=0, tag=CTRL)
                comm.send(time.time(), dest=0, tag=CTRL)
        elif rank == 0:
            best = (math.inf, 0.0)
            for _ in range(rounds):
                sent = time.time()
                comm.send(None, dest=leader, tag=CTRL)
                theirs = comm.recv(source=leader, tag=CTRL)
                back = time.time()
                best = min(best, (back - sent, theirs - (sent + back) / 2))
            offsets[host] = round(best[1], 6)
    return offsets


def run_dir_test(comm, run_dir: str) -> dict:
    """Whether this rank can write into ``run_dir`` and sees the file rank 0 wrote there (the
    same folder as rank 0's). The probe files, and a folder made only for the test, are
    removed."""
    rank = comm.Get_rank()
    token = comm.bcast(secrets.token_hex(8) if rank == 0 else None, root=0)
    folder = Path(run_dir)
    made = not folder.exists()
    result = {"path": os.path.realpath(run_dir), "writable": True, "error": None,
              "sees_rank0": False}
    try:
        folder.mkdir(parents=True, exist_ok=True)
        mine = folder / f"{PROBE_PREFIX}{token}-{rank}"
        mine.write_text(token)
        mine.unlink()
        if rank == 0:
            (folder / f"{PROBE_PREFIX}{token}").write_text(token)
    except OSError as e:
        result.update(writable=False, error=f"{type(e).__name__}: {e.strerror or e}")
    comm.Barrier()
    try:
        result["sees_rank0"] = (folder / f"{PROBE_PREFIX}{token}").read_text() == token
    except OSError:
        pass
    comm.Barrier()
    if rank == 0:
        try:  # a path under a file raises NotADirectoryError even here: not writable, above
            (folder / f"{PROBE_PREFIX}{token}").unlink(missing_ok=True)
        except OSError:
            pass
    comm.Barrier()
    if made:
        try:
            folder.rmdir()  # only if empty: another rank's host may have made it too
        except OSError:
            pass
    return result


def _send_burst(comm, peer: int, size: int, count: int, buffer: bytearray) -> float:
    """Send ``count`` messages and wait for the answer: the seconds it took."""
    comm.send(count, dest=peer, tag=CTRL)
    start = time.perf_counter()
    for _ in range(count):
        comm.Send([buffer, size, _byte()], dest=peer, tag=DATA)
    comm.Recv([bytearray(1), 1, _byte()], source=peer, tag=ACK)
    return time.perf_counter() - start


def _receive_bursts(comm, peer: int, size: int, buffer: bytearray) -> None:
    """Answer the sender's bursts until it sends a count of 0."""
    while True:
        count = comm.recv(source=peer, tag=CTRL)
        if not count:
            return
        for _ in range(count):
            comm.Recv([buffer, size, _byte()], source=peer, tag=DATA)
        comm.Send([bytearray(1), 1, _byte()], dest=peer, tag=ACK)


def _byte():
    from mpi4py import MPI
    return MPI.BYTE


def latency(comm, peer: int, first: bool, rounds: int = 20) -> float:
    """Half the shortest round trip of a 1-byte message, in seconds."""
    one, best = bytearray(1), math.inf
    for _ in range(rounds):
        start = time.perf_counter()
        if first:
            comm.Send([one, 1, _byte()], dest=peer, tag=DATA)
            comm.Recv([one, 1, _byte()], source=peer, tag=DATA)
        else:
            comm.Recv([one, 1, _byte()], source=peer, tag=DATA)
            comm.Send([one, 1, _byte()], dest=peer, tag=DATA)
        best = min(best, time.perf_counter() - start)
    return best / 2


def one_direction(comm, peer: int, sizes: list[int], target_s: float, budget_s: float,
                  lat: float) -> list[dict]:
    """The sender's side: per size, seconds per message and Mbit/s of payload. Bursts double
    until they fill ``target_s``, so no guess of a count can outlast the budget; a size that
    would not fit the budget is left out (and every larger one)."""
    results, buffer, ends = [], bytearray(max(sizes)), time.monotonic() + budget_s
    rate = None  # bytes per second so far
    for size in sizes:
        if rate is not None and size / rate * 3 > ends - time.monotonic():
            break
        _send_burst(comm, peer, size, 1, buffer)  # drains a token bucket's burst
        done, burst, seconds = 0, 1, 0.0
        while True:
            seconds += max(_send_burst(comm, peer, size, burst, buffer) - lat, 1e-9)
            done += burst
            burst = min(2 * burst, MAX_MESSAGES)
            if seconds >= target_s or time.monotonic() + seconds / done * burst > ends:
                break
        rate = done * size / seconds
        results.append({"bytes": size, "seconds": seconds / done, "mbit": rate * 8 / 1e6})
    comm.send(0, dest=peer, tag=CTRL)
    return results


def pair_test(comm, a: int, b: int, sizes: list[int], target_s: float,
              budget_s: float) -> dict | None:
    """A ping-pong between ranks ``a`` and ``b``: latency, then each direction's rate per size.
    Returns the link (at rank ``a``), None at ``b``."""
    rank = comm.Get_rank()
    lat = latency(comm, b if rank == a else a, first=rank == a)
    halves = []
    for sender, receiver in ((a, b), (b, a)):
        if rank == sender:
            halves.append(one_direction(comm, receiver, sizes, target_s, budget_s / 2, lat))
        else:
            _receive_bursts(comm, sender, max(sizes), bytearray(max(sizes)))
    if rank == b:
        comm.send(halves[0], dest=a, tag=CTRL)
        return None
    back = comm.recv(source=b, tag=CTRL)
    return link_summary(halves[0], back, lat)


def link_summary(forth: list[dict], back: list[dict], lat: float) -> dict:
    """The link's figures: per size the slower direction, and its rate at the largest size both
    directions measured."""
    by_size = {r["bytes"]: r for r in forth}
    sizes = []
    for r in back:
        if r["bytes"] in by_size:
            other = by_size[r["bytes"]]
            slow = r if r["mbit"] < other["mbit"] else other
            sizes.append({"bytes": r["bytes"], "seconds": round(slow["seconds"], 9),
                          "mbit": round(slow["mbit"], 3),
                          "mbit_each_way": [round(other["mbit"], 3), round(r["mbit"], 3)]})
    return {"bandwidth_mbit": sizes[-1]["mbit"] if sizes else None,
            "latency_ms": round(lat * 1e3, 4), "sizes": sizes}


def links(comm, hosts: list[str], sizes: list[int], budget_s: float,
          starting=lambda x, y: None) -> list[dict]:
    """Every pair of hosts in turn, between their leaders (rank 0 collects the results).
    ``starting(x, y)`` is called by the first leader before each pair's test."""
    rank, heads = comm.Get_rank(), leaders(hosts)
    pairs = list(combinations(heads, 2))
    found = []
    per_pair = budget_s / max(1, len(pairs))
    target = min(0.3, per_pair / (2 * len(sizes) * 2.5))
    for x, y in pairs:
        a, b = heads[x], heads[y]
        if rank == a:
            starting(x, y)
        if rank in (a, b):
            link = pair_test(comm, a, b, sizes, target, per_pair)
            if link is not None:
                found.append({"hosts": [x, y], **link})
        comm.Barrier()  # strictly in turn: no other pair's traffic, and the step said is this
    gathered = comm.gather(found, root=0)
    return [link for part in gathered for link in part] if rank == 0 else []


def allreduce(comm, sizes: list[int], budget_s: float, target_s: float = 0.3) -> dict | None:
    """An allreduce of float32 over all ranks per size; bus bandwidth as nccl-tests reports it
    (algorithm bandwidth x 2(n-1)/n). Rank 0's figures; None with one rank. Run in doubling
    batches, rank 0 saying after each whether to go on: ranks that share too few cores can be
    slow enough for one guess of the count to outlast the doctor."""
    import numpy as np
    from mpi4py import MPI

    n = comm.Get_size()
    if n < 2:
        return None
    results, ends = [], time.monotonic() + budget_s
    for size in sizes:
        if results and not comm.bcast(  # a size that would not fit (a slow link): left out
                results[-1]["seconds"] / results[-1]["bytes"] * size * 3
                < ends - time.monotonic(), root=0):
            break
        data = np.ones(max(1, size // 4), dtype=np.float32)
        out = np.empty_like(data)
        comm.Allreduce(data, out, op=MPI.SUM)  # the first one connects the ranks
        done, batch, start = 0, 1, time.perf_counter()
        while True:
            for _ in range(batch):
                comm.Allreduce(data, out, op=MPI.SUM)
            done += batch
            spent = time.perf_counter() - start
            batch = min(2 * batch, 256)
            if not comm.bcast(spent < target_s and
                              time.monotonic() + spent / done * batch < ends, root=0):
                break
        seconds = comm.bcast(spent / done, root=0)
        algbw = data.nbytes / seconds
        results.append({"bytes": data.nbytes, "seconds": round(seconds, 9),
                        "bus_mbit": round(algbw * 2 * (n - 1) / n * 8 / 1e6, 3)})
    return {"ranks": n, "sizes": results}
