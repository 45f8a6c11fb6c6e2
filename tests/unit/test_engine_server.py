"""engines/server_engine.py ServerEngine in-process, on a recording port and a plain SGD shard: what a
push, an idle worker, a finished one and a stop do under each round policy. The real server
(ps/server.py) and the simulator (compare/sim/server_run.py) both run this very class, so these
tests stand for both (they replace the parity tests that kept two copies of it in step)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hvdtrain.engines.server_engine import ServerEngine
from hvdtrain.rules.clocks import IDLE_TO_EVERY_SERVER, IDLE_TO_LEADER
from hvdtrain.rules.registry import Mode, server_rules

LR = 0.5


class SGD:
    """The ShardOptimizer's interface, plain SGD, over chunks of 2 elements."""

    def __init__(self, values):
        self.params = torch.tensor(values, dtype=torch.float32)
        n = self.params.numel()
        self.chunks = [(a, min(a + 2, n)) for a in range(0, n, 2)]

    def apply(self, chunk: int, grad: torch.Tensor, lr: float) -> None:
        a, b = self.chunks[chunk]
        self.params[a:b] -= lr * grad


class Port:
    """Records what the engine asks of its backend, in order; gradients come from ``grads``."""

    def __init__(self, stream: bool = True):
        self.grads: dict[int, np.ndarray] = {}
        self.log: list[tuple] = []
        self.stream = stream
        self.engine: ServerEngine | None = None

    def load(self, worker):
        self.log.append(("load", worker))

    def gradient_chunk(self, worker, a, b):
        return self.grads[worker][a:b]

    def discard(self, worker):
        self.log.append(("discard", worker))

    def reply(self, worker, want_params):
        self.log.append(("reply", worker))
        if want_params:
            self.engine.sent_params(worker)

    def start_stream(self, worker):
        return self.stream

    def chunk_applied(self, worker, chunk):
        self.log.append(("chunk", worker, chunk))
        return chunk

    def streamed(self, worker, handles):
        assert handles == list(range(len(self.engine.optimizer.chunks)))
        self.log.append(("reply", worker))
        self.engine.sent_params(worker)

    def begin_stop(self):
        self.log.append(("stop",))

    def round_closed(self, workers, stop, version):
        self.log.append(("round", list(workers), stop, version))

    def dropped(self, worker, stop, version):
        self.log.append(("dropped", worker, stop, version))

    def replies(self) -> list[int]:
        got = [e[1] for e in self.log if e[0] == "reply"]
        self.log.clear()
        return got


def engine_for(mode: Mode, workers: int, values=(1.0, 2.0, 3.0), stream=True, follows=False):
    port = Port(stream)
    engine = ServerEngine(server_rules(mode, workers), workers, SGD(list(values)), port,
                          follows=follows)
    port.engine = engine
    return engine, port


def push(engine, port, worker, clock, grad=None, want_params=True, wants_stop=False):
    if grad is not None:
        port.grads[worker] = np.asarray(grad, dtype=np.float32)
    engine.on_push(worker, clock, LR, grad is not None, want_params, wants_stop)


def params(engine) -> list[float]:
    return engine.optimizer.params.tolist()


ASYNC, SSP1 = Mode("async"), Mode("ssp1", staleness=1.0)
BSP, BACKUP1 = Mode("bsp", staleness=0.0, bsp=True), Mode("b1", bsp=True, backup_workers=1)


def test_async_applies_on_arrival_and_streams_each_updated_chunk_back():
    engine, port = engine_for(ASYNC, 2)
    push(engine, port, 0, 1, [2.0, 2.0, 2.0])
    assert params(engine) == [0.0, 1.0, 2.0] and engine.version == 1
    assert port.log == [("load", 0), ("chunk", 0, 0), ("chunk", 0, 1), ("reply", 0)]
    port.log.clear()
    push(engine, port, 1, 1, [0.0, 0.0, 2.0])  # computed on version 0: one update old
    assert params(engine) == [0.0, 1.0, 1.0] and port.replies() == [1]
    assert engine.report(False)["staleness_histogram"] == {0: 1, 1: 1}


