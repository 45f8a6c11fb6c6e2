"""The loop a user would write by hand with Horovod on a GPU: scripts/bench/plain_horovod_loop.py
with one GPU per local rank, batches copied from pinned host memory without blocking. It prints
the BENCH line scripts/bench_gpu.py reads (global samples/s). With --profile-steps A:B (warm-up
steps, counted from 1) and --profile-out FILE, rank 0 profiles those steps with torch.profiler
and writes the summary that hvdtrain's --profile-steps writes (hvdtrain/loop/profiling.py), so
that the two loops' steps compare line by line."""

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import horovod.torch as hvd

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from common import make_data, make_model, report  # noqa: E402

parser = argparse.ArgumentParser()
for name, default in (("features", 1024), ("classes", 10), ("batch-size", 256),
                      ("warmup-steps", 20), ("steps", 60)):
    parser.add_argument(f"--{name}", type=int, default=default)
parser.add_argument("--hidden", default="4096,4096")
parser.add_argument("--lr", type=float, default=0.01)
parser.add_argument("--profile-steps", default="")
parser.add_argument("--profile-out", default="")
args = parser.parse_args()

hvd.init()
torch.cuda.set_device(hvd.local_rank())
torch.manual_seed(0)
model = make_model(args).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)
x, y = (t.pin_memory() for t in make_data(args, hvd.rank()))


def step(i: int) -> None:
    start = (i * args.batch_size) % (len(x) - args.batch_size + 1)
    xb = x[start:start + args.batch_size].cuda(non_blocking=True)
    yb = y[start:start + args.batch_size].cuda(non_blocking=True)
    optimizer.zero_grad()
    loss = F.cross_entropy(model(xb), yb)
    loss.backward()
    optimizer.step()
    loss.item()  # read the loss each step, as a loop that logs it does


def profiled_warmup() -> None:
    """The warm-up steps, with steps A to B of them under torch.profiler (rank 0)."""
    from torch.profiler import ProfilerActivity, profile
    from hvdtrain.config.values import parse_profile_steps
    from hvdtrain.loop.profiling import summarize
    first, last = parse_profile_steps(args.profile_steps)
    profiler, started = None, 0.0
    for i in range(args.warmup_steps):
        step(i)
        if i + 1 == first - 1:
            profiler = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
            profiler.start()
            started = time.perf_counter()
        elif i + 1 == last and profiler is not None:
            profiler.stop()
            summary = summarize(profiler, last - first + 1, time.perf_counter() - started, True)
            Path(args.profile_out).write_text(f"hand loop profile: rank 0, {summary}")
            profiler = None


if args.profile_steps and hvd.rank() == 0:
    profiled_warmup()
else:
    for i in range(args.warmup_steps):
        step(i)
torch.cuda.synchronize()
t0 = time.perf_counter()
for i in range(args.warmup_steps, args.warmup_steps + args.steps):
    step(i)
torch.cuda.synchronize()
if hvd.rank() == 0:
    report("hand_horovod_gpu", hvd.size(), args, time.perf_counter() - t0)
