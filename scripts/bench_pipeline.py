#!/usr/bin/env python
"""Benchmark the layer-split pipeline on CPU: pipelined schedules against the naive split.

One process, a model split into 2 stages, one thread per stage (torch intra-op threads = 1, so
each stage computes on one core). Contenders, measured in the same run in alternating blocks so
that the machine's noise hits them alike:

- naive split: ``--schedule sequential --micro-batches 1`` - stage 2 starts when stage 1 is done;
- GPipe and 1F1B with M micro-batches, the stages in their own threads.

Ratios are samples/s against the naive split (median of the per-block ratios). The measured
bubble (1 - busy / (stages x wall)) is printed beside GPipe's (K-1)/(M+K-1). For context, the
unsplit model with torch's intra-op parallelism over all cores is measured too.

    python scripts/bench_pipeline.py [--blocks 6] [--steps 8] [--batch 1024] [--micro 2,4,8]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
import torch.nn as nn

from hvdtrain.config import ModelConfig, PipelineConfig
from hvdtrain.models import build_model
from hvdtrain.pipeline import PipelineReplica, gpipe_bubble
from hvdtrain.replica import Replica


def contenders(model: nn.Module, micro: list[int]) -> dict[str, Replica]:
    def split(schedule: str, m: int) -> PipelineReplica:
        return PipelineReplica(copy.deepcopy(model), ["cpu", "cpu"],
                               PipelineConfig(stages=2, micro_batches=m, schedule=schedule))

    out: dict[str, Replica] = {"naive split (sequential, M=1)": split("sequential", 1)}
    for m in micro:
        out[f"gpipe M={m}"] = split("gpipe", m)
    out[f"1f1b M={max(micro)}"] = split("1f1b", max(micro))
    return out


def timed_block(replica: Replica, x: torch.Tensor, y: torch.Tensor, steps: int,
                threads: int) -> float:
    torch.set_num_threads(threads)
    replica.take_epoch_metrics()
    t0 = time.perf_counter()
    for _ in range(steps):
        for p in replica.parameters():
            p.grad = None
        replica.forward_backward(x, y, 1.0)
    return steps * len(y) / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--blocks", type=int, default=6)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--micro", default="2,4,8")
    args = parser.parse_args()
    micro = [int(m) for m in args.micro.split(",")]

    torch.manual_seed(0)
    cfg = ModelConfig(hidden=(args.width,) * 4)
    model = build_model("mlp", (args.width,), 10, cfg)
    x, y = torch.randn(args.batch, args.width), torch.randint(0, 10, (args.batch,))
    replicas = contenders(model, micro)
    cores = torch.get_num_threads()
    replicas[f"unsplit, {cores} intra-op threads (context)"] = Replica(copy.deepcopy(model),
                                                                       torch.device("cpu"))
    threads = {name: (cores if name.startswith("unsplit") else 1) for name in replicas}

    for name, r in replicas.items():  # warm-up: first-call allocations and thread start
        timed_block(r, x, y, 3, threads[name])
    rates: dict[str, list[float]] = {name: [] for name in replicas}
    bubbles: dict[str, list[float]] = {name: [] for name in replicas}
    names = list(replicas)
    for block in range(args.blocks):
        order = names if block % 2 == 0 else names[::-1]
        for name in order:
            rates[name].append(timed_block(replicas[name], x, y, args.steps, threads[name]))
            metrics = replicas[name].take_epoch_metrics().get("pipeline")
            if metrics:
                bubbles[name].append(metrics["bubble_fraction"])
        print(f"block {block + 1}/{args.blocks}: " + ", ".join(
            f"{n.split(' (')[0]} {rates[n][-1]:,.0f}" for n in names), flush=True)

    base = names[0]
    print(f"\nMLP {args.width}x4 hidden ({sum(p.numel() for p in model.parameters()):,} "
          f"parameters), batch {args.batch}, 2 CPU stages, one thread each; "
          f"{args.blocks} blocks of {args.steps} steps")
    print("| contender | samples/s (median) | ratio to naive split (median of blocks) | "
          "bubble measured | GPipe formula (K-1)/(M+K-1) |")
    print("|---|---|---|---|---|")
    for name in names:
        ratio = statistics.median(a / b for a, b in zip(rates[name], rates[base]))
        m = replicas[name].micro_batches if isinstance(replicas[name], PipelineReplica) else None
        bubble = f"{statistics.median(bubbles[name]):.2f}" if bubbles[name] else "-"
        formula = f"{gpipe_bubble(2, m):.2f}" if m else "-"
        print(f"| {name} | {statistics.median(rates[name]):,.0f} | {ratio:.2f} | {bubble} | "
              f"{formula} |")


if __name__ == "__main__":
    main()
