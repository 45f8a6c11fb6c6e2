"""A replacement joins (--max-restarts, ps/replacement.py, ps/newcomer.py, ps/routes.py): when
a lost worker is replaced, where the newcomer's messages go, what it starts from, and which
launches are refused."""

import time
from collections import deque
from types import SimpleNamespace

import numpy as np
import pytest

from fake_ps import fake_engine
from hvdtrain.cli import build_parser, config_from_args
from hvdtrain.config import ConfigError
from hvdtrain.ps.dispatch import BatchDispatcher, SlotPlan
from hvdtrain.ps.membership import Membership
from hvdtrain.ps.newcomer import faults_after, newcomer_config
from hvdtrain.ps.replacement import (Replacements, check_restarts, job_step,
                                     should_replace, start_clock)
from hvdtrain.ps.routes import Routes
from hvdtrain.ps.silence import SilenceWatch

ANY = -1


def parse(*argv):
    return config_from_args(build_parser().parse_args(["train", *argv]))


# --- which launches are refused ----------------------------------------------------------------
@pytest.mark.parametrize("argv, hint", [
    (["--max-restarts", "1"], "add --mode async"),
    (["--mode", "async", "--max-restarts", "1", "--num-servers", "2"], "--num-servers 1"),
    (["--mode", "async", "--max-restarts", "1", "--bsp"], "drop --bsp"),
    (["--mode", "async", "--max-restarts", "-1"], "0 (no replacement)"),
])
def test_max_restarts_is_refused_where_no_replacement_can_join(argv, hint):
    with pytest.raises(ConfigError) as err:
        parse(*argv)
    assert str(err.value).startswith("--max-restarts") and hint in str(err.value)


def test_max_restarts_is_valid_for_async_with_one_server():
    assert parse("--mode", "async", "--max-restarts", "2").ps.max_restarts == 2
    assert parse().ps.max_restarts == 0


def test_without_mpiruns_recovery_the_message_says_how_to_launch():
    check_restarts(0, recovery=False)  # nothing asked, nothing refused
    check_restarts(1, recovery=True)
    with pytest.raises(ConfigError, match="orte_enable_recovery 1.*drop --max-restarts"):
        check_restarts(1, recovery=False)


# --- the decision ------------------------------------------------------------------------------
@pytest.mark.parametrize("max_restarts, started, finished, expected", [
    (1, 0, False, True), (1, 1, False, False), (2, 1, False, True), (0, 0, False, False),
    (1, 0, True, False),  # no batch left to train: a newcomer would find nothing to do
])
def test_a_lost_worker_is_replaced_while_restarts_and_batches_are_left(max_restarts, started,
                                                                       finished, expected):
    assert should_replace(max_restarts, started, finished) is expected


def test_a_newcomers_clock_never_holds_the_others_back_under_a_staleness_bound():
    inf = float("inf")
    assert start_clock(7, [30, 25, inf]) == 25  # the slowest live worker's
    assert start_clock(40, [30, 25, inf]) == 40  # the lost worker was further: its own
    assert start_clock(7, [inf, inf, inf]) == 7


def test_the_job_step_is_where_the_plans_next_batch_is():
    dispatcher = BatchDispatcher(SlotPlan(steps_per_epoch=4, num_parts=3, epochs=2))
    assert job_step(dispatcher) == 0
    for _ in range(14):  # slot 14: epoch 1, step 0
        dispatcher.take(0)
    assert job_step(dispatcher) == 4
    dispatcher.next = dispatcher.plan.total  # all handed out: the last step
    assert job_step(dispatcher) == 7
    assert job_step(None) == 0


# --- the newcomer's settings -------------------------------------------------------------------
def test_a_replacement_fires_no_fault_due_before_it_joined():
    schedule = "kill:rank=2,step=40;stop:rank=1,step=80,seconds=5;slow:rank=0,steps=10-50,factor=2"
    assert faults_after(schedule, 45) == "stop:rank=1,step=80,seconds=5;" \
                                         "slow:rank=0,steps=10-50,factor=2"
    assert faults_after(schedule, 80) == ""
    assert faults_after("", 10) == ""


def test_a_replacement_starts_from_the_servers_not_from_a_checkpoint():
    cfg = parse("--mode", "async", "--max-restarts", "1", "--run-dir", "somewhere",
                "--auto-resume", "--inject-faults", "kill:rank=2,step=40")
    mine = newcomer_config(cfg, job_step=50)
    assert (mine.run.resume, mine.run.auto_resume, mine.run.inject_faults) == (None, False, "")
    assert mine.run.run_dir == "somewhere" and cfg.run.auto_resume  # the original is unchanged


