"""--backup-workers (Chen et al. 2016): the parameter server's rounds, driven without MPI.

A real ParameterServer runs here on a fake communicator and a fake shared-memory window
(tests/fake_ps.py), so the tests feed it request headers in an order they choose and read off
which worker got which reply. The last test lets random schedules of several
workers and servers run to the end, checking that no schedule hangs and that no applied
gradient was computed on old parameters."""

from __future__ import annotations

import random
from collections import defaultdict

import numpy as np
import pytest

from fake_ps import REPLIES, Job, replied, stopped
from hvdtrain.config import Config, ConfigError
from hvdtrain.layout import Topology
from hvdtrain.ps import server as server_module
from hvdtrain.ps.protocol import NO_GRADIENT, WANT_PARAMS, WANTS_STOP, Kind, Tag, make_header
from hvdtrain.rules.backup import check_backup_workers
from hvdtrain.rules.bsp import bsp_quorum


def gradients(job: Job, seed: int = 1) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(job.initial.size).astype(np.float32)
            for _ in range(job.topology.num_workers)]


# --- the arithmetic -------------------------------------------------------------------------
def test_quorum_is_n_minus_b_until_fewer_workers_push():
    assert bsp_quorum(4, 0, 4) == 4          # plain BSP: everyone
    assert bsp_quorum(4, 1, 4) == 3          # the first N-b
    assert bsp_quorum(4, 1, 2) == 2          # two workers left: both
    assert bsp_quorum(4, 3, 4) == 1
    assert bsp_quorum(4, 1, 0) == 1          # never 0: a push always closes something
    check_backup_workers(0, 1)
    check_backup_workers(2, 3)
    with pytest.raises(ConfigError, match="2 worker.*at most 1 backup"):
        check_backup_workers(2, 2)
    with pytest.raises(ConfigError, match="invalid value -1"):
        check_backup_workers(-1, 2)


def test_config_refuses_backup_workers_outside_bsp_and_with_sparse_pulls():
    def validate(**values):
        return Config.from_overrides(values).validate()

    validate(mode="async", bsp=True, backup_workers=1)
    with pytest.raises(ConfigError, match="--backup-workers.*add --bsp, or drop"):
        validate(mode="async", backup_workers=1)
    with pytest.raises(ConfigError, match="--bsp: an option of the parameter server"):
        validate(mode="sync", bsp=True, backup_workers=1)
    with pytest.raises(ConfigError, match="--backup-workers.*--mode async --bsp"):
        validate(mode="sync", backup_workers=1)
    with pytest.raises(ConfigError, match="--pull-every.*--pull-every 1"):
        validate(mode="async", bsp=True, backup_workers=1, pull_every=2)
    with pytest.raises(ConfigError, match="--backup-workers: invalid value -1"):
        validate(mode="async", bsp=True, backup_workers=-1)


def test_the_layout_refuses_as_many_backup_workers_as_workers_before_any_rank_communicates():
    from hvdtrain.layout import Layout

    cfg = Config.from_overrides(dict(mode="async", bsp=True, backup_workers=2)).validate()
    assert Layout.build(cfg, 4, 0, 4).num_servers == 1  # 3 workers: 2 backups leave a quorum
    with pytest.raises(ConfigError, match="this job has 2 worker.*at most 1 backup"):
        Layout.build(cfg, 3, 0, 3)


# --- one server, scripted schedules -----------------------------------------------------------
def test_a_round_closes_at_n_minus_b_and_drops_the_late_gradient(monkeypatch):
    job = Job(monkeypatch, workers=3, backup=1)
    g = gradients(job)
    lr = 0.5
    assert job.push(0, g[0], lr=lr) == set()          # 1 of 2: held back
    assert job.push(1, g[1], lr=lr) == {0, 1}         # 2 of 2: the round closes
    after_first = job.initial - np.float32(lr) * ((g[0] + g[1]) / np.float32(2))
    np.testing.assert_allclose(job.params(), after_first, rtol=1e-6, atol=1e-6)
    # Worker 2 computed on the initial parameters: its gradient is dropped, and it gets the new
    # parameters at once instead of waiting for the next round.
    assert job.push(2, g[2], lr=lr) == {2}
    np.testing.assert_array_equal(job.params(), after_first.astype(np.float32))
    server = job.servers[0]
    assert server.engine.stats.dropped_gradients == 1
    assert server.engine.versions.pulled[2] == server.engine.version == 1
    # Now it is fresh: it joins the next round, which worker 0 closes; worker 1 is late.
    assert job.push(2, g[2], lr=lr) == set()
    assert job.push(0, g[0], lr=lr) == {0, 2}
    assert job.push(1, g[1], lr=lr) == {1}
    expected = after_first - np.float32(lr) * ((g[2] + g[0]) / np.float32(2))
    np.testing.assert_allclose(job.params(), expected, rtol=1e-6, atol=1e-6)
    stats = server.statistics()
    assert stats["dropped_gradients"] == 2 and stats["updates"] == 2
    assert stats["staleness_histogram"] == {0: 4}  # every applied gradient was fresh
    assert stats["gradients_per_round"] == {2: 2}


