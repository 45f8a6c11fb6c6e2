"""The copies between an async worker's device buffers and the host buffers the messages use
(hvdtrain/ps/device_copies.py), on CPUs: the staged path must move exactly the chunks it is told
to, and the direct path must share one buffer."""

import pytest
import torch

from hvdtrain.ps.device_copies import HostCopies, StagedCopies, copies_for


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