# --- where messages go -------------------------------------------------------------------------
class _Request:
    def __init__(self, log, what):
        self.log, self.what = log, what

    def Cancel(self):
        self.log.append(("cancel", self.what))


class _Comm:
    def __init__(self, name, log):
        self.name, self.log = name, log

    def Send(self, buf, dest, tag):
        self.log.append((self.name, "Send", dest, tag))

    def Isend(self, buf, dest, tag):
        self.log.append((self.name, "Isend", dest, tag))

    def Recv(self, buf, source, tag, status=None):
        self.log.append((self.name, "Recv", source, tag))

    def Irecv(self, buf, source, tag):
        self.log.append((self.name, "Irecv", source, tag))
        return _Request(self.log, (self.name, source))

    def Iprobe(self, source, tag, status=None):
        self.log.append((self.name, "Iprobe", source, tag))
        return False

    def Get_size(self):
        return 4


class _Status:
    def __init__(self):
        self.source = None

    def Set_source(self, source):
        self.source = source


def test_a_linked_rank_is_reached_through_its_link_and_the_others_as_before():
    log = []
    routes = Routes(_Comm("world", log), ANY)
    routes.link(2, _Comm("child", log))
    routes.Send(np.zeros(1), dest=2, tag=13)
    routes.Isend(np.zeros(1), dest=1, tag=13)
    routes.Recv(np.zeros(1), source=2, tag=12)
    routes.Iprobe(source=ANY, tag=18)
    assert log == [("child", "Send", 0, 13), ("world", "Isend", 1, 13),
                   ("child", "Recv", 0, 12), ("world", "Iprobe", ANY, 18)]
    assert routes.Get_size() == 4  # anything else is the base communicator's


def test_a_server_listens_on_every_channel_and_learns_the_senders_job_rank():
    log = []
    routes = Routes(_Comm("world", log), ANY)
    header = np.zeros(3, dtype=np.int64)
    assert len(routes.post_requests(header, tag=11)) == 1  # no link: one receive, as before
    routes.link(2, _Comm("child", log))
    requests = routes.post_requests(header, tag=11)
    assert len(requests) == 2 and log.count(("world", "Irecv", ANY, 11)) == 1  # still posted
    routes.posted[2][1][:] = [2, 7, 9]  # the newcomer's header arrived
    status = _Status()
    routes.take(1, header, status)
    assert header.tolist() == [2, 7, 9] and status.source == 2
    assert len(routes.post_requests(header, tag=11)) == 2  # its receive is posted again
    routes.link(2, _Comm("second", log))  # a replacement of the replacement
    assert ("cancel", ("child", 0)) in log
    routes.cancel()
    assert not routes.posted


# --- the server's books ------------------------------------------------------------------------
def _server(num_workers=3, dispatcher=None):
    log = []
    silence = SilenceWatch(0, num_workers, timeout_s=3)
    silence.start()
    return SimpleNamespace(
        MPI=None, engine=fake_engine(num_workers), silence=silence, num_workers=num_workers,
        comm=Routes(_Comm("world", log), ANY), dispatcher=dispatcher,
        topology=SimpleNamespace(server_ranks=lambda: [num_workers]),
        pauses=SimpleNamespace(held={}, paused_by=None),
        shard=SimpleNamespace(shared_grads={w: None for w in range(num_workers)}),
        load=SimpleNamespace(pushes_reported=[0] * num_workers,
                             last_push_of=[1.0] * num_workers,
                             intervals=[deque([0.1]) for _ in range(num_workers)]),
        log=log)


class _Spawned(Replacements):
    """Replacements whose spawn returns a fake link instead of starting a process."""

    welcomes: list = []

    @staticmethod
    def _spawn(MPI, welcome, result):
        word = welcome()
        _Spawned.welcomes.append(word)
        result.update(child=_Comm("child", []), pid=4242, host="node-7", clock=word["clock"])

    def wait_for_spawn(self):
        self.pending[3].join(10)


class _Failing(_Spawned):
    @staticmethod
    def _spawn(MPI, welcome, result):
        result["error"] = "RuntimeError: no slots"


