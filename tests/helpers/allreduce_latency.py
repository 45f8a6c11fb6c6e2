"""Median time of an allreduce and of a grouped allreduce, on rank 0, printed as
``LATENCY {json}``; run under horovodrun or mpirun with HOROVOD_CYCLE_TIME set
(tests/multiproc/test_horovod_wake_multiproc.py)."""

import json
import statistics
import time

import torch

import horovod.torch as hvd

hvd.init()
a, b = torch.ones(1000), torch.ones(10)
hvd.allreduce_(a, name="warm")  # both ranks past start-up before anything is timed


def median_ms(collective, repeats: int = 15) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        collective()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


single = median_ms(lambda: hvd.allreduce_(a, name="single"))
grouped = median_ms(lambda: hvd.grouped_allreduce_([a, b], name="grouped"))
if hvd.rank() == 0:
    print("LATENCY " + json.dumps({"single_ms": single, "grouped_ms": grouped}), flush=True)
