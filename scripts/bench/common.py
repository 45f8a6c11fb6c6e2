"""What every benchmark loop shares: the model, the data and the timing, so that the loops differ
only in how they distribute training."""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--features", type=int, default=1024)
    parser.add_argument("--hidden", type=str, default="1024,1024")
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=64, help="per process")
    parser.add_argument("--warmup-steps", type=int, default=20)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--threads", type=int, default=0,
                        help="0: leave torch's default; -1: hvdtrain's rule (cores / processes)")
    return parser.parse_args()


def make_model(args: argparse.Namespace) -> nn.Sequential:
    """The same layers as hvdtrain's --model mlp: Flatten, (Linear, ReLU)*, Linear."""
    widths = [args.features, *map(int, args.hidden.split(","))]
    layers: list[nn.Module] = [nn.Flatten()]
    for a, b in zip(widths, widths[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    layers.append(nn.Linear(widths[-1], args.classes))
    return nn.Sequential(*layers)


def make_data(args: argparse.Namespace, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """As many samples as hvdtrain's benchmark run holds (16,384), so both read the same amount
    of memory."""
    g = torch.Generator().manual_seed(1234 + rank)
    x = torch.randn(16384, args.features, generator=g)
    y = torch.randint(0, args.classes, (16384,), generator=g)
    return x, y


def make_step(model: nn.Module, optimizer: torch.optim.Optimizer):
    """The plain training step both baselines run; only the distributed wrapping differs."""
    def step(xb: torch.Tensor, yb: torch.Tensor) -> None:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        optimizer.step()
        loss.item()  # read the loss each step, as a training loop that logs it does
    return step


def plain_horovod_block(hvd, model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int,
                        steps: int, prefix: str, groups: int | None = None):
    """The plain loop of Horovod's pytorch_mnist example on ``model``, a second copy beside a
    trainer in the same job (its parameters named under ``prefix``, so that Horovod's tensor
    names differ from the trainer's). ``groups``: DistributedOptimizer's, as the trainer's.
    Returns a function that runs ``steps`` steps on random batches of (x, y) and gives
    samples/s across the job."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size(), momentum=0.9)
    optimizer = hvd.DistributedOptimizer(                               # Horovod
        optimizer, named_parameters=[(f"{prefix}.{n}", p) for n, p in model.named_parameters()],
        groups=groups)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)          # Horovod
    generator = torch.Generator().manual_seed(hvd.rank())
    step = make_step(model, optimizer)

    def block() -> float:
        t0 = time.perf_counter()
        for _ in range(steps):
            idx = torch.randint(0, len(x), (batch,), generator=generator)
            step(x[idx], y[idx])
        return steps * batch * hvd.size() / (time.perf_counter() - t0)
    return block


def timed_loop(step, args: argparse.Namespace, x: torch.Tensor, y: torch.Tensor) -> float:
    """Run warmup steps, then time ``args.steps`` steps; return seconds. Batches are random
    samples of the data, reshuffled each pass, as a shuffling data loader would give them."""
    b = args.batch_size
    g = torch.Generator().manual_seed(0)
    order = torch.randperm(len(x), generator=g)

    def batch(i):
        nonlocal order
        start = (i * b) % (len(x) - b + 1)
        if start == 0 and i:
            order = torch.randperm(len(x), generator=g)
        idx = order[start:start + b]
        return x[idx], y[idx]

    for i in range(args.warmup_steps):
        step(*batch(i))
    t0 = time.perf_counter()
    for i in range(args.warmup_steps, args.warmup_steps + args.steps):
        step(*batch(i))
    return time.perf_counter() - t0


def report(name: str, world_size: int, args: argparse.Namespace, seconds: float) -> None:
    """The line the driver parses: global samples per second."""
    samples = world_size * args.batch_size * args.steps
    print("BENCH " + json.dumps({"name": name, "world_size": world_size,
                                 "samples_per_sec": samples / seconds}), flush=True)
