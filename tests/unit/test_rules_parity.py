"""Each async-side rule, driven as the real parameter server drives it and as the simulator
does, on the same gradients in the same arrival order: the parameters, the drops and the replies
match exactly.

The server side is a real ParameterServer on a fake communicator (tests/fake_ps.py), fed push
headers. The simulator side is compare/sim/server_run.py's ServerRun on a stand-in Simulation whose
workers hand in the same fixed gradients. Both build their rules from the mode's Config options
(rules/registry.py), as a real run and a simulated one do."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from fake_ps import Job, replied
from hvdtrain.compare.sim.server_run import ServerRun
from hvdtrain.compare.sim.timing import Timing
from hvdtrain.compare.sim.workers import _Worker
from hvdtrain.config import Config
from hvdtrain.ps.protocol import WANT_PARAMS, Kind, chunk_bounds, chunk_elements, make_header
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


# --- the simulator's way ----------------------------------------------------------------------
class StandIn:
    """What ServerRun reads of its Simulation, with workers that hand in fixed gradients."""

    def __init__(self, cfg: Config, start: np.ndarray, grads):
        from collections import Counter

        self.setup = SimpleNamespace(cfg=cfg, model=SimpleNamespace(
            flat=torch.from_numpy(start.copy())))
        self.timing = Timing(step_seconds=1.0)
        self.num_workers, self.seed, self.total_steps, self.steps_per_epoch = WORKERS, 0, 99, 99
        self.chunks = chunk_bounds(TOTAL, chunk_elements(cfg.ps.chunk_mb))
        self.workers = [_Worker(r, plan=None) for r in range(WORKERS)]
        self.staleness, self.pushes, self.now, self._changed = Counter(), [], 0.0, False
        self.grads = grads

    def _lr(self, step: int, lr_scale: float) -> float:
        return LR * lr_scale

    def _gradient(self, w, weights, clip: bool = True) -> torch.Tensor:
        w.steps += 1
        return torch.from_numpy(self.grads[w.rank, w.steps].copy())

    def _delay(self, *args) -> float:
        return 0.0

    def _maybe_evaluate(self, at, weights) -> None:
        pass


def run_simulator(cfg: Config, order: list[int], grads, start: np.ndarray) -> dict:
    sim = StandIn(cfg, start, grads)
    run = ServerRun(sim)
    got: list[int] = []
    reply = run._reply
    run._reply = lambda w, at, first=False: (got.append(w.rank), reply(w, at, first))
    for w in sim.workers:
        run._reply(w, 0.0, first=True)  # as run() starts: every worker gets the weights
    waiting, replies = set(), []
    for t, w in enumerate(order, start=1):
        assert w not in waiting, f"worker {w} pushes before its reply: fix the order"
        got.clear()
        run._arrive(sim.workers[w], float(t))
        waiting = (waiting | {w}) - set(got)
        replies.append(sorted(set(got)))
    dropped = sum(1 for p in sim.pushes if p.staleness is None)
    assert dropped == run.stats.dropped_gradients
    return {"params": run.params.numpy().copy(), "replies": replies, "dropped": dropped,
            "staleness": {int(k): int(v) for k, v in sorted(sim.staleness.items())}}


@pytest.mark.parametrize("mode, order", CASES, ids=[m.name for m, _ in CASES])
def test_server_and_simulator_run_a_rule_alike(monkeypatch, mode, order):
    grads = fixed_gradients(order)
    real = run_server(monkeypatch, config(mode), order, grads)
    simulated = run_simulator(config(mode), order, grads, real["start"])
    assert simulated["replies"] == real["replies"]
    assert simulated["dropped"] == real["dropped"]
    assert simulated["staleness"] == real["staleness"]
    np.testing.assert_array_equal(simulated["params"], real["params"])
    assert not np.array_equal(real["params"], real["start"])  # the rule did update something


def test_the_orders_exercise_what_each_rule_is_about(monkeypatch):
    """The cases above must hold a worker (SSP), drop a late gradient (backup workers) and
    apply stale gradients (async), or their agreement would say little."""
    outcome = {}
    for mode, order in CASES:
        outcome[mode.name] = run_server(monkeypatch, config(mode), order, fixed_gradients(order))
    assert [] in outcome["ssp1"]["replies"]            # a push whose reply was held
    assert outcome["backup1"]["dropped"] == 3
    assert max(outcome["async"]["staleness"]) >= 2
    assert outcome["bsp"]["dropped"] == 0 and set(outcome["bsp"]["staleness"]) == {0}
