"""The copies between an async worker's device buffers and the host buffers the messages use
(hvdtrain/ps/device_copies.py), on CPUs: the staged path must move exactly the chunks it is told
to, and the direct path must share one buffer."""

import mmap

import numpy as np
import pytest
import torch

from hvdtrain.ps.device_copies import HostCopies, StagedCopies, copies_for
from hvdtrain.ps.host_pinning import PAGE, HostPinning, page_spans


def test_a_cpu_worker_computes_in_the_host_buffers():
    copies = copies_for(torch.device("cpu"), 10)
    assert isinstance(copies, HostCopies)
    assert copies.device_params is copies.host_params
    host = copies.new_host_gradients(10)
    assert copies.gradient_target(host) is host
    assert copies.take_epoch_metrics() == {}


def test_staged_copies_move_each_chunk_both_ways():
    copies = StagedCopies(10, torch.device("cpu"))
    host_grads = copies.new_host_gradients(10)
    target = copies.gradient_target(host_grads)
    assert target is not host_grads and target.data_ptr() != host_grads.data_ptr()
    target.copy_(torch.arange(10.0))
    copies.gradients_to_host([(0, 4), (4, 7)])  # chunk by chunk: 7..9 is not asked for
    for i in range(2):
        copies.wait_gradient(i)
    assert host_grads.tolist() == [0, 1, 2, 3, 4, 5, 6, 0, 0, 0]
    copies.before_parameters()
    copies.host_params.copy_(torch.arange(10.0) * -1)
    copies.parameters_to_device(2, 5)
    copies.parameters_done()
    assert copies.device_params[2:5].tolist() == [-2, -3, -4]
    copies.device_params.fill_(7)
    copies.parameters_to_host()
    assert copies.host_params.tolist() == [7] * 10
    metrics = copies.take_epoch_metrics()
    assert metrics["device_copy_bytes"] == 4 * (7 + 3)  # float32 elements moved, not the rest
    assert copies.take_epoch_metrics()["device_copy_bytes"] == 0  # reset each epoch


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_copies_go_through_pinned_memory_without_blocking():
    copies = copies_for(torch.device("cuda", 0), 1 << 20)
    assert isinstance(copies, StagedCopies)
    host_grads = copies.new_host_gradients(1 << 20)
    assert copies.host_params.is_pinned() and host_grads.is_pinned()
    target = copies.gradient_target(host_grads)
    target.copy_(torch.arange(1 << 20, dtype=torch.float32, device="cuda"))
    chunks = [(a, a + (1 << 18)) for a in range(0, 1 << 20, 1 << 18)]
    copies.gradients_to_host(chunks)
    for i in range(len(chunks)):
        copies.wait_gradient(i)
    assert torch.equal(host_grads, target.cpu())
    copies.before_parameters()
    copies.host_params.copy_(host_grads * 2)
    for a, b in chunks:
        copies.parameters_to_device(a, b)
    copies.parameters_done()
    assert torch.equal(copies.device_params.cpu(), host_grads * 2)
    assert copies.take_epoch_metrics()["device_copy_seconds"] > 0


def test_parameters_come_out_of_the_window_straight_into_the_weights():
    """A same-host server's chunk goes to the device straight from its segment of the window
    (staged), or into the host buffer that is the weights (direct); nothing else moves."""
    window = np.arange(6, dtype=np.float32) + 10  # the server's segment: elements 4..9
    staged = StagedCopies(10, torch.device("cpu"))
    staged.host_params.fill_(-1)
    staged.before_parameters()
    staged.parameters_from_window(window[1:4], 5, 8)
    staged.parameters_done()
    assert staged.device_params[5:8].tolist() == [11, 12, 13]
    assert staged.host_params.tolist() == [-1] * 10  # no CPU copy through the host buffer
    assert staged.take_epoch_metrics()["device_copy_bytes"] == 4 * 3
    direct = copies_for(torch.device("cpu"), 10)
    direct.parameters_from_window(window[1:4], 5, 8)
    assert direct.device_params[5:8].tolist() == [11, 12, 13]


