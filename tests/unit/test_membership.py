"""A lost async worker (ps/membership.py): when recovery is possible, what the server drops,
and what the others are told; without it, the message says how to launch for recovery."""

import os
import re
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from fake_ps import fake_engine
from hvdtrain.exit_codes import EXIT_NO_FINALIZE
from hvdtrain.ps import membership, slot_waiters
from hvdtrain.ps.dispatch import NO_SLOT, NONE_YET, BatchDispatcher, SlotPlan
from hvdtrain.ps.membership import Membership, recovery_enabled
from hvdtrain.ps.pauses import EvalPauses
from hvdtrain.ps.protocol import Tag
from hvdtrain.ps.silence import SilenceWatch
from hvdtrain.ps.waiting import StuckError
from hvdtrain.rules.clocks import WorkerClocks


@pytest.mark.parametrize("value, expected", [("1", True), ("true", True), ("0", False),
                                             ("", False), (None, False)])
def test_recovery_is_read_from_mpiruns_mca_variable(value, expected):
    env = {} if value is None else {"OMPI_MCA_orte_enable_recovery": value}
    assert recovery_enabled(env) is expected


@pytest.mark.parametrize("value, expected", [("0", EXIT_NO_FINALIZE), ("false", EXIT_NO_FINALIZE),
                                             ("1", 0), ("", 0), (None, 0)])
def test_an_exit_without_finalize_is_non_zero_only_where_mpirun_ignores_non_zero_exits(
        value, expected):
    # Non-zero, so that a host's Open MPI daemon reports the exit to mpirun (a second exit 0
    # without MPI_Finalize on one host left mpirun waiting forever); 0 where a non-zero exit
    # would end the job.
    env = {} if value is None else {"OMPI_MCA_orte_abort_on_non_zero_status": value}
    assert membership.exit_code_without_finalize(env) == expected


class _Comm:
    def __init__(self):
        self.sent = []

    def Send(self, buffer, dest, tag):
        self.sent.append((dest, tag, np.array(buffer).tolist()))


def _server(num_workers=3, num_servers=1, dispatcher=None):
    silence = SilenceWatch(0, num_workers, timeout_s=3)
    silence.start()
    released = []
    return SimpleNamespace(
        engine=fake_engine(num_workers, released), silence=silence, comm=_Comm(),
        num_workers=num_workers,
        topology=SimpleNamespace(server_ranks=lambda: list(range(num_workers,
                                                               num_workers + num_servers))),
        pauses=SimpleNamespace(held={}, paused_by=None), dispatcher=dispatcher,
        load=SimpleNamespace(pushes_reported=[0] * num_workers), released=released)


def _silent(server, worker, seconds=10.0):
    now = time.perf_counter()
    server.silence.last_heard = [now] * server.num_workers
    server.silence.last_heard[worker] = now - seconds
    return now


def test_a_silent_worker_is_dropped_its_batches_go_back_and_everyone_is_told():
    dispatcher = BatchDispatcher(SlotPlan(steps_per_epoch=4, num_parts=3, epochs=1))
    handed = {w: dispatcher.take(w) for w in range(3)}
    server = _server(num_workers=3, num_servers=2, dispatcher=dispatcher)
    server.engine.clocks.push(2, 7)
    m = Membership(0, recovery=True)
    assert m.check(server, _silent(server, 2)) == 1
    assert server.engine.clocks.is_done(2)
    assert server.load.pushes_reported[2] == 7 and server.released
    assert dispatcher.take(0) == handed[2]  # worker 2's batch is the next one handed out
    assert m.report()["workers_lost"][0]["worker"] == 2
    assert m.report()["workers_lost"][0]["pushes"] == 7
    told = [(dest, tag) for dest, tag, _ in server.comm.sent]
    assert (4, Tag.REQUEST) in told  # the other server
    assert {(0, Tag.LOST), (1, Tag.LOST)} <= set(told) and (2, Tag.LOST) not in told
    assert m.check(server, time.perf_counter()) == 0  # once


def test_a_dropped_workers_held_replies_are_cancelled():
    server = _server()
    server.engine.pending[1], server.pauses.held[1] = True, False
    Membership(0, recovery=True).drop(server, 1, time.perf_counter())
    assert 1 not in server.engine.pending and 1 not in server.pauses.held


