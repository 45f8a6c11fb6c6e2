"""An async GPU worker copies each chunk of its gradient to the host as soon as backward has
produced it (hvdtrain/ps/early_gradients.py), checked on CPUs with the staged-copy path."""

from __future__ import annotations

import pytest
import torch

from hvdtrain.ps.device_copies import HostCopies, StagedCopies
from hvdtrain.ps.early_gradients import EarlyGradients
from hvdtrain.ps.flat_parameters import FlatParameters
from hvdtrain.ps.protocol import chunk_bounds


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    # the last layer is unused by forward(): its gradient is None, and its chunk waits for it
    net = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.ReLU(), torch.nn.Linear(7, 3),
                              torch.nn.Linear(3, 2))
    net.forward = lambda x: net[2](net[1](net[0](x)))
    return net


def views_over(buffer: torch.Tensor, trained: list) -> list[torch.Tensor]:
    """Each parameter's view of a flat buffer, in order (as ServerLink.bind_gradients lays them)."""
    views, offset = [], 0
    for p in trained:
        views.append(buffer[offset:offset + p.numel()].view_as(p))
        offset += p.numel()
    return views


def setup(net, chunk: int = 10):
    flat = FlatParameters(net)
    grads = torch.zeros(flat.total)
    views = views_over(grads, flat.trained)
    return flat, grads, views, chunk_bounds(flat.total, chunk)


def backward(net) -> None:
    for p in net.parameters():
        p.grad = None
    net(torch.randn(4, 5)).square().sum().backward()


def test_chunks_start_as_backward_completes_them_last_layer_first():
    net = model()
    flat, grads, views, chunks = setup(net)
    started = []
    early = EarlyGradients(flat.trained, views, chunks, started.append)
    early.arm()
    backward(net)
    during = list(started)
    assert during and during[0] > len(chunks) // 2  # the last layers' chunks go first
    assert early.finish()
    assert sorted(started) == list(range(len(chunks)))  # each chunk once
    assert set(started[len(during):]) and len(chunks) - 1 in started[len(during):]  # unused
    want = torch.cat([p.grad.reshape(-1) if p.grad is not None else torch.zeros(p.numel())
                      for p in flat.trained])
    assert torch.equal(grads, want)


def test_a_second_pass_before_the_step_ends_falls_back_to_the_ordinary_gather():
    net = model()
    flat, _, views, chunks = setup(net)
    early = EarlyGradients(flat.trained, views, chunks, lambda c: None)
    early.arm()
    out = net(torch.randn(4, 5))
    out.sum().backward(retain_graph=True)
    out.sum().backward()  # accumulates: the first gather was not the final gradient
    assert not early.finish()
    started = []
    early.start_chunk = started.append
    backward(net)  # unarmed: the hooks do nothing
    assert started == []


def test_staged_copies_move_the_gradient_during_backward_and_count_it_once():
    net = model()
    flat = FlatParameters(net)
    copies = StagedCopies(flat.total, torch.device("cpu"))
    flat.bind(copies.device_params)
    host = copies.new_host_gradients(flat.total)
    target = copies.gradient_target(host)
    views = views_over(target, flat.trained)
    chunks = chunk_bounds(flat.total, 8)
    early = copies.early_gradients(flat.trained, views, chunks)
    for _ in range(2):  # a second step starts afresh
        copies.begin_gradients(len(chunks))
        early.arm()
        backward(net)
        assert early.finish()
        for i in range(len(chunks)):
            copies.wait_gradient(i)
        assert torch.equal(host, target)
        assert copies.take_epoch_metrics()["device_copy_bytes"] == 4 * flat.total
    assert HostCopies(4).early_gradients([], [], []) is None  # a CPU worker: no hooks


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_the_early_copies_bring_the_gathered_gradient_to_pinned_memory():
    device = torch.device("cuda", 0)
    net = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                              torch.nn.Linear(512, 10)).to(device)
    flat = FlatParameters(net)
    copies = StagedCopies(flat.total, device)
    flat.bind(copies.device_params)
    host = copies.new_host_gradients(flat.total)
    target = copies.gradient_target(host)
    views = views_over(target, flat.trained)
    chunks = chunk_bounds(flat.total, 1 << 14)
    early = copies.early_gradients(flat.trained, views, chunks)
    copies.begin_gradients(len(chunks))
    early.arm()
    net(torch.randn(64, 256, device=device)).square().sum().backward()
    assert early.finish()
    for i in range(len(chunks)):
        copies.wait_gradient(i)
    want = torch.cat([p.grad.reshape(-1) for p in flat.trained]).cpu()
    assert host.is_pinned() and torch.equal(host, want)
    assert copies.take_epoch_metrics()["device_copy_seconds"] > 0
