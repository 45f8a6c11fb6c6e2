"""Each async-side rule on a real ParameterServer on a fake communicator (tests/fake_ps.py), fed
push headers in a chosen arrival order: it holds, drops and applies stale gradients as the rule
says. The rules come from the mode's Config options (rules/registry.py), as in a real run. (The
simulator runs the same server engine, engines/server_engine.py: tests/unit/test_engine_server.py.)"""

from __future__ import annotations

import numpy as np

from fake_ps import Job, replied
from hvdtrain.config import Config
from hvdtrain.ps.protocol import WANT_PARAMS, Kind, make_header
from hvdtrain.rules.registry import DC_LAMBDA, Mode

WORKERS, TOTAL, LR = 3, 10, 0.1
CHUNK_MB = 4 * 4 / (1024 * 1024)  # chunks of 4 elements: the server applies 3 per gradient

# (mode, arrival order): who pushes next. A worker pushes only once it has its reply, so each
# order is one that could happen; the drivers check that too.
CASES = [
    (Mode("async"), [0, 1, 2, 0, 0, 1, 2, 1, 0, 2]),
    # ssp1: worker 0 goes 2 ahead and is held until workers 1 and 2 have pushed once
    (Mode("ssp1", staleness=1.0), [0, 0, 1, 2, 0, 1, 2, 2, 1, 0]),
    (Mode("bsp", staleness=0.0, bsp=True), [0, 1, 2, 2, 0, 1, 1, 2, 0]),
    # backup1: rounds of the first 2; worker 2 (then 1, then 2) pushes late and is dropped
    (Mode("backup1", staleness=0.0, bsp=True, backup_workers=1), [0, 1, 2, 2, 0, 1, 1, 0, 2]),
    (Mode("async-slr", staleness_lr=True), [0, 1, 2, 0, 0, 1, 2, 1, 0, 2]),
    (Mode("dcasgd", dc_lambda=DC_LAMBDA), [0, 1, 2, 0, 0, 1, 2, 1, 0, 2]),
]


def config(mode: Mode) -> Config:
    cfg = Config()
    for name, value in mode.config_options().items():
        setattr(cfg.run if name == "mode" else cfg.ps, name, value)
    cfg.ps.chunk_mb = CHUNK_MB
    cfg.optim.momentum = 0.9  # state that carries from one update to the next
    return cfg


def fixed_gradients(order: list[int]) -> dict[tuple[int, int], np.ndarray]:
    """(worker, its push number) -> its gradient; large enough that DC-ASGD's term shows."""
    rng = np.random.default_rng(7)
    return {(w, k): rng.standard_normal(TOTAL).astype(np.float32) * 3
            for w in range(WORKERS) for k in range(1, len(order) + 1)}


def lr_of(cfg: Config) -> float:
    rules = Mode("x", bsp=cfg.ps.bsp, backup_workers=cfg.ps.backup_workers).server_rules(WORKERS)
    return LR * rules.policy.lr_scale(WORKERS)  # as the client's schedule scales it


# --- the real server's way --------------------------------------------------------------------
def run_server(monkeypatch, cfg: Config, order: list[int], grads) -> dict:
    job = Job(monkeypatch, WORKERS, cfg.ps.backup_workers, total=TOTAL, cfg=cfg)
    server, rank = job.servers[0], job.topology.server_ranks()[0]
    start = job.initial.copy()
    for w in range(WORKERS):  # as a client starts: it pulls the parameters
        job.handle(rank, w, make_header(Kind.PULL, worker=w))
    pushes, waiting, replies = [0] * WORKERS, set(), []
    for w in order:
        assert w not in waiting, f"worker {w} pushes before its reply: fix the order"
        pushes[w] += 1
        job.segments[w][:] = grads[w, pushes[w]]
        header = make_header(Kind.PUSH, clock=pushes[w], lr=lr_of(cfg), flags=WANT_PARAMS,
                             worker=w)
        got = replied(job.handle(rank, w, header))
        waiting = (waiting | {w}) - got
        replies.append(sorted(got))
    stats = server.statistics()
    return {"params": job.params(), "start": start, "replies": replies,
            "dropped": stats["dropped_gradients"], "staleness": stats["staleness_histogram"]}


def test_each_rule_holds_drops_or_applies_stale_gradients_on_the_real_server(monkeypatch):
    """The orders above hold a worker (SSP), drop a late gradient (backup workers) and apply
    stale gradients (async); every rule updates the parameters."""
    outcome = {}
    for mode, order in CASES:
        outcome[mode.name] = run_server(monkeypatch, config(mode), order, fixed_gradients(order))
    assert [] in outcome["ssp1"]["replies"]            # a push whose reply was held
    assert outcome["backup1"]["dropped"] == 3
    assert max(outcome["async"]["staleness"]) >= 2
    assert outcome["bsp"]["dropped"] == 0 and set(outcome["bsp"]["staleness"]) == {0}
    for mode, _ in CASES:
        assert not np.array_equal(outcome[mode.name]["params"], outcome[mode.name]["start"])