def test_a_worker_holding_a_reply_is_waiting_not_lost():
    server = _server()
    server.engine.pending[1] = True
    assert Membership(0, recovery=True).check(server, _silent(server, 1)) == 0


def test_losing_worker_0_drops_it_like_any_other_and_the_lowest_live_worker_leads():
    server = _server()
    m = Membership(0, recovery=True)
    assert m.lead(3) == 0
    assert m.check(server, _silent(server, 0)) == 1
    assert m.lost_workers == [0] and m.lead(3) == 1  # the servers' statistics go to worker 1
    assert {dest for dest, tag, _ in server.comm.sent if tag == Tag.LOST} == {1, 2}
    m.drop(server, 1, time.perf_counter())
    assert m.lead(3) == 2


def test_a_lead_lost_while_it_evaluates_releases_the_replies_it_held():
    server = _server()
    server.pauses = EvalPauses(server.comm, charges=True)
    server.pauses.pause(0, time.perf_counter())
    server.pauses.held[1] = True  # worker 1 pushed during the pause: its reply waits
    replies = []
    server._send_all = lambda held: replies.extend(sorted(held))
    Membership(0, recovery=True).drop(server, 0, time.perf_counter())
    assert replies == [1] and server.pauses.paused_by is None


def test_under_recovery_a_quiet_worker_counts_as_lost_only_past_timeout_s():
    """QUIET (evaluating, writing a checkpoint) exempts a worker from its pace's limit; under
    recovery only up to --timeout-s, so that a lead that died while it evaluated is found."""
    clocks = WorkerClocks(2)
    for paces, expected in ((None, None), ([[], []], 1)):  # without recovery, then with it
        silence = SilenceWatch(0, 2, timeout_s=3, paces=paces)
        now = time.perf_counter()
        silence.last_heard = [now, now - 10]
        silence.quiet.add(1)
        assert silence.overdue(now, clocks, []) == expected
        silence.last_heard[1], silence._checked = now - 2, 0.0  # within --timeout-s
        assert silence.overdue(now, clocks, []) is None


def test_without_recovery_a_silent_worker_ends_the_job_with_the_launch_line():
    server = _server()
    with pytest.raises(StuckError, match="orte_enable_recovery 1"):
        Membership(0, recovery=False).check(server, _silent(server, 1))


def test_only_server_0_drops_the_others_wait_for_its_word():
    server = _server()
    follower = Membership(1, recovery=True)
    assert follower.check(server, _silent(server, 1)) == 0
    follower.drop(server, 1, time.perf_counter())  # Kind.LOST from server 0
    assert follower.check(server, time.perf_counter()) == 1
    assert server.comm.sent == []  # a follower tells nobody


def test_a_worker_waiting_on_the_others_is_not_lost_until_it_sends_something_else():
    server = _server()
    server.engine.clocks.idle.add(1)
    server.silence.waiting_for_others.add(1)  # its IDLE (server.py)
    assert Membership(0, recovery=True).check(server, _silent(server, 1)) == 0
    # The lead waits at the end, then evaluates (QUIET) and dies there: the IDLE no longer
    # covers it, and QUIET covers it only up to --timeout-s (3 s here).
    now = time.perf_counter()
    server.silence.heard(1, pushed=False, now=now - 10)
    server.silence.quiet.add(1)
    server.silence.paces = [[], [], []]  # under recovery
    server.silence._checked = 0.0
    assert Membership(0, recovery=True).check(server, now) == 1


def test_the_launcher_is_left_alone_without_recovery_or_failure(monkeypatch):
    killed = []
    monkeypatch.setattr(membership.os, "kill", lambda *a: killed.append(a))
    monkeypatch.delenv("OMPI_MCA_orte_enable_recovery", raising=False)
    membership.fail_launcher(1)
    monkeypatch.setenv("OMPI_MCA_orte_enable_recovery", "1")
    membership.fail_launcher(0)
    assert killed == []


