"""A parameter server's shard beside a checkpoint: each server writes its own parameters and
optimizer state (checkpoint.server-0.pt beside checkpoint.pt) when the lead asks for a checkpoint
(Kind.SAVE), and reads them back on resume. What the lead's checkpoint gets from the servers is
small: the clocks, the version, the staleness histogram, the batch plan, and where each shard
went. Its model is the lead's own replica, which holds the servers' parameters of its last reply
(an evaluation's pull, or async DiLoCo's round pushed for the checkpoint): the model that was
evaluated, which is what best.pt should hold.

Why: the lead used to fetch every shard and its optimizer vectors for each checkpoint, and the
server could serve nobody while they crossed. Over the slow-link lab's 100 Mbit/s link (a 2.2M
parameter model, async DiLoCo with outer momentum: three vectors) that held the server 2.2 s at
every epoch's end, on the training clock (docs/comparison.md). Written where it lies, a
checkpoint moves nothing across the link. The run folder must be reachable from the servers'
hosts, as it already is from every worker's (loop/own_state.py); where a server cannot write
there, it says so, and a resume from that checkpoint starts its shard from the checkpoint's model
with fresh optimizer state.

The files follow own_state's rules (atomic, tagged with the checkpoint's position, the previous
one kept). A file records the elements of the flattened parameters it holds, so on resume each
server assembles its shard from whichever files cover it: a resume may change --num-servers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from .. import checkpoint
from ..loop import own_state

FALLBACK = "from the checkpoint's model, with fresh optimizer state"


def save(shard, index: int, place: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    """Write server ``index``'s ``shard`` beside the checkpoint of ``place`` (its path, its
    position); the entry the checkpoint lists for it."""
    beside, position = place
    a, b = shard.bounds
    state = {"bounds": [a, b], "params": shard.params, "vectors": shard.optimizer.vectors,
             "scalars": shard.optimizer.scalars()}
    own_state.save(state, Path(beside), {**position, checkpoint.SERVER_FILE_KEY: index},
                   fallback=FALLBACK)
    return {"server": index, "bounds": [a, b]}


def read(bounds: tuple[int, int], shards: list[dict[str, Any]],
         place: tuple[str, dict[str, Any]]) -> tuple[dict[str, Any] | None, str]:
    """The elements ``bounds`` of the parameters and of each optimizer vector, with the
    optimizer's scalars, from the files of the checkpoint's servers (``shards``, its entries)
    that cover them; else (None, why not)."""
    beside, position = Path(place[0]), place[1]
    a, b = bounds
    params, vectors, scalars, covered = torch.empty(b - a), {}, {}, 0
    for entry in shards:
        start, end = entry["bounds"]
        low, high = max(a, start), min(b, end)
        if low >= high:
            continue
        state, why = own_state.read(beside, {**position,
                                             checkpoint.SERVER_FILE_KEY: entry["server"]})
        if state is None:
            return None, why
        params[low - a:high - a] = state["params"][low - start:high - start]
        for name, vector in state["vectors"].items():
            vectors.setdefault(name, torch.zeros(b - a))[low - a:high - a] = \
                vector[low - start:high - start]
        scalars, covered = state["scalars"], covered + high - low
    if covered != b - a:
        return None, f"the checkpoint's servers' files hold {covered} of its {b - a} elements"
    return {"params": params, "vectors": vectors, "scalars": scalars}, ""


def restore(shard, index: int, meta: dict[str, Any]) -> bool:
    """On resume (INIT): server ``index``'s parameters and optimizer state from the files that
    ``meta`` (the checkpoint's server state) lists; False, and one line saying why, where it
    keeps the checkpoint's model that INIT brought, with fresh optimizer state."""
    found, why = read(shard.bounds, meta["shards"], meta["place"])
    if found is None:
        print(f"hvdtrain: parameter server {index} starts {FALLBACK}, not its own shard: {why}",
              flush=True)
        return False
    shard.params.copy_(found["params"])
    if shard.device.type != "cpu":
        shard.optimizer.params_received()
    shard.optimizer.load(found["vectors"], found["scalars"])
    return True


def read_all(path: str | Path) -> dict[str, Any]:
    """The whole flattened parameters and optimizer vectors that the servers wrote beside the
    checkpoint ``path`` (for inspection and tests)."""
    path = checkpoint.checkpoint_path(path)
    state = checkpoint.load_checked(path)
    server = state["server_state"]
    total = max(entry["bounds"][1] for entry in server["shards"])
    found, why = read((0, total), server["shards"], (str(path), _position(state)))
    if found is None:
        raise checkpoint.CheckpointError(f"{path}: {why}")
    return found


def _position(state: dict[str, Any]) -> dict[str, Any]:
    return {key: state[key] for key in own_state.BASE_KEYS}