def test_without_backup_workers_every_round_waits_for_everyone(monkeypatch):
    job = Job(monkeypatch, workers=3, backup=0)
    g = gradients(job)
    # ACK replies (--pull-every > 1) leave pulled_version behind: plain BSP must not read that
    # as lateness.
    for _ in range(2):
        assert job.push(0, g[0], flags=0) == set()
        assert job.push(1, g[1], flags=0) == set()
        assert job.push(2, g[2], flags=0) == {0, 1, 2}
    stats = job.servers[0].statistics()
    assert stats["dropped_gradients"] == 0 and stats["gradients_per_round"] == {3: 2}
    mean = (g[0] + g[1] + g[2]) / np.float32(3)
    np.testing.assert_allclose(job.params(), job.initial - 2 * mean, rtol=1e-5, atol=1e-5)


def test_a_push_without_gradient_counts_for_the_quorum_but_is_never_dropped(monkeypatch):
    job = Job(monkeypatch, workers=2, backup=1)
    g = gradients(job)
    assert job.push(0, None) == {0}  # a round of one skipped fp16 step: nothing to apply
    assert job.servers[0].engine.version == 0
    assert job.push(1, g[1]) == {1}  # still fresh: the parameters did not change
    assert job.push(0, None) == {0}  # late, but it carries no gradient to drop
    stats = job.servers[0].statistics()
    assert stats["dropped_gradients"] == 0 and stats["pushes_without_gradient"] == 2
    assert stats["gradients_per_round"] == {0: 1, 1: 1}


def test_idle_and_finished_workers_shrink_the_quorum_so_the_end_never_waits(monkeypatch):
    job = Job(monkeypatch, workers=4, backup=1)
    g = gradients(job)
    assert job.push(0, g[0]) == set()
    # Workers 1 and 2 wait for the others at the end of training: rounds stop counting on them.
    assert replied(job.send(1, Kind.IDLE)) == set()  # 2 can still push: quorum min(3, 2) = 2
    assert replied(job.send(2, Kind.IDLE)) == set()
    assert job.push(3, g[3]) == {0, 3}  # quorum min(3, 2) = 2
    assert job.push(0, g[0]) == set()
    assert replied(job.send(3, Kind.IDLE)) == {0}  # the last one left closes its own round
    # A worker that pushes again after a collective counts again.
    assert job.push(1, g[1]) == {1}  # late: it last pulled before two rounds closed
    assert job.push(1, g[1]) == set()
    assert job.push(0, g[0]) == {0, 1}
    assert job.push(0, g[0]) == set()
    assert replied(job.send(1, Kind.DONE)) == {0}  # a finished worker: the same
    assert job.servers[0].statistics()["staleness_histogram"] == {0: 6}


def test_a_stop_reaches_every_worker_from_a_late_push_and_from_a_round(monkeypatch):
    job = Job(monkeypatch, workers=3, backup=1)
    g = gradients(job)
    job.push(0, g[0])
    job.push(1, g[1])  # the round closes without worker 2
    job.push(0, g[0])  # the next round is under way
    # Worker 2's push, with its stop signal, is late: no round will carry the signal for it, so
    # the server stops every worker at once, before its reply.
    job.segments[2][:] = g[2]
    messages = job.send(2, Kind.PUSH, flags=WANT_PARAMS | WANTS_STOP)
    assert stopped(messages) == {0, 1, 2} and replied(messages) == {2}
    assert messages.index((2, Tag.STOP)) < min(i for i, (d, t) in enumerate(messages)
                                               if d == 2 and t in REPLIES)
    # A fresh push with the signal stops everyone when its round closes (plain --bsp's rule).
    job = Job(monkeypatch, workers=3, backup=1)
    job.segments[0][:] = g[0]
    assert stopped(job.send(0, Kind.PUSH, flags=WANT_PARAMS | WANTS_STOP)) == set()
    messages = job.send(1, Kind.PUSH, flags=WANT_PARAMS)
    assert stopped(messages) == {0, 1, 2} and replied(messages) == {0, 1}