def test_the_launcher_is_stopped_only_once_it_has_read_the_ranks_last_lines(monkeypatch):
    # A launcher stopped with a rank's error still in the pipe drops it (a CI run ended a job
    # non-zero with no word from any rank).
    read_fd, write_fd = os.pipe()
    pipe = os.fdopen(write_fd, "w")
    monkeypatch.setattr(membership.sys, "stderr", pipe)
    monkeypatch.setattr(membership.sys, "stdout", pipe)
    monkeypatch.setenv("OMPI_MCA_orte_enable_recovery", "1")
    events = []
    monkeypatch.setattr(membership, "_launcher_name", lambda: "mpirun")
    monkeypatch.setattr(membership.os, "kill", lambda *a: events.append("killed"))
    print("hvdtrain: error: the reason", file=pipe, flush=True)
    reader = threading.Timer(0.3, lambda: events.append(os.read(read_fd, 1000)))
    reader.start()
    membership.fail_launcher(1)
    reader.join()
    assert events == [b"hvdtrain: error: the reason\n", "killed"]
    # Nobody reading: the launcher is stopped all the same, after the limit.
    print("unread", file=pipe, flush=True)
    started = time.monotonic()
    membership._let_launcher_read_output(limit_s=0.2)
    assert 0.2 <= time.monotonic() - started < 2
    pipe.close()
    os.close(read_fd)


def test_under_recovery_a_steady_worker_is_lost_after_50_of_its_slowest_recent_gaps():
    gaps = [[0.01] * 100 + [0.3], [0.01] * 5, [], [0.5] * 70]
    silence = SilenceWatch(0, 4, timeout_s=300, paces=gaps)
    assert silence.limit(0) == pytest.approx(15.0)  # 50 x its slowest recent gap, 0.3 s
    assert silence.limit(1) == 10.0  # never sooner than the floor
    assert silence.limit(2) == 300  # no pace known yet: --timeout-s
    assert SilenceWatch(0, 4, timeout_s=20, paces=gaps).limit(3) == 20  # nor later than it
    assert SilenceWatch(0, 4, timeout_s=300).limit(0) == 300  # without recovery: --timeout-s
    gaps[0].extend([0.01] * 64)  # the slow gap is no longer recent
    assert silence.limit(0) == 10.0


def test_a_dead_worker_is_found_while_the_job_stops_and_while_an_evaluation_pauses():
    # The live workers wait in the end-of-training agreement for the dead one (a --stop-at
    # target, a stop signal): skipping the check while stopping left such a job hanging.
    server = _server()
    server.engine.begin_stop()  # the job stops (its port tells the workers)
    assert Membership(0, recovery=True).check(server, _silent(server, 2)) == 1
    # Worker 0 evaluates (QUIET) and worker 1 is held: silent by design; worker 2 never
    # arrived.
    server = _server()
    server.pauses = SimpleNamespace(held={1: True}, paused_by=0)
    now = _silent(server, 2)
    server.silence.quiet.add(0)
    server.silence.last_heard[0] = server.silence.last_heard[1] = now - 10
    m = Membership(0, recovery=True)
    assert m.check(server, now) == 1 and m.lost_workers == [2]


def test_the_workers_an_evaluation_held_count_their_silence_from_its_end():
    silence = SilenceWatch(0, 3, timeout_s=3)
    silence.last_heard = [0.0, 0.0, 0.0]
    assert silence.resumed({1: True}, now=50.0) == {1: True}
    assert silence.last_heard == [0.0, 50.0, 0.0]


def _slots_sent(server, worker):
    return [words for dest, tag, words in server.comm.sent if dest == worker and tag == Tag.SLOT]


def test_a_held_slot_request_gets_the_lost_workers_batch_when_it_is_dropped():
    """Under recovery (ps/slot_waiters.py): a worker whose queue is empty when the plan is used
    up waits, idle and quiet, for a silent worker's slot; the push path never waits."""
    dispatcher = BatchDispatcher(SlotPlan(steps_per_epoch=1, num_parts=3, epochs=1), True)
    server = _server(dispatcher=dispatcher)
    handed = {w: dispatcher.take(w) for w in range(3)}
    dispatcher.complete(handed[0], 0)
    slot_waiters.hand_out(server, 0)  # its push's next slot: nothing now, not held
    assert _slots_sent(server, 0) == [[NONE_YET]] and not dispatcher.waiting
    slot_waiters.ask(server, 0, 2, epoch=0)  # its queue is empty: held, workers 1 and 2 hold slots
    assert _slots_sent(server, 0) == [[NONE_YET]] and dispatcher.waiting == {0: 2}
    assert 0 in server.silence.quiet and 0 in server.engine.clocks.idle and server.released
    dispatcher.complete(handed[1], 1)
    slot_waiters.hand_out(server, 1)
    slot_waiters.ask(server, 1, 1, epoch=0)
    assert dispatcher.waiting == {0: 2, 1: 1}  # both wait for worker 2's slot
    Membership(0, recovery=True).drop(server, 2, time.perf_counter())
    assert _slots_sent(server, 0)[-1] == [handed[2], NO_SLOT]  # the first waiter gets it
    assert 0 not in server.engine.clocks.idle and 0 not in server.silence.quiet
    assert dispatcher.waiting == {1: 1}  # worker 0 may die before its push: 1 waits on
    dispatcher.complete(handed[2], 0)
    slot_waiters.hand_out(server, 0)
    assert _slots_sent(server, 1)[-1] == [NO_SLOT] and not dispatcher.waiting
    assert dispatcher.statistics()["batches_untrained"] == 0
    assert {0, 1} <= server.engine.clocks.finished


