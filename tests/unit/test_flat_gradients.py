"""hvdtrain.sync.flat_gradients: every gradient a view into one buffer per device and dtype, kept
there across steps."""

import torch

from hvdtrain.sync.flat_gradients import FlatGradients


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.ReLU(), torch.nn.Linear(4, 3))


def in_buffer(grad: torch.Tensor, buffer: torch.Tensor) -> bool:
    start = buffer.data_ptr()
    end = start + buffer.numel() * buffer.element_size()
    return start <= grad.data_ptr() < end and grad.untyped_storage().data_ptr() == \
        buffer.untyped_storage().data_ptr()


def test_gradients_lie_back_to_back_in_parameter_order():
    net = model()
    flat = FlatGradients(net.parameters())
    (buffer,) = flat.buffers
    assert buffer.numel() == sum(p.numel() for p in net.parameters())
    offset = 0
    for p in net.parameters():
        assert p.grad.data_ptr() == buffer.data_ptr() + offset * buffer.element_size()
        offset += p.numel()


def test_backward_adds_into_the_buffer_and_zero_clears_it():
    net = model()
    flat = FlatGradients(net.parameters())
    x = torch.randn(8, 5)
    net(x).square().sum().backward()
    net(x).square().sum().backward()  # a second pass accumulates, as backward_passes_per_step
    expected = model()
    expected(x).square().sum().mul(2).backward()
    for p, q in zip(net.parameters(), expected.parameters()):
        assert in_buffer(p.grad, flat.buffers[0]) and torch.allclose(p.grad, q.grad)
    flat.zero()
    assert all(not p.grad.any() for p in net.parameters())


def test_a_replaced_gradient_goes_back_into_the_buffer_zeroed():
    net = model()
    flat = FlatGradients(net.parameters())
    first, second = list(net.parameters())[:2]
    first.grad = None
    second.grad = torch.ones_like(second)  # e.g. Horovod's broadcast_optimizer_state
    flat.zero()
    for p in (first, second):
        assert in_buffer(p.grad, flat.buffers[0]) and not p.grad.any()


def test_training_matches_zero_grad_bit_for_bit():
    nets = [model(), model()]
    opts = [torch.optim.SGD(n.parameters(), lr=0.1, momentum=0.9) for n in nets]
    flat = FlatGradients(nets[1].parameters())
    torch.manual_seed(1)
    for _ in range(5):
        x = torch.randn(8, 5)
        opts[0].zero_grad()
        flat.zero()
        for net, opt in zip(nets, opts):
            net(x).square().mean().backward()
            opt.step()
    for p, q in zip(*(n.parameters() for n in nets)):
        assert torch.equal(p, q)


def test_one_buffer_per_dtype_and_frozen_parameters_left_out():
    net = model()
    net[2].double()
    net[0].bias.requires_grad_(False)
    net[0].weight.grad = torch.full_like(net[0].weight, 3.0)  # a gradient already there is kept
    flat = FlatGradients(net.parameters())
    assert [b.dtype for b in flat.buffers] == [torch.float32, torch.float64]
    assert net[0].bias.grad is None
    assert torch.all(net[0].weight.grad == 3.0)
    assert [b.numel() for b in flat.buffers] == [20, 15]


def test_a_gradient_pointed_at_other_memory_goes_back_into_the_buffer():
    net = model()
    flat = FlatGradients(net.parameters())
    weight = net[0].weight
    weight.grad.set_(torch.ones_like(weight))  # as Horovod's optimizer does after decompressing
    flat.zero()
    assert in_buffer(weight.grad, flat.buffers[0]) and not weight.grad.any()
