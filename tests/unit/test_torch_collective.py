"""--collective torch: the torch.distributed port's logic against a one-process Gloo group (in
this process, a FileStore in tmp_path), where it starts and what it refuses. Two processes
meeting is tests/multiproc/test_torch_collective_multiproc.py's."""

import pytest
import torch
import torch.distributed as dist

from hvdtrain.config import Config, ConfigError, RunConfig, SyncConfig
from hvdtrain.sync import torch_runtime
from hvdtrain.sync.torch_collective import TorchCollective, by_kind, contiguous_run


@pytest.fixture
def group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    yield
    dist.destroy_process_group()


def test_contiguous_run_is_a_view_only_over_back_to_back_tensors():
    buffer = torch.arange(10.0)
    a, b, c = buffer[0:4].view(2, 2), buffer[4:7], buffer[7:10]
    flat = contiguous_run([a, b, c])
    assert flat is not None and flat.data_ptr() == buffer.data_ptr() and flat.numel() == 10
    flat.add_(1)  # writes reach the tensors themselves
    assert a[0, 0].item() == 1.0
    assert contiguous_run([b, a]) is None  # out of order
    assert contiguous_run([a, c]) is None  # a gap
    assert contiguous_run([buffer[0:2], torch.zeros(2)]) is None  # another storage
    assert contiguous_run([buffer[0:4].view(2, 2).t()]) is None  # not contiguous


def test_by_kind_groups_by_dtype_in_order():
    x, y, z = torch.zeros(1), torch.zeros(1, dtype=torch.float64), torch.ones(1)
    groups = by_kind([x, y, z])
    assert [len(g) for g in groups] == [2, 1] and groups[0][1] is z


def test_port_collectives_in_a_one_process_group(group):
    port = TorchCollective()
    assert (port.rank, port.size) == (0, 1)
    assert port.sum([1.5, 2.0]) == [1.5, 2.0]
    pending = port.start_sum([1, 2 ** 40])
    assert pending.wait() == [1, 2 ** 40] and pending.wait() == [1, 2 ** 40]  # read twice
    assert port.broadcast_object({"a": [1, 2]}) == {"a": [1, 2]}
    assert port.gather_object(("rank", 0)) == [("rank", 0)]
    assert port.agree(-7) == (-7, -7)
    port.barrier()


def test_average_keeps_values_and_places(group):
    """At one rank the mean is the value itself, through each path: reduced where flat
    gradients lie, through a copy for scattered tensors of two dtypes."""
    port = TorchCollective()
    flat = torch.arange(6.0)
    views = [flat[:2], flat[2:6].view(2, 2)]
    scattered = [torch.full((3,), 2.5), torch.tensor([1.25], dtype=torch.float64)]
    port._average(views + scattered)
    assert flat.tolist() == [0, 1, 2, 3, 4, 5] and views[1].data_ptr() == flat.data_ptr() + 8
    assert scattered[0].tolist() == [2.5] * 3 and scattered[1].item() == 1.25


def test_broadcast_keeps_rank_0s_values_in_place(group):
    port = TorchCollective()
    port._size = 2  # past the early return for one rank: rank 0 broadcasts to itself
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    port.broadcast_(list(model.state_dict().items()))  # floats and an int64 counter
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name


def test_average_gradients_fills_a_missing_gradient_and_rounds_under_fp16(group):
    port = TorchCollective(compression="fp16")
    port._size = 2  # as if two ranks: the early return for one rank is skipped ...
    params = [torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(1))]
    params[0].grad = torch.tensor([1.0 + 2 ** -15, 4.0])
    port.average_gradients(params)  # ... so the one rank's sum is halved
    assert params[1].grad.tolist() == [0.0]  # Horovod too sends zeros for it
    assert params[0].grad.tolist() == [0.5, 2.0]  # 1 + 2^-15 is 1 in float16


def test_start_without_a_launcher_and_stop(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "HOROVOD_RANK", "OMPI_COMM_WORLD_RANK"):
        monkeypatch.delenv(name, raising=False)
    runtime = torch_runtime.start_torch_distributed(RunConfig(run_dir="r", threads=1),
                                                    SyncConfig(collective="torch"))
    try:
        assert (runtime.rank, runtime.size, runtime.device.type) == (0, 1, "cpu")
        assert "gloo" in runtime.launcher and dist.is_initialized()
    finally:
        torch_runtime.stop_torch_distributed(finished=True)  # meets the others: none here
    assert not dist.is_initialized()
    torch_runtime.stop_torch_distributed(finished=False)  # twice is harmless


@pytest.mark.parametrize("finished, calls", [(True, ["barrier", "destroy", "collect"]),
                                              (False, ["destroy", "collect"])])
