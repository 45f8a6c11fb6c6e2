"""Push-plus-pull throughput of hvdtrain's parameter server, without the trainer around it.

Run under ``mpirun -np 2`` (1 worker, 1 server). The worker pushes a gradient of the model's size
and receives the updated parameters, again and again; throughput counts gradient bytes in plus
parameter bytes out per second. Prints one BENCH line (worker) and the server's statistics.
"""

import argparse
import json
import time

import torch

from hvdtrain.config import Config
from hvdtrain.replica import Replica

parser = argparse.ArgumentParser()
parser.add_argument("--mib", type=float, default=16.0)
parser.add_argument("--warmup", type=int, default=5)
parser.add_argument("--rounds", type=int, default=40)
parser.add_argument("--chunk-mb", type=float, default=None)
parser.add_argument("--optimizer", default="sgd")
parser.add_argument("--momentum", type=float, default=0.9)
parser.add_argument("--wire-dtype", default="fp32", choices=("fp32", "bf16", "fp16"))
parser.add_argument("--no-shared-memory", action="store_true",
                    help="move tensors through messages even though both processes share a host")
args = parser.parse_args()

from mpi4py import MPI  # noqa: E402  (after argparse: --help needs no MPI)

from hvdtrain.ps.client import ParameterServerClient  # noqa: E402
from hvdtrain.layout import Topology  # noqa: E402
from hvdtrain.ps.server import ParameterServer  # noqa: E402
from hvdtrain.runtime import Runtime  # noqa: E402

cfg = Config()
cfg.run.mode = "async"
cfg.optim.optimizer = args.optimizer
cfg.optim.momentum = args.momentum
cfg.ps.shared_memory = not args.no_shared_memory
cfg.ps.wire_dtype = args.wire_dtype
if args.chunk_mb:
    cfg.ps.chunk_mb = args.chunk_mb
world = MPI.COMM_WORLD
topology = Topology(world.Get_size(), cfg.ps.num_servers)
comm = world.Dup()
worker_comm = world.Split(1 if topology.is_server(world.Get_rank()) else 0, world.Get_rank())
if topology.is_server(world.Get_rank()):
    stats = ParameterServer(comm, cfg, topology).serve()
    print("SERVER " + json.dumps(stats), flush=True)
else:
    elements = int(args.mib * 1024 * 1024 / 4)
    model = torch.nn.Sequential(torch.nn.Linear(elements, 1, bias=False))  # one big tensor
    runtime = Runtime(world.Get_rank(), world.Get_size(), 0, 1, torch.device("cpu"), "mpirun")
    client = ParameterServerClient(cfg, runtime, comm, worker_comm, topology)
    client.attach(Replica(model, torch.device("cpu")))
    client.start(None, resuming=False)
    client.grads_flat.normal_()
    for _ in range(args.warmup):
        client.push(lr=1e-6)
    t0 = time.perf_counter()
    for _ in range(args.rounds):
        client.push(lr=1e-6)
    seconds = time.perf_counter() - t0
    nbytes = client.params_flat.numel() * 4
    print("BENCH " + json.dumps({"bytes_per_sec": 2 * nbytes * args.rounds / seconds,
                                 "model_bytes": nbytes,
                                 "round_trip_ms": 1000 * seconds / args.rounds}), flush=True)
    client.close()