def test_the_stop_answers_the_held_slot_requests():
    dispatcher = BatchDispatcher(SlotPlan(steps_per_epoch=1, num_parts=2, epochs=1), True)
    server = _server(num_workers=2, dispatcher=dispatcher)
    dispatcher.take(0)
    dispatcher.complete(dispatcher.take(1), 1)
    slot_waiters.ask(server, 1, 1, epoch=0)
    assert _slots_sent(server, 1) == []
    slot_waiters.stop(server)
    assert _slots_sent(server, 1) == [[NO_SLOT]]


class _Request:
    def __init__(self, done):
        self.done = done

    def Test(self):
        return self.done


class _BroadcastComm:
    """A communicator whose Ibcast completes (or never does, a dead lead), copying
    ``source``'s bytes into the receiver's buffer as the root's would arrive."""

    def __init__(self, rank, completes, source=None):
        self.rank, self.completes, self.source, self.sent = rank, completes, source, None

    def Get_rank(self):
        return self.rank

    def Ibcast(self, buffer, root):
        if self.source is not None:
            buffer[:] = self.source
        self.sent = buffer.copy()
        return _Request(self.completes)


def test_the_leads_object_reaches_the_others_and_a_dead_lead_hands_the_broadcast_on():
    from hvdtrain.ps.survivors import broadcast_surviving

    record = {"metric": "test_acc", "value": 0.93, "evaluations_since": 2}
    lead = _BroadcastComm(0, True)
    assert broadcast_surviving(record, lambda: lead, lambda: False, 5, str) == record
    follower = _BroadcastComm(1, True, source=lead.sent)
    assert broadcast_surviving({"mine": 1}, lambda: follower, lambda: False, 5, str) == record
    # The lead dies before its broadcast: worker 1 regroups, leads the survivors' communicator
    # (rank 0 there) and its own record is the answer, instead of a wait that never ends.
    comms = [_BroadcastComm(1, False)]

    def regroup():
        if len(comms) == 1:
            comms.append(_BroadcastComm(0, True))
            return True
        return False

    mine = {"metric": "test_acc", "value": 0.91}
    assert broadcast_surviving(mine, lambda: comms[-1], regroup, 5, str) == mine


# --- issue 41: a worker lost while frozen wakes after the job ended ---------------------------------
class _Pending:
    """An MPI request that never completes: a reply from a server that serves no more."""

    def Test(self):
        return False


class _WorkerMPI:
    UNDEFINED = -32766

    class Request:
        @staticmethod
        def Testany(requests, status=None):
            return _WorkerMPI.UNDEFINED, False


class _WorkerComm:
    """A worker's view of the messages server 0 (rank 3) left for it."""

    def __init__(self, rank, messages):
        self.rank, self.messages = rank, messages  # {tag: [words]}

    def Get_rank(self):
        return self.rank

    def Iprobe(self, source, tag):
        return source == 3 and bool(self.messages.get(tag))

    def Recv(self, buffer, source, tag):
        buffer[:] = self.messages[tag].pop(0)


