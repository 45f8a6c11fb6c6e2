"""Page faults per step of a small CPU training loop (an MLP of 2.1M parameters), printed as
``FAULTS <mean> <median>`` over 40 steps; with ``keep`` as the argument, after
hvdtrain.freed_memory.keep_freed_memory() (tests/unit/test_freed_memory.py). Each run is its own
process: malloc's settings are process-wide."""

import resource
import statistics
import sys

import torch

from hvdtrain.freed_memory import keep_freed_memory

if sys.argv[1:] == ["keep"] and not keep_freed_memory():
    sys.exit("keep_freed_memory() did not set malloc's thresholds")
torch.set_num_threads(1)
torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
    torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
    torch.nn.Linear(1024, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(64, 1024), torch.randint(0, 10, (64,))


def step() -> None:
    optimizer.zero_grad()  # gradients set to None: a fresh 4 MiB block each step
    torch.nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()


def faults_of_one_step() -> int:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    step()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


for _ in range(5):
    step()
faults = [faults_of_one_step() for _ in range(40)]
print(f"FAULTS {statistics.mean(faults)} {statistics.median(faults)}")
