#!/usr/bin/env python
"""Benchmark --precision bf16 against float32 on CPUs, in sync and in async mode.

Every figure is a ratio against float32 measured in the same run of this script:

  sync    ``mpirun -np W hvdtrain train`` (Horovod), W workers
  async   ``mpirun -np W+1 hvdtrain train --mode async``, W workers and 1 parameter server

Each round runs every mode once in float32 and once in bf16, in that order (fp32, bf16, fp32,
bf16...), so a slow minute on a shared machine hits both alike. A run's rate is the mean
samples/s (all workers added up) of its epochs after the first, which is warm-up; the table
gives each contender's median over the rounds, its spread, and bf16 / fp32 of the medians.

The model is a synthetic-data MLP 1024-1024-1024-10 (~2.1M parameters), batch 64 per worker:
big enough that the matrix products, which bf16 autocast changes, take most of a step.

bf16 is fast only where the CPU computes it natively (AVX512_BF16, AMX); elsewhere torch
has no fast bf16 kernel and bf16 can be much slower than float32. The script prints which of
those instruction sets this CPU has, and one product (64x1024 by 1024x1024, one thread) timed in
each dtype, to tell the kernels apart from the rest of the step.

    python scripts/bench_precision.py [--rounds 3] [--workers 2] [--hvdtrain-flags "..."]
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from hvdtrain.run_output import read_jsonl  # noqa: E402
from launching import BIN, run  # noqa: E402

MODES = ("sync", "async")
PRECISIONS = ("32", "bf16")
BF16_FLAGS = ("avx512_bf16", "amx_bf16", "amx_tile")


def cpu_bf16_flags() -> list[str]:
    """Which native bf16 instruction sets /proc/cpuinfo lists (empty: none, or not Linux)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines()
                  if line.startswith("flags")), [])
    return [f for f in BF16_FLAGS if f in flags]


def matmul_gflops(dtype: torch.dtype, repeats: int = 10) -> float:
    """One thread's rate on one layer's product at the benchmark's sizes."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a, b = torch.randn(64, 1024, dtype=dtype), torch.randn(1024, 1024, dtype=dtype)
        a @ b  # the first call picks and prepares the kernel
        start = time.perf_counter()
        for _ in range(repeats):
            a @ b
        seconds = (time.perf_counter() - start) / repeats
    finally:
        torch.set_num_threads(threads)
    return 2 * 64 * 1024 * 1024 / seconds / 1e9


def later_epochs_rate(records: list[dict]) -> float:
    """Mean samples/s of the epoch lines after the first (the first pays for start-up)."""
    rates = [r["samples_per_sec"] for r in records if r.get("type") == "epoch"][1:]
    if not rates:
        raise SystemExit("the run logged fewer than two epochs: raise --epochs")
    return statistics.fmean(rates)


def training_rate(mode: str, precision: str, args: argparse.Namespace) -> float:
    np = args.workers + (1 if mode == "async" else 0)
    with tempfile.TemporaryDirectory() as run_dir:
        cmd = ["mpirun", "-np", str(np), "--oversubscribe", "--bind-to", "none",
               str(BIN / "hvdtrain"), "train", "--mode", mode, "--precision", precision,
               "--dataset", "synthetic", "--synthetic-shape", "1024",
               "--synthetic-samples", "16384", "--hidden", "1024,1024",
               "--batch-size", str(args.batch_size), "--epochs", str(args.epochs),
               "--max-steps-per-epoch", str(args.steps), "--eval-every", str(args.epochs),
               "--checkpoint-every", "0", "--no-progress", "--run-dir", run_dir,
               *shlex.split(args.hvdtrain_flags)]
        run(cmd, timeout=args.run_timeout)
        return later_epochs_rate(read_jsonl(Path(run_dir) / "metrics.jsonl"))


def table(samples: dict[tuple[str, str], list[float]], workers: int) -> str:
    """The markdown table: medians (min-max) per mode and precision, and bf16 / fp32."""
    med = {key: statistics.median(v) for key, v in samples.items()}
    lines = ["| mode | fp32 samples/s (min-max) | bf16 samples/s (min-max) | bf16 / fp32 |",
             "|---|---|---|---|"]
    for mode in MODES:
        if (mode, "32") not in samples:
            continue
        cells = [f"{med[(mode, p)]:,.0f} ({min(samples[(mode, p)]):,.0f}-"
                 f"{max(samples[(mode, p)]):,.0f})" for p in PRECISIONS]
        name = (f"sync, {workers} workers" if mode == "sync"
                else f"async, {workers} workers + 1 server")
        lines.append(f"| {name} | {cells[0]} | {cells[1]} | "
                     f"{med[(mode, 'bf16')] / med[(mode, '32')]:.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved repetitions; medians")
    parser.add_argument("--workers", type=int, default=2, help="training processes per run")
    parser.add_argument("--modes", default="sync,async", help="which of sync,async to measure")
    parser.add_argument("--batch-size", type=int, default=64, help="per worker")
    parser.add_argument("--epochs", type=int, default=3, help="per run; the first is warm-up")
    parser.add_argument("--steps", type=int, default=20, help="steps per epoch")
    parser.add_argument("--hvdtrain-flags", default="", help="extra flags for hvdtrain train")
    parser.add_argument("--run-timeout", type=int, default=600, help="seconds per run")
    args = parser.parse_args()
    modes = [m for m in MODES if m in args.modes.split(",")]
    if not modes or args.epochs < 2:
        parser.error("--modes needs sync and/or async, and --epochs at least 2")

    flags = cpu_bf16_flags()
    print(f"native bf16 instructions on this CPU: {', '.join(flags) or 'none'} "
          f"(looked for {', '.join(BF16_FLAGS)}); {os.cpu_count()} cores", flush=True)
    print(f"one 64x1024 @ 1024x1024 product, one thread: fp32 {matmul_gflops(torch.float32):.1f} "
          f"GFLOP/s, bf16 {matmul_gflops(torch.bfloat16):.1f} GFLOP/s", flush=True)
    samples: dict[tuple[str, str], list[float]] = {}
    ratios: dict[str, list[float]] = {m: [] for m in modes}
    for round_ in range(args.rounds):
        for mode in modes:
            for precision in PRECISIONS:
                rate = training_rate(mode, precision, args)
                samples.setdefault((mode, precision), []).append(rate)
                print(f"round {round_ + 1}/{args.rounds} {mode:<5} {precision:>4}: "
                      f"{rate:10,.0f} samples/s", flush=True)
            ratios[mode].append(samples[(mode, "bf16")][-1] / samples[(mode, "32")][-1])

    print(f"\nmodel: MLP 1024-1024-1024-10 (~2.1M params), synthetic data; batch "
          f"{args.batch_size} per worker; {args.steps} steps per epoch, epochs 2-{args.epochs} "
          f"timed; medians of {args.rounds} rounds\n")
    print(table(samples, args.workers))
    for mode in modes:
        print(f"\n{mode}: bf16 / fp32 per round: " + ", ".join(f"{r:.2f}" for r in ratios[mode]))


if __name__ == "__main__":
    main()
