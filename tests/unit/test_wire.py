"""--wire-dtype: the parameter server's wire (ps/wire.py) on a loopback communicator in one
process, the rounds of local SGD and DiLoCo (engines/local_rounds.py) on the fake collective,
and the combinations the config refuses."""

from collections import defaultdict, deque

import numpy as np
import pytest
import torch

from hvdtrain.cli import build_parser, config_from_args
from hvdtrain.config import ConfigError
from hvdtrain.engines.local_rounds import LocalRounds, rule_for_wire
from hvdtrain.ps.protocol import Kind, Tag, chunk_bounds
from hvdtrain.ps.wire import ShardWire, WorkerWire
from hvdtrain.rules.local_sgd import RoundRule

from fake_collective import run_workers

TOTAL, CHUNK = 1000, 128  # 8 chunks, the last one short
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class LoopComm:
    """A worker and a server in one process. A message is a copy of its buffer; a receive
    takes the oldest message of its tag as soon as one is there (when posted, or at its Wait).
    ``nbytes``: what went on the wire."""

    def __init__(self):
        self.queues: dict[int, deque] = defaultdict(deque)
        self.nbytes = 0

    def Isend(self, buf, dest, tag):
        self.queues[tag].append(np.array(buf, copy=True))
        self.nbytes += buf.nbytes
        return Landed()

    def Irecv(self, buf, source, tag):
        return Receive(self.queues[tag], buf)

    def Recv(self, buf, source, tag):
        Receive(self.queues[tag], buf).Wait()


class Landed:
    def Wait(self):
        pass


class Receive:
    def __init__(self, queue: deque, buf: np.ndarray):
        self.queue, self.buf, self.done = queue, buf, False
        self.take()

    def take(self):
        if not self.done and self.queue:
            message = self.queue.popleft()
            assert message.dtype == self.buf.dtype and message.shape == self.buf.shape
            self.buf[:] = message
            self.done = True

    def Wait(self):
        self.take()
        assert self.done, "a receive with no message"


def round_trip(name: str, reply_to: Kind = Kind.PUSH):
    """A push of a gradient, chunk by chunk, and the reply's parameters: (the gradient the
    server applied, the parameters the worker received, the server's wire, the comm)."""
    comm, chunks = LoopComm(), chunk_bounds(TOTAL, CHUNK)
    torch.manual_seed(0)
    grads, server_params = torch.randn(TOTAL), torch.randn(TOTAL)
    worker, server = WorkerWire(name, TOTAL), ShardWire(comm, name, server_params, chunks)
    for a, b in chunks:
        comm.Isend(worker.gradient(grads, a, b), dest=1, tag=Tag.GRAD)
    applied = np.concatenate([server.gradient(0, a, b).copy() for a, b in chunks])
    server.request(0, reply_to)
    worker.reply_kind(reply_to)
    params = torch.zeros(TOTAL)
    receives = [(a, b, comm.Irecv(worker.params_target(params, a, b), 0, Tag.PARAMS))
                for a, b in chunks]
    for k in range(len(chunks)):
        server.send(0, k)
    for a, b, receive in receives:
        receive.Wait()
        worker.params_arrived(params, a, b)
    return torch.from_numpy(applied), params, server_params, server, comm


@pytest.mark.parametrize("name", ["fp32", "bf16", "fp16"])
def test_the_wire_rounds_gradients_and_parameters_and_the_master_copy_stays_float32(name):
    applied, params, master, server, _ = round_trip(name)
    torch.manual_seed(0)
    grads = torch.randn(TOTAL)
    dtype = DTYPES[name]
    assert applied.dtype == torch.float32 and master.dtype == torch.float32
    assert torch.equal(applied, grads.to(dtype).float())  # rounded once, widened exactly
    assert torch.equal(params, master.to(dtype).float())
    if name != "fp32":
        assert not torch.equal(params, master)  # the reply was rounded, the master was not


@pytest.mark.parametrize("name", ["bf16", "fp16"])
def test_a_16_bit_wire_halves_the_bytes_of_a_push_and_its_reply(name):
    *_, wide, wide_comm = round_trip("fp32")
    *_, narrow, narrow_comm = round_trip(name)
    assert wide.report() == {"wire_dtype": "fp32", "wire_bytes_pushed": 4 * TOTAL,
                             "wire_bytes_pulled": 4 * TOTAL, "pushes_staged": 0}
    assert narrow.report() == {"wire_dtype": name, "wire_bytes_pushed": 2 * TOTAL,
                               "wire_bytes_pulled": 2 * TOTAL, "pushes_staged": 0}
    assert narrow_comm.nbytes * 2 == wide_comm.nbytes == 8 * TOTAL  # what the buffers carried


@pytest.mark.parametrize("kind", [Kind.PULL, Kind.SAVE])
def test_a_pull_or_a_checkpoint_brings_the_master_copy_exactly(kind):
    _, params, master, server, _ = round_trip("bf16", reply_to=kind)
    assert torch.equal(params, master)
    assert server.report()["wire_bytes_pulled"] == 4 * TOTAL