def test_the_group_is_destroyed_and_its_threads_freed_before_the_interpreter_ends(
        monkeypatch, finished, calls):
    # A Gloo thread that frees a Python tensor while the interpreter finalizes aborts the
    # process (4 runs of 30 of a DiLoCo job exited 134 after its last line): the group is
    # destroyed and collected first, after every rank has met where the run finished (not
    # after a failure, where the others may never come).
    import gc

    seen = []
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "barrier", lambda: seen.append("barrier"))
    monkeypatch.setattr(dist, "destroy_process_group", lambda: seen.append("destroy"))
    monkeypatch.setattr(gc, "collect", lambda: seen.append("collect"))
    torch_runtime.stop_torch_distributed(finished)
    assert seen == calls


@pytest.mark.parametrize("env, expected", [
    ({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"},
     (3, 4, 1, 2, "torchrun")),
    ({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2",
      "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"},
     (1, 2, 1, 2, "mpirun")),
    ({"HOROVOD_RANK": "2", "HOROVOD_SIZE": "3", "HOROVOD_LOCAL_RANK": "0",
      "HOROVOD_LOCAL_SIZE": "1", "HOROVOD_GLOO_RENDEZVOUS_ADDR": "h"},
     (2, 3, 0, 1, "horovodrun --gloo")),
    # horovodrun --mpi sets Horovod's variables in an MPI job: read as mpirun's
    ({"HOROVOD_RANK": "1", "HOROVOD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1",
      "OMPI_COMM_WORLD_SIZE": "2"}, (1, 2, 0, 1, "mpirun")),
    ({}, (0, 1, 0, 1, "none")),
])
def test_placement_from_each_launcher(monkeypatch, env, expected):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "HOROVOD_RANK",
                 "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE",
                 "HOROVOD_GLOO_RENDEZVOUS_ADDR", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                 "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    p = torch_runtime.placement()
    assert (p.rank, p.size, p.local_rank, p.local_size, p.launcher) == expected


def test_a_missing_peer_fails_with_a_clear_error(monkeypatch):
    """torchrun's variables for a world of two, and no second rank: the start ends after the
    timeout with what to check, not a hang."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for name, value in {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0",
                        "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=r"rank 0 of 2 \(torchrun\) could not meet the other "
                                          r"ranks within 2 s.*every rank was started"):
        torch_runtime.start_torch_distributed(RunConfig(run_dir="r", threads=1),
                                              SyncConfig(collective="torch", stall_timeout_s=2))
    assert not dist.is_initialized()


@pytest.mark.parametrize("flags, says", [
    ({"reduce_op": "adasum"}, "--reduce-op adasum is Horovod's; use --collective horovod"),
    ({"elastic": True, "run_dir": "r"}, "--elastic is Horovod's elastic mode"),
    ({"sync_batchnorm": True}, "--sync-batchnorm uses Horovod's SyncBatchNorm"),
    ({"cycle_time_ms": 5.0}, "--cycle-time-ms tunes Horovod's background thread"),
    ({"balance": True}, "--balance runs on Horovod's scheme"),
    ({"mode": "async"}, "--collective: invalid value 'torch'; the parameter server talks MPI"),
])
def test_refuses_what_only_horovod_does(flags, says):
    with pytest.raises(ConfigError, match=says.replace("(", r"\(")):
        Config.from_overrides({"collective": "torch", **flags}).validate()


def test_horovod_stays_the_default():
    assert Config().sync.collective == "horovod"
    assert Config.from_overrides({"collective": "torch"}).validate().sync.collective == "torch"


def test_only_torchruns_rank_0_prints_start_up_errors(monkeypatch):
    from hvdtrain.cli import rank_from_environment

    for name in ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RANK", "1")  # torchrun sets no launcher variable of MPI's or Horovod's
    assert rank_from_environment() == 1


def test_fit_twice_in_one_process(tmp_path, monkeypatch):
    """fit() over torch.distributed, alone: it starts its process group and destroys it at the
    end, so a second fit() in the same process starts again (torch refuses a second start)."""
    import hvdtrain

    for name in ("RANK", "WORLD_SIZE", "HOROVOD_RANK", "OMPI_COMM_WORLD_RANK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HVDTRAIN_NO_FLOP_COUNT", "1")
    data = (torch.randn(64, 4), torch.randint(0, 2, (64,)))
    for attempt in range(2):
        result = hvdtrain.fit(torch.nn.Linear(4, 2), data, collective="torch", epochs=1,
                              batch_size=16, threads=1, progress=False,
                              run_dir=str(tmp_path / str(attempt)))
        assert result.history and not dist.is_initialized()