def test_server_0_tells_a_lost_workers_own_process_that_the_job_ended():
    # Worker 1, frozen (SIGSTOP) past its silence limit, was dropped; the others finished. It
    # used to wake, wait 2 x --timeout-s for a reply and abort the finished job (rc 1).
    server = _server(num_workers=3)
    server.engine.clocks.push(1, 38)
    m = Membership(0, recovery=True)
    m.drop(server, 1, _silent(server, 1))
    sent = []
    # With --max-restarts the communicator routes rank 1 to its replacement: the word goes to
    # the base communicator, which reaches the frozen process itself.
    server.comm = SimpleNamespace(base=SimpleNamespace(
        Isend=lambda buffer, dest, tag: sent.append((dest, tag, np.array(buffer).tolist()))))
    server.MPI = SimpleNamespace(Request=SimpleNamespace(Testall=lambda requests: True))
    m.job_ended(server)
    assert sent == [(1, Tag.ENDED, [1, 38])]
    sent.clear()
    Membership(1, recovery=True).job_ended(server)  # the other servers say nothing
    Membership(0, recovery=True).job_ended(server)  # nor does a job that lost nobody
    assert sent == []


def test_a_lost_worker_told_that_the_job_ended_leaves_its_wait_at_once(monkeypatch):
    from hvdtrain.ps.membership import WorkerLost
    from hvdtrain.ps.survivors import Survivors
    from hvdtrain.ps.waiting import wait_any

    monkeypatch.setenv("OMPI_MCA_orte_enable_recovery", "1")
    comm = _WorkerComm(1, {Tag.ENDED: [np.array([1, 38])]})
    survivors = Survivors(_WorkerMPI, comm, worker_comm=None, leader=3)
    started = time.monotonic()
    with pytest.raises(WorkerLost, match="the job has ended without it"):
        wait_any(_WorkerMPI, [_Pending()], 60.0, lambda: "no reply", check=survivors.check_ended)
    assert time.monotonic() - started < 5  # not the 60 s of the reply's timeout
    comm.messages[Tag.ENDED] = [np.array([1, 38])]
    with pytest.raises(WorkerLost):  # nor in the survivors' own waits (wait_surviving)
        survivors.poll()
    assert survivors.poll() is False  # no word: nothing to leave for


def test_when_every_worker_is_lost_the_job_ends_at_once_naming_them_lost(monkeypatch, capsys):
    # It used to wait --timeout-s more, then list the lost workers as "done".
    server = _server(num_workers=2)
    server.engine.clocks.push(0, 5)
    m = Membership(0, recovery=True)
    m.drop(server, 0, _silent(server, 0))
    assert "training goes on with the other workers" in capsys.readouterr().err
    with pytest.raises(StuckError, match=r"every worker was lost \(worker 0 after 5 pushes, "
                                         r"worker 1 after 0 pushes\): no worker is left"):
        m.drop(server, 1, _silent(server, 1))
    assert "it was the last" in capsys.readouterr().err


def test_a_servers_wait_names_lost_workers_lost_not_done(monkeypatch):
    from fake_ps import Job

    job = Job(monkeypatch, workers=3, backup=0, bsp=False)
    server = job.servers[0]
    server.membership.recovery = True
    server.membership.drop(server, 1, time.perf_counter())
    server.engine.clocks.done(2)  # finished its epochs
    assert "worker 0: 0, worker 1: lost, worker 2: done" in server._describe_wait()


@pytest.mark.parametrize("recovery, said", [
    (False, "waited 30 s, --timeout-s"),
    (True, "waited 65 s, 2 x --timeout-s + 5 s: under mpirun's recovery a lost worker takes "
           "--timeout-s to tell")])
def test_a_survivors_wait_says_how_long_it_waited_and_why(monkeypatch, recovery, said):
    """Under recovery it said "waited 60 s, --timeout-s" of a --timeout-s 30."""
    from hvdtrain.ps import survivors as module
    if recovery:
        monkeypatch.setenv("OMPI_MCA_orte_enable_recovery", "1")
    else:
        monkeypatch.delenv("OMPI_MCA_orte_enable_recovery", raising=False)
    clock = iter(range(0, 10_000, 10))
    monkeypatch.setattr(module.time, "monotonic", lambda: next(clock))
    never = SimpleNamespace(Test=lambda: False)
    with pytest.raises(StuckError, match=re.escape(f"no reply from server 0 ({said}); a process "
                                                   "has stopped or hangs")):
        module.wait_surviving(lambda: never, lambda: False, 30.0, lambda: "no reply from server 0")
