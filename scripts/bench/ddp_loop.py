"""The same training step with PyTorch DistributedDataParallel over Gloo, launched by torchrun."""

import gc

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from common import make_data, make_model, make_step, parse_args, report, timed_loop

args = parse_args()
dist.init_process_group("gloo")                                 # DDP: start (env from torchrun)
if args.threads:
    torch.set_num_threads(args.threads)
torch.manual_seed(0)
model = DistributedDataParallel(make_model(args))               # DDP: broadcasts, bucketed allreduce
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * dist.get_world_size(), momentum=0.9)
x, y = make_data(args, dist.get_rank())
step = make_step(model, optimizer)
seconds = timed_loop(step, args, x, y)
if dist.get_rank() == 0:
    report("ddp_gloo", dist.get_world_size(), args, seconds)
# Gloo's threads must be gone before the interpreter finalizes, or a run can abort after its
# result (exit 134: 4 runs of 20 here; hvdtrain/sync/torch_runtime.py stop_torch_distributed)
dist.barrier()
dist.destroy_process_group()
gc.collect()