def test_page_spans_cover_segments_and_merge_shared_pages():
    mapping = mmap.mmap(-1, 4 * PAGE)  # page-aligned, as a shared window is
    pages = np.frombuffer(mapping, dtype=np.float32)
    first = pages.ctypes.data
    assert first % PAGE == 0
    # two segments on one page (a window's neighbours): one range, whole pages; empty: none
    assert page_spans([pages[:10], pages[5:20], pages[:0]]) == [(first, first + PAGE)]
    last = len(pages) - 1
    assert page_spans([pages[:1], pages[last:]]) == [(first, first + PAGE),
                                                     (first + 3 * PAGE, first + 4 * PAGE)]
    del pages


def test_pinning_registers_each_range_once_and_releases_it():
    registered, released = [], []
    pinning = HostPinning(lambda a, n: registered.append((a, n)) or True, released.append)
    segment = np.zeros(3 * PAGE // 4, dtype=np.float32)
    pinning.pin([segment[:100], segment[50:]])  # overlapping: one registration
    pinning.pin([segment])  # the same window asked again: nothing new
    assert len(registered) == 1 and registered[0][1] % PAGE == 0
    pinning.release()
    assert released == [registered[0][0]] and pinning.pinned == []


def test_a_refused_registration_leaves_the_copies_pageable_and_says_so():
    pinning = HostPinning(lambda a, n: False, lambda a: pytest.fail("nothing to release"))
    pinning.pin([np.zeros(10, np.float32)])
    assert pinning.failed == 1 and pinning.pinned == []
    pinning.release()
    staged = StagedCopies(4, torch.device("cpu"))
    staged.pinning = pinning
    assert staged.take_epoch_metrics()["device_copy_pageable_ranges"] == 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_registered_window_segment_is_pinned_for_the_gpu():
    mapping = mmap.mmap(-1, 4 << 20)  # page-aligned and its own mapping, as a shared window is
    window = np.frombuffer(mapping, dtype=np.float32)
    copies = copies_for(torch.device("cuda", 0), 1 << 20)
    copies.pin_window([window])
    assert copies.pinning.pinned and torch.from_numpy(window).is_pinned()
    window[:] = 3
    copies.before_parameters()
    copies.parameters_from_window(window, 0, 1 << 20)
    copies.parameters_done()
    assert torch.equal(copies.device_params.cpu(), torch.from_numpy(window))
    copies.release()
    assert copies.pinning.pinned == []


@pytest.mark.parametrize("server_here", [True, False], ids=["server-here", "server-elsewhere"])
def test_a_worker_pins_the_window_segments_it_copies_through(monkeypatch, server_here):
    """Its gradient segment whether or not a server shares its host (the gradient then leaves
    by messages, from the same pageable segment), and the segments of the servers it reads."""
    from hvdtrain.config import Config
    from hvdtrain.layout import Topology
    from hvdtrain.ps import server_link

    total = 8
    segments = {0: np.zeros(total, np.float32), 2: np.zeros(total, np.float32)}

    class Window:  # worker 0 and, maybe, server 2 on this host
        def __init__(self, comm, nbytes, enabled=True):
            pass

        def shares_host(self, rank):
            return rank == 0 or (server_here and rank == 2)

        def segment(self, rank):
            return segments[rank]

    pinned = []
    copies = StagedCopies(total, torch.device("cpu"))
    monkeypatch.setattr(copies, "pin_window", pinned.extend)
    monkeypatch.setattr(server_link, "HostWindow", Window)
    comm = type("Comm", (), {"Get_rank": lambda self: 0})()
    link = server_link.ServerLink(None, comm, Topology(3, 1), 0, Config().ps, False, None)
    link.lay_out(copies, total)
    link.open_window(total, [torch.nn.Parameter(torch.zeros(total))], True)
    want = [segments[2], segments[0]] if server_here else [segments[0]]
    assert [a.ctypes.data for a in pinned] == [a.ctypes.data for a in want]
