"""The loop a user would write by hand with Horovod, after Horovod's pytorch_mnist example."""

import torch

import horovod.torch as hvd
from common import make_data, make_model, make_step, parse_args, report, timed_loop

args = parse_args()
if args.threads < 0:  # "same settings": hvdtrain's rule, Open MPI's unasked binding released and
    # unbound ranks given a share of the cores each, as hvdtrain does
    from hvdtrain.core_binding import bind_to_share, local_size_hint, release_default_binding
    release_default_binding(local_size_hint())
    bind_to_share(local_size_hint())
hvd.init()                                                      # Horovod: start
if args.threads < 0:  # ... and cores per process on this host
    from hvdtrain.runtime import default_threads
    torch.set_num_threads(default_threads(hvd.local_size()))
elif args.threads:
    torch.set_num_threads(args.threads)
torch.manual_seed(0)
model = make_model(args)
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())  # Horovod
hvd.broadcast_parameters(model.state_dict(), root_rank=0)       # Horovod: same start everywhere
hvd.broadcast_optimizer_state(optimizer, root_rank=0)           # Horovod
x, y = make_data(args, hvd.rank())
step = make_step(model, optimizer)
seconds = timed_loop(step, args, x, y)
if hvd.rank() == 0:
    report("plain_horovod", hvd.size(), args, seconds)
