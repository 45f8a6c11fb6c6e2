"""--server-device: a server's shard on a GPU (hvdtrain/ps/shard_device.py). Without a GPU the
device shard runs with device='cpu' through the same code (a master copy distinct from the host
copy the messages carry, with real copies between them), and must compute exactly what the
plain CPU shard computes; --server-device cpu must be the plain shard itself."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fake_ps import Job, replied
from hvdtrain import runtime
from hvdtrain.config import Config, ConfigError, OptimConfig
from hvdtrain.ps import shard as shard_module
from hvdtrain.ps.protocol import WANT_PARAMS, Kind, chunk_bounds, make_header
from hvdtrain.ps.shard_device import DeviceShardOptimizer, shard_optimizer_on
from hvdtrain.ps.shard_optimizer import ShardOptimizer
from hvdtrain.rules.local_sgd import OuterStep

CPU = torch.device("cpu")
N = 11
CHUNKS = chunk_bounds(N, 4)  # three chunks, the last one short


def optim(name: str, momentum: float = 0.9) -> OptimConfig:
    cfg = OptimConfig()
    cfg.optimizer, cfg.momentum, cfg.weight_decay = name, momentum, 0.01
    return cfg


SETTINGS = {"sgd": (optim("sgd"), None), "sgd-plain": (optim("sgd", 0.0), None),
            "adam": (optim("adam"), None), "adamw": (optim("adamw"), None),
            "outer-delayed": (optim("sgd"), OuterStep(0.9, 2))}


def pair(cfg, outer, start: torch.Tensor):
    host = ShardOptimizer(start.clone(), CHUNKS, cfg, outer)
    on_device = DeviceShardOptimizer(start.clone(), CHUNKS, cfg, outer, CPU)
    return host, on_device


def gradients(steps: int, seed: int = 3) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(N, generator=g) for _ in range(steps)]


def test_server_device_cpu_is_the_plain_shard_on_the_host_buffer():
    params = torch.zeros(N)
    optimizer = shard_optimizer_on(CPU, params, CHUNKS, optim("sgd"))
    assert type(optimizer) is ShardOptimizer and optimizer.params is params


@pytest.mark.parametrize("name", SETTINGS)
def test_a_device_shard_computes_what_the_host_shard_computes(name):
    cfg, outer = SETTINGS[name]
    host, on_device = pair(cfg, outer, torch.linspace(-1, 1, N))
    assert on_device.master.data_ptr() != on_device.params.data_ptr()
    for grad in gradients(5):
        for i, (a, b) in enumerate(CHUNKS):
            host.apply(i, grad[a:b].clone(), 0.1)
            on_device.apply(i, grad[a:b].clone(), 0.1)
            # the host copy the reply sends holds the chunk's update as soon as it is applied
            assert torch.equal(on_device.params[a:b], host.params[a:b])
    assert torch.equal(on_device.master, host.params)
    assert on_device.vectors.keys() == host.vectors.keys()
    for key in host.vectors:
        assert torch.equal(on_device.vectors[key], host.vectors[key]), key
    assert on_device.scalars() == host.scalars()


@pytest.mark.parametrize("name", ["adam", "outer-delayed"])
def test_checkpoints_move_between_device_and_host_shards(name):
    """A checkpoint holds CPU tensors (shard_file.py saves them so), so the state of a device shard resumes
    on a host shard and back, and both go on as one uninterrupted shard would."""
    cfg, outer = SETTINGS[name]
    start, grads = torch.linspace(-1, 1, N), gradients(6)
    straight = ShardOptimizer(start.clone(), CHUNKS, cfg, outer)
    on_device = DeviceShardOptimizer(start.clone(), CHUNKS, cfg, outer, CPU)
    host = ShardOptimizer(torch.zeros(N), CHUNKS, cfg, outer)
    back = DeviceShardOptimizer(torch.zeros(N), CHUNKS, cfg, outer, CPU)
    for k, grad in enumerate(grads):
        if k == 2:  # device -> host
            host.params.copy_(on_device.params)
            host.load({n: v.cpu() for n, v in on_device.vectors.items()}, on_device.scalars())
            current = host
        if k == 4:  # host -> device: the host copy arrives first (INIT), then the state
            back.params.copy_(host.params)
            back.params_received()
            back.load({n: v.cpu() for n, v in host.vectors.items()}, host.scalars())
            current = back
        live = on_device if k < 2 else current
        for i, (a, b) in enumerate(CHUNKS):
            straight.apply(i, grad[a:b].clone(), 0.05)
            live.apply(i, grad[a:b].clone(), 0.05)
    assert torch.equal(back.params, straight.params)
    assert torch.equal(back.master, straight.params)


def test_the_real_server_with_a_device_shard_replies_what_a_host_shard_replies(monkeypatch):
    """Pushes through the real server (fake communicator, shared window) with DC-ASGD, which
    reads the host copy: the device shard (device='cpu') ends where the plain one ends."""
    def run(device_shard: bool) -> tuple[np.ndarray, list]:
        if device_shard:
            monkeypatch.setattr(shard_module, "shard_optimizer_on",
                                lambda device, *a: DeviceShardOptimizer(*a, CPU))
        cfg = Config()
        cfg.ps.dc_lambda, cfg.ps.chunk_mb = 0.04, 16 / 2**20  # chunks of 4 elements
        job = Job(monkeypatch, 2, 0, total=10, bsp=False, cfg=cfg)
        server, rank = job.servers[0], job.topology.server_ranks()[0]
        assert isinstance(server.shard.optimizer, DeviceShardOptimizer) == device_shard
        if device_shard:
            server.shard.optimizer.params_received()  # as receive_params does after INIT
        for w in range(2):
            job.handle(rank, w, make_header(Kind.PULL, worker=w))
        replies, rng = [], np.random.default_rng(5)
        for k, w in enumerate([0, 1, 1, 0, 1]):
            job.segments[w][:] = rng.standard_normal(10).astype(np.float32) * 3
            header = make_header(Kind.PUSH, clock=1 + k, lr=0.1, flags=WANT_PARAMS, worker=w)
            replies.append(replied(job.handle(rank, w, header)))
        monkeypatch.undo()
        return job.params(), replies

    plain, on_device = run(False), run(True)
    assert np.array_equal(plain[0], on_device[0]) and plain[1] == on_device[1]


def test_server_device_cuda_without_cuda_is_refused_on_every_rank():
    runtime.check_server_cuda(0)
    with pytest.raises(ConfigError, match=r"--server-device cuda: 1 parameter server rank\(s\) "
                                          "see no CUDA device; use --server-device auto"):
        runtime.check_server_cuda(1)


def test_start_mpi_refuses_a_cuda_server_on_every_rank_with_exit_code_2(monkeypatch):
    """Every rank learns (one allreduce) that a server rank lacks CUDA, a worker too, so no
    rank waits for one that left; the error is bad input, which ends the job with code 2."""
    import sys
    from types import SimpleNamespace

    from hvdtrain.config import RunConfig
    from hvdtrain.exit_codes import EXIT_BAD_INPUT
    from hvdtrain.launch import failure_code

    class World:  # rank 0 of 2: a worker; the server (rank 1) is on a host without CUDA
        def Get_rank(self):
            return 0

        def Get_size(self):
            return 2

        def allreduce(self, value):
            return value + 1  # the server's 1

    mpi = SimpleNamespace(COMM_WORLD=World())
    monkeypatch.setitem(sys.modules, "mpi4py", SimpleNamespace(MPI=mpi))
    monkeypatch.setattr(runtime, "detect_launcher", lambda: "mpirun")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # this worker has a GPU
    with pytest.raises(ConfigError, match="--server-device cuda: 1 parameter server") as caught:
        runtime.start_mpi(RunConfig(), lambda rank, size: rank == 1, "cuda")
    assert failure_code(caught.value) == EXIT_BAD_INPUT == 2


def test_a_server_takes_the_gpus_from_the_last(monkeypatch):
    assert runtime.pick_server_device("cpu", 0) == CPU
    chosen = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    for count, server, want in [(4, 0, 3), (4, 1, 2), (1, 0, 0), (2, 2, 1)]:
        monkeypatch.setattr(torch.cuda, "device_count", lambda c=count: c)
        assert runtime.pick_server_device("auto", server) == torch.device("cuda", want)
    assert chosen[-1] == torch.device("cuda", 1)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert runtime.pick_server_device("auto", 0) == CPU  # auto without a GPU: the CPU


def test_server_device_needs_async_mode():
    cfg = Config()
    cfg.ps.server_device = "cuda"
    with pytest.raises(ConfigError, match="only --mode async has parameter servers"):
        cfg.validate()
    cfg.run.mode = "async"
    cfg.validate()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_gpu_shard_matches_the_cpu_shard_and_sends_from_pinned_memory():
    from hvdtrain.ps.shard_device import host_buffer

    cfg, outer = SETTINGS["adam"]
    start = torch.linspace(-1, 1, N)
    host = ShardOptimizer(start.clone(), CHUNKS, cfg, outer)
    params = host_buffer(N, torch.device("cuda"))
    assert params.is_pinned()
    params.copy_(start)
    gpu = shard_optimizer_on(torch.device("cuda"), params, CHUNKS, cfg, outer)
    assert gpu.master.is_cuda and all(v.is_cuda for v in gpu.vectors.values())
    for grad in gradients(4):
        for i, (a, b) in enumerate(CHUNKS):
            host.apply(i, grad[a:b].clone(), 0.1)
            gpu.apply(i, grad[a:b].clone().pin_memory(), 0.1)
    assert torch.allclose(gpu.params, host.params, atol=1e-6)
    assert torch.equal(gpu.params, gpu.master.cpu())