# --- random schedules, several servers ----------------------------------------------------------
class Worker:
    """A worker as the client behaves: push to every server and wait for every reply. Told to
    stop (a STOP from any server), it goes idle and waits for every server's STOP; after its
    last step it goes idle, waits for the other workers (and, if any was stopped, for every
    server's STOP), then says DONE."""

    def __init__(self, index: int, steps: int):
        self.index, self.steps_left = index, steps
        self.waiting: set[int] = set()   # servers whose reply is still to come
        self.version: dict[int, int] = defaultdict(int)  # each server's version in its last reply
        self.stops: set[int] = set()     # servers whose STOP came
        self.wants_stop = False
        self.state = "training"          # training | stopping | ending | done
        self.clock = 0                   # pushes made


def simulate(monkeypatch, workers: int, backup: int, servers: int, seed: int, steps: int = 12):
    rnd = random.Random(seed)
    job = Job(monkeypatch, workers, backup, servers, total=2 * servers, seed=seed)
    ranks = job.topology.server_ranks()
    pool = [Worker(w, steps) for w in range(workers)]
    everyone = set(range(servers))
    signal_at = rnd.randrange(steps * workers) if rnd.random() < 0.3 else None
    pushes = 0
    rounds = defaultdict(list)  # server -> (members in order, rate) of each round it closed

    for s, server in enumerate(job.servers):  # every applied gradient must be fresh
        def checked(original=server.engine._close_round, s=s, engine=server.engine):
            for w in engine.pending:
                assert pool[w].version[s] == engine.version, (
                    f"server {s} applies worker {w}'s gradient computed on version "
                    f"{pool[w].version[s]}, its parameters are at {engine.version}")
            rounds[s].append((list(engine.pending),
                              engine.round_lr if engine.round.gradients else None))
            original()
        server.engine._close_round = checked

    def send(worker: Worker, kind: Kind, flags: int = 0, to=ranks):
        worker.clock += kind == Kind.PUSH  # a server refuses a push whose clock stands still
        header = make_header(kind, clock=worker.clock, lr=rnd.choice([0.5, 1.0]), flags=flags,
                             worker=worker.index)
        for rank in to:
            job.queues[rank, worker.index].append(header)
        if kind in (Kind.PUSH, Kind.PULL):
            worker.waiting = set(everyone)

    def deliver(rank: int, source: int):
        s = job.topology.server_index(rank)
        header = job.queues[rank, source].popleft()
        if header[0] == Kind.PUSH and not header[3] & NO_GRADIENT:
            a, b = job.bounds[s]
            job.segments[source][a:b] = 1.0  # the values do not matter here; the versions do
        for dest, tag in job.handle(rank, source, header):
            if tag in REPLIES:
                pool[dest].waiting.discard(s)
                pool[dest].version[s] = job.servers[s].engine.version
            elif tag == Tag.STOP:
                pool[dest].stops.add(s)

    def can_act(worker: Worker) -> bool:
        if worker.waiting or worker.state == "done":
            return False
        if worker.state == "stopping":
            return worker.stops == everyone
        if worker.state == "ending":  # the workers' Iallreduce, then their STOPs if any
            all_there = all(p.state in ("ending", "done") for p in pool)
            stopped = any(p.stops for p in pool)
            return all_there and (not stopped or worker.stops == everyone)
        return True

    def act(worker: Worker):
        nonlocal pushes
        if worker.state == "training" and worker.stops:
            worker.state = "stopping"
            send(worker, Kind.IDLE, to=ranks[:1])  # IDLE goes to server 0 alone
        elif worker.state == "stopping" or (worker.state == "training" and
                                              not worker.steps_left):
            worker.state = "ending"
            send(worker, Kind.IDLE, to=ranks[:1])
        elif worker.state == "ending":
            worker.state = "done"
            send(worker, Kind.DONE)
        elif worker.index == 0 and rnd.random() < 0.1:  # an evaluation's pull
            send(worker, Kind.PULL)
        else:
            pushes += 1
            worker.wants_stop |= pushes == signal_at
            flags = WANT_PARAMS | (WANTS_STOP if worker.wants_stop else 0)
            flags |= NO_GRADIENT if rnd.random() < 0.1 else 0
            worker.steps_left -= 1
            send(worker, Kind.PUSH, flags)

    while not all(p.state == "done" for p in pool) or any(job.queues.values()):
        moves = [("deliver", key) for key, q in job.queues.items() if q]
        moves += [("act", p) for p in pool if can_act(p)]
        servers_now = [(s.engine.round.pushes, s.engine.policy.quorum(s.engine.clocks),
                        len(s.engine.verdicts)) for s in job.servers]
        assert moves, (
            f"hang: workers {[(p.index, p.state, sorted(p.waiting)) for p in pool]}, servers "
            f"{servers_now}")
        what, arg = rnd.choice(moves)
        deliver(*arg) if what == "deliver" else act(arg)
    assert not any(job.payloads.values())
    for s in range(1, servers):  # every shard: the same rounds, members and rates
        if backup:
            assert rounds[s] == rounds[0], s
        else:  # plain --bsp: every round has every running worker (the workers share the rate)
            assert [sorted(m) for m, _ in rounds[s]] == [sorted(m) for m, _ in rounds[0]], s
    return job