def test_a_replacement_takes_the_lost_workers_place_in_the_books(capsys):
    dispatcher = BatchDispatcher(SlotPlan(steps_per_epoch=4, num_parts=3, epochs=2))
    server = _server(dispatcher=dispatcher)
    server.engine.clocks.push(2, 7)
    server.engine.clocks.finished.add(1)  # worker 1's batches are used up, nobody else's
    replacements = _Spawned(max_restarts=1)
    m = Membership(0, recovery=True, replacements=replacements)
    now = time.perf_counter()
    server.silence.last_heard = [now, now, now - 10]
    assert m.check(server, now) == 0  # dropped, and a replacement is on its way: still counted
    assert m.report()["workers_lost"][0]["worker"] == 2 and m.starting
    assert server.engine.clocks.is_done(2) and 2 in m.gone  # no round waits for it meanwhile
    replacements.wait_for_spawn()
    assert m.check(server, time.perf_counter()) == 0 and not m.starting and 2 not in m.gone
    assert _Spawned.welcomes[-1] == {"worker": 2, "world_size": 4, "clock": 7, "job_step": 0}
    assert server.engine.clocks.clocks[2] == 7 and not server.engine.clocks.is_done(2)  # its clock goes on
    assert 2 not in server.engine.clocks.finished and 2 not in server.shard.shared_grads
    assert server.load.last_push_of[2] is None and not server.load.intervals[2]
    server.comm.Send(np.zeros(1), dest=2, tag=14)
    assert server.comm.links[2].log == [("child", "Send", 0, 14)]
    err = capsys.readouterr().err
    assert "worker 2 replaced by a new process (pid 4242) on host node-7" in err
    server.load.pushes_reported[2] = 19  # its DONE: the lost worker's 7 and its own 12
    report = m.report(server.load)
    assert report["workers_replaced"][0]["pushes"] == 12
    assert report["workers_replaced"][0]["pushes_before"] == 7
    assert report["workers_replaced"][0]["host"] == "node-7"
    assert m.report(server.load) == report  # counted once
    server.silence.last_heard[2] = time.perf_counter() - 10  # the replacement is lost too
    server.silence._checked = 0.0  # the watch looks once a second
    assert m.check(server, time.perf_counter()) == 1  # dropped; no restart is left
    assert server.engine.clocks.is_done(2)
    assert "not replaced: --max-restarts 1 used up" in capsys.readouterr().err


def test_no_replacement_once_every_batch_is_trained(capsys):
    dispatcher = BatchDispatcher(SlotPlan(steps_per_epoch=1, num_parts=1, epochs=1))
    dispatcher.complete(dispatcher.take(0))
    server = _server(dispatcher=dispatcher)
    m = Membership(0, recovery=True, replacements=_Spawned(max_restarts=1))
    assert m.drop(server, 1, time.perf_counter()) == 1 and m.check(server, 0.0) == 1
    assert "every batch of the job's plan is trained" in capsys.readouterr().err
    assert "workers_replaced" not in m.report(server.load)


def test_a_failed_spawn_leaves_the_worker_lost_and_the_job_going(capsys):
    server = _server(dispatcher=BatchDispatcher(SlotPlan(steps_per_epoch=4, num_parts=3,
                                                         epochs=2)))
    replacements = _Failing(max_restarts=1)
    m = Membership(0, recovery=True, replacements=replacements)
    assert m.drop(server, 1, time.perf_counter()) == 1 and m.starting
    replacements.wait_for_spawn()
    assert m.check(server, time.perf_counter()) == 1  # counted off the active workers now
    assert "spawn failed (RuntimeError: no slots)" in capsys.readouterr().err
    assert server.engine.clocks.is_done(1) and 1 in m.gone and not m.starting


def test_a_newcomer_behind_the_others_starts_at_the_slowest_clock_and_counts_its_own():
    server = _server(dispatcher=BatchDispatcher(SlotPlan(steps_per_epoch=40, num_parts=3,
                                                         epochs=2)))
    for w, clock in enumerate((30, 25, 7)):
        server.engine.clocks.push(w, clock)
    replacements = _Spawned(max_restarts=1)
    m = Membership(0, recovery=True, replacements=replacements)
    m.drop(server, 2, time.perf_counter())
    replacements.wait_for_spawn()
    m.check(server, time.perf_counter())
    assert server.engine.clocks.clocks[2] == 25
    server.load.pushes_reported[2] = 35  # its DONE: clock 35, 10 pushes of its own
    entry = m.report(server.load)["workers_replaced"][0]
    assert (entry["pushes_before"], entry["clock_at_join"], entry["pushes"]) == (7, 25, 10)
    assert server.load.pushes_reported[2] == 17  # the job's count: 7 and 10 pushes made