def test_a_reply_that_cannot_stream_goes_whole_after_the_update():
    engine, port = engine_for(ASYNC, 2, stream=False)  # the real server: a pause holds it
    push(engine, port, 0, 1, [2.0, 2.0, 2.0])
    assert port.log == [("load", 0), ("reply", 0)] and engine.versions.pulled[0] == 1
    push(engine, port, 1, 1)  # no gradient (a skipped fp16 step): a reply, no update
    assert engine.version == 1 and port.replies() == [0, 1]
    assert engine.report(False)["pushes_without_gradient"] == 1


def test_ssp_holds_a_worker_too_far_ahead_until_the_slowest_catches_up():
    engine, port = engine_for(SSP1, 2)
    push(engine, port, 0, 1, [1.0, 1.0, 1.0])
    push(engine, port, 0, 2, [1.0, 1.0, 1.0])  # 2 ahead of worker 1 (bound 1): held
    assert port.replies() == [0] and engine.version == 2  # applied all the same
    assert 0 in engine.held()[0]
    push(engine, port, 1, 1, [1.0, 1.0, 1.0])  # the slowest catches up: both go on
    assert port.replies() == [1, 0] and not engine.pending


def test_ssp_releases_a_held_worker_when_the_slowest_is_done_or_idle():
    engine, port = engine_for(SSP1, 3)
    push(engine, port, 0, 1, [1.0, 1.0, 1.0])
    push(engine, port, 0, 2, [1.0, 1.0, 1.0])
    port.replies()
    engine.on_done(1)
    assert port.replies() == []  # worker 2 is still at clock 0
    engine.on_idle(2)  # it waits for the others: nobody waits for its clock
    assert port.replies() == [0]


def test_bsp_closes_a_round_once_every_running_worker_joined():
    engine, port = engine_for(BSP, 2)
    push(engine, port, 1, 1, [2.0, 2.0, 2.0])
    assert port.log == [("load", 1)] and engine.version == 0  # summed, not applied
    push(engine, port, 0, 1, [4.0, 0.0, 2.0])
    assert params(engine) == [-0.5, 1.5, 2.0] and engine.version == 1  # the mean, once
    assert port.log[2:] == [("round", [1, 0], False, 0), ("reply", 0), ("reply", 1)]
    assert engine.report(False)["gradients_per_round"] == {2: 1}


def test_a_finished_worker_does_not_hold_the_round_open():
    engine, port = engine_for(BSP, 2)
    push(engine, port, 0, 1, [2.0, 2.0, 2.0])
    engine.on_done(1)  # it took its last step: the round closes with worker 0 alone
    assert params(engine) == [0.0, 1.0, 2.0] and port.replies() == [0]


def test_backup_workers_drop_a_late_gradient_and_send_the_new_parameters_at_once():
    engine, port = engine_for(BACKUP1, 3)
    push(engine, port, 0, 1, [2.0, 2.0, 2.0])
    push(engine, port, 1, 1, [2.0, 2.0, 2.0])  # N-b = 2: the round closes
    assert port.replies() == [0, 1] and params(engine) == [0.0, 1.0, 2.0]
    push(engine, port, 2, 1, [9.0, 9.0, 9.0])  # computed on version 0: late
    assert port.log == [("dropped", 2, False, 1), ("discard", 2), ("reply", 2)]
    assert params(engine) == [0.0, 1.0, 2.0] and engine.versions.pulled[2] == 1
    stats = engine.report(False)
    assert stats["dropped_gradients"] == 1 and stats["staleness_histogram"] == {0: 2}
    assert not engine.is_late(2)  # its next push belongs to the round under way


def test_backup_workers_close_a_round_without_an_idle_worker():
    engine, port = engine_for(BACKUP1, 3)
    engine.on_idle(2)
    engine.on_idle(1)
    push(engine, port, 0, 1, [2.0, 2.0, 2.0])  # the only one pushing: a round of one
    assert port.replies() == [0] and engine.version == 1
    engine.on_active(1)
    push(engine, port, 0, 2, [2.0, 2.0, 2.0])
    assert port.replies() == [] and engine.version == 1  # worker 1 counts again


def test_async_stops_at_once_and_every_held_reply_goes():
    engine, port = engine_for(SSP1, 3)
    push(engine, port, 0, 1, [1.0, 1.0, 1.0])
    push(engine, port, 0, 2, [1.0, 1.0, 1.0])  # held
    port.log.clear()
    push(engine, port, 1, 1, [1.0, 1.0, 1.0], wants_stop=True)
    assert port.log[0] == ("stop",) and engine.stopping
    assert port.replies() == [1, 0]  # nobody waits for a worker that may have stopped
    engine.on_signal()
    assert port.log == []  # the stop went out once