@pytest.mark.parametrize("workers, backup, servers", [
    (2, 1, 1), (3, 1, 1), (3, 2, 1), (4, 1, 2), (4, 2, 2), (5, 2, 3), (3, 0, 2)])
def test_random_schedules_never_hang_and_apply_only_fresh_gradients(monkeypatch, workers, backup,
                                                                     servers):
    for seed in range(40):
        job = simulate(monkeypatch, workers, backup, servers, seed)
        for server in job.servers:
            stats = server.statistics()
            assert set(stats["staleness_histogram"]) <= {0}, stats
            applied = sum(k * v for k, v in stats["gradients_per_round"].items())
            assert applied + stats["dropped_gradients"] + stats["pushes_without_gradient"] \
                == stats["pushes_applied"], stats  # every push: applied, dropped or empty
            if not backup:
                assert stats["dropped_gradients"] == 0


def test_shards_that_decided_their_rounds_alone_would_hang(monkeypatch):
    """Why server 0 decides for every shard: with each server judging lateness on its own, a
    worker late at one shard and on time at another waits there for a round that the workers
    it waits for cannot join. The schedules above find that at once."""
    build = server_module.ParameterServer.__init__

    def on_its_own(self, *args, **kwargs):
        build(self, *args, **kwargs)
        self.verdicts.is_leader, self.verdicts.followers = True, []
        self.verdicts.follows = False

    monkeypatch.setattr(server_module.ParameterServer, "__init__", on_its_own)
    hangs = 0
    for seed in range(5):
        try:
            simulate(monkeypatch, workers=5, backup=2, servers=3, seed=seed)
        except AssertionError as e:  # a hang, or (when none came) shards that disagree
            hangs += str(e).startswith("hang")
    assert hangs, "independent shards never hung: the schedules no longer test the leader"


# --- evaluation pauses (--eval-pauses-workers): the debts --------------------------------------
def test_a_pause_charges_each_worker_the_time_it_computed_during_the_evaluation(monkeypatch):
    # Plain async, 4 workers: worker 0 evaluates from t=1.0 to t=1.2. Worker 1 pushes at 1.03
    # (its reply is held), worker 2 is still computing at the end, worker 3 waits for the
    # others (IDLE) all along. As if the job had frozen: worker 1 owes 0.03 s, worker 2 0.2 s
    # (with its next reply), worker 3 nothing; each debt goes out before its reply.
    job = Job(monkeypatch, workers=4, backup=0, bsp=False)
    server = job.servers[0]
    job.send(3, Kind.IDLE, now=0.5)
    job.send(0, Kind.PAUSE, now=1.0)
    job.sent.clear()
    header = make_header(Kind.PUSH, clock=1, lr=1.0, flags=WANT_PARAMS, worker=1)
    job.segments[1][:] = 1.0
    assert replied(job.handle(job.topology.server_ranks()[0], 1, header, now=1.03)) == set()  # held
    messages = job.send(0, Kind.RESUME, now=1.2)
    assert replied(messages) == {1}
    to_1 = [(tag, payload) for dest, tag, payload in job.sent if dest == 1]
    assert to_1[0][0] == Tag.DEBT and to_1[0][1][0] == pytest.approx(0.03)
    assert all(tag != Tag.DEBT for tag, _ in to_1[1:])  # the reply follows
    job.sent.clear()
    header = make_header(Kind.PUSH, clock=1, lr=1.0, flags=WANT_PARAMS, worker=2)
    job.segments[2][:] = 1.0
    assert replied(job.handle(job.topology.server_ranks()[0], 2, header, now=1.25)) == {2}
    to_2 = [(tag, payload) for dest, tag, payload in job.sent if dest == 2]
    assert to_2[0][0] == Tag.DEBT and to_2[0][1][0] == pytest.approx(0.2)
    assert not [m for m in job.sent if m[0] in (0, 3) and m[1] == Tag.DEBT]
    assert server.pauses.debt_seconds == pytest.approx(0.23)
    # the next pause charges anew; a worker's debts are paid once
    job.sent.clear()
    header = make_header(Kind.PUSH, clock=2, lr=1.0, flags=WANT_PARAMS, worker=2)
    assert replied(job.handle(job.topology.server_ranks()[0], 2, header, now=1.3)) == {2}
    assert not [m for m in job.sent if m[1] == Tag.DEBT]
