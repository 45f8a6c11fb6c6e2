"""The loop a user would write by hand with Horovod on a GPU: scripts/bench/plain_horovod_loop.py
with one GPU per local rank, batches copied from pinned host memory without blocking. It prints
the BENCH line scripts/bench_gpu.py reads (global samples/s). With --profile-steps A:B (warm-up
steps, counted from 1) and --profile-dir DIR, rank 0 profiles those steps with hvdtrain's own
--profile-steps hook (hvdtrain/loop/profiling.py) and writes its files into DIR, so that the two
loops' steps compare line by line."""

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
parser.add_argument("--profile-dir", default="")
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


# hvdtrain's own profiling hook over these warm-up steps, so that both loops' summaries match
window = None
if args.profile_steps and hvd.rank() == 0:
    from hvdtrain.loop.profiling import ProfileWindow
    window = ProfileWindow(args.profile_steps, lambda: Path(args.profile_dir), 0, cuda=True,
                           who="hand loop")
for i in range(args.warmup_steps):
    step(i)
    if window is not None:
        window.after_step(None)  # the window counts steps; it reads nothing of them
if window is not None:
    window.close()  # a window past the warm-up's end writes what it recorded
torch.cuda.synchronize()
t0 = time.perf_counter()
for i in range(args.warmup_steps, args.warmup_steps + args.steps):
    step(i)
torch.cuda.synchronize()
if hvd.rank() == 0:
    report("hand_horovod_gpu", hvd.size(), args, time.perf_counter() - t0)