def test_a_round_carries_a_stop_to_every_worker_at_its_end():
    engine, port = engine_for(BSP, 2)
    push(engine, port, 0, 1, [1.0, 1.0, 1.0], wants_stop=True)
    assert not engine.stopping
    push(engine, port, 1, 1, [1.0, 1.0, 1.0])
    assert port.log[-4:] == [("round", [0, 1], True, 0), ("stop",), ("reply", 0), ("reply", 1)]
    engine, port = engine_for(BSP, 2)
    engine.on_signal()  # a signal: at the end of the round under way
    push(engine, port, 0, 1, [1.0, 1.0, 1.0])
    assert not engine.stopping
    push(engine, port, 1, 1, [1.0, 1.0, 1.0])
    assert engine.stopping and ("stop",) in port.log


def test_a_follower_carries_out_the_leaders_verdicts_in_order():
    engine, port = engine_for(BACKUP1, 3, follows=True)
    push(engine, port, 2, 1, [9.0, 9.0, 9.0])
    push(engine, port, 0, 1, [2.0, 2.0, 2.0])
    assert port.replies() == [] and engine.held()[1].keys() == {0, 2}
    engine.on_verdict(True, [1, 0], False)  # worker 1's push has not arrived here yet
    engine.on_verdict(False, [2], False)    # ... and this one waits for that round
    assert port.replies() == [] and "2 of server 0's round decisions" in engine.describe(())
    push(engine, port, 1, 1, [2.0, 2.0, 2.0])
    assert port.replies() == [0, 1, 2] and params(engine) == [0.0, 1.0, 2.0]
    assert engine.report(False)["dropped_gradients"] == 1 and not engine.awaiting


def test_a_lost_worker_is_done_and_gets_no_reply():
    engine, port = engine_for(BSP, 3)
    push(engine, port, 0, 1, [1.0, 1.0, 1.0])
    push(engine, port, 1, 1, [1.0, 1.0, 1.0])
    engine.on_lost(1)  # its push is in the round; no reply goes to it
    engine.release()
    assert port.replies() == [0] and engine.is_done(1)
    engine.rejoin(1, 7)  # a newcomer in its place
    assert engine.clock(1) == 7 and not engine.is_done(1)


def test_checkpoint_state_and_statistics():
    engine, port = engine_for(Mode("slr", staleness_lr=True), 2)
    engine.start(5)  # resumed at version 5
    push(engine, port, 0, 1, [1.0, 1.0, 1.0])
    push(engine, port, 0, 2, [1.0, 1.0, 1.0])
    push(engine, port, 1, 1, [1.0, 1.0, 1.0])  # two updates old: half the rate
    assert params(engine) == pytest.approx([-0.25, 0.75, 1.75])
    engine.on_done(0)
    assert engine.state() == {"clocks": [-1, 1], "version": 8, "staleness": {0: 2, 2: 1}}
    assert engine.report(True)["mean_lr_factor"] == pytest.approx(2.5 / 3, abs=1e-6)


def test_the_simulator_and_the_real_server_run_this_engine():
    from hvdtrain.compare.sim import server_run
    from hvdtrain.ps import server

    assert server.ServerEngine is ServerEngine and server_run.ServerEngine is ServerEngine


@pytest.mark.parametrize("mode, eval_pauses, recovery, tell", [
    (ASYNC, False, False, None), (ASYNC, False, True, IDLE_TO_LEADER),
    (ASYNC, True, False, IDLE_TO_EVERY_SERVER), (SSP1, False, False, IDLE_TO_EVERY_SERVER),
    (BSP, False, False, None), (BSP, False, True, IDLE_TO_LEADER),
    (BSP, True, True, IDLE_TO_EVERY_SERVER), (BACKUP1, False, False, IDLE_TO_LEADER),
    (BACKUP1, True, False, IDLE_TO_EVERY_SERVER)])
def test_whom_a_worker_waiting_for_the_others_tells(mode, eval_pauses, recovery, tell):
    """The client's IDLE: as ps/client.py decided it before the policies did."""
    assert server_rules(mode, 3).policy.idle_reports(eval_pauses, recovery) == tell