@pytest.mark.parametrize("name, replies, exact", [
    ("bf16", [Kind.PULL, Kind.PUSH], False), ("bf16", [Kind.PUSH, Kind.PULL], True),
    ("fp16", [Kind.PUSH, Kind.SAVE], True), ("fp32", [Kind.PULL, Kind.PUSH], True)])
def test_the_worker_knows_whether_its_last_reply_was_rounded(name, replies, exact):
    """What a checkpoint's request reads (ParameterServerClient.state_dict): where the lead's
    last reply was a rounded push's it asks for the float32 parameters, else its replica holds
    them already (an evaluation's pull, or a float32 wire)."""
    wire = WorkerWire(name, TOTAL)
    for kind in replies:
        wire.reply_kind(kind)
    assert wire.exact == exact


# --- local SGD and DiLoCo rounds --------------------------------------------------------------
def rounds_on(workers: int, outer_lr: float, wire):
    """One round of ``workers`` workers whose parameters moved apart from a shared start; each
    worker's parameters after the round."""
    start = torch.linspace(-1, 1, 64) + 1.0  # weights whose small updates a rounded weight loses

    def work(port):
        params = start.clone()
        rule = rule_for_wire([params], outer_lr, 0.0, wire)
        rounds = LocalRounds(port, rule, 1, parameters=lambda: [("w", params)], wire=wire)
        params.add_(1e-3 * (port.rank + 1) * torch.cos(torch.arange(64.0)))  # its local steps
        rounds.stepped()
        return params

    return start, run_workers(workers, work)


def test_plain_local_sgd_over_a_rounded_wire_averages_the_moves_not_the_weights():
    start, [a, b] = rounds_on(2, 0.0, torch.bfloat16)
    _, [exact, _] = rounds_on(2, 0.0, None)
    assert torch.equal(a, b)
    moves = [1e-3 * (r + 1) * torch.cos(torch.arange(64.0)) for r in range(2)]
    rounded = torch.stack([m.to(torch.bfloat16) for m in moves]).mean(0).to(torch.bfloat16)
    assert torch.allclose(a, start - (-rounded.float()) * 1.0, atol=1e-7)
    # The moves survive: rounding the weights themselves would be off by up to 2**-8 of 2.
    assert (a - exact).abs().max() < 1e-5 < (exact.to(torch.bfloat16).float() - exact).abs().max()


def test_diloco_over_a_rounded_wire_averages_rounded_pseudo_gradients():
    start, [a, _] = rounds_on(2, 0.7, torch.float16)
    moves = [1e-3 * (r + 1) * torch.cos(torch.arange(64.0)) for r in range(2)]
    deltas = torch.stack([(-m).to(torch.float16) for m in moves]).mean(0).to(torch.float16)
    assert torch.allclose(a, start - 0.7 * deltas.float(), atol=1e-7)


def test_a_rounded_wire_refuses_the_rule_that_sends_the_weights():
    with pytest.raises(ValueError, match="rule_for_wire"):
        LocalRounds(None, RoundRule(), 4, parameters=lambda: [], wire=torch.bfloat16)


# --- the flag -----------------------------------------------------------------------------------
def parse(*argv):
    return config_from_args(build_parser().parse_args(["train", "--no-progress", *argv]))


@pytest.mark.parametrize("argv", [
    ("--mode", "async", "--wire-dtype", "bf16"),
    ("--wire-dtype", "fp16", "--local-steps", "4"),
    ("--wire-dtype", "bf16", "--local-steps", "4", "--collective", "torch"),
    ("--wire-dtype", "bf16", "--local-steps", "4", "--outer-lr", "0.7", "--collective", "torch"),
])
def test_the_wire_dtype_is_taken_where_it_applies(argv):
    assert parse(*argv).ps.wire_dtype == argv[argv.index("--wire-dtype") + 1]


@pytest.mark.parametrize("argv, message", [
    (("--wire-dtype", "bf16"), "use --compression fp16, or add --local-steps"),
    (("--wire-dtype", "bf16", "--local-steps", "4"), "Horovod has no bfloat16 allreduce"),
])
def test_the_wire_dtype_is_refused_where_it_has_no_meaning(argv, message):
    with pytest.raises(ConfigError, match=message):
        parse(*argv)


# --- the simulator ------------------------------------------------------------------------------
def test_the_simulated_server_rounds_what_crosses_the_wire_as_the_real_one():
    from hvdtrain.compare.plan import Mode
    from hvdtrain.compare.sim.simulation import Simulation
    from hvdtrain.compare.sim.timing import Timing

    digits = ["--dataset", "digits", "--model", "mlp", "--hidden", "32", "--threads", "1",
              "--epochs", "1", "--max-steps-per-epoch", "4"]
    weights = {}
    for name in ("fp32", "bf16"):
        sim = Simulation(Mode("async"), 2, "", 0, digits + ["--wire-dtype", name], 0.9,
                         Timing(0.01))
        assert sim.run().status == "ok"
        weights[name] = sim.workers[0].params
    assert torch.equal(weights["bf16"], weights["bf16"].to(torch.bfloat16).float())
    assert not torch.equal(weights["fp32"], weights["fp32"].to(torch.bfloat16).float())
