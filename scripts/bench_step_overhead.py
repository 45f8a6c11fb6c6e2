#!/usr/bin/env python
"""What hvdtrain's loop costs per step beyond the step itself, at a tiny step (issue 27).

At a step of about a millisecond (an MLP 784-64-64-10, batch 32 per process, 2 processes under
``mpirun``) whatever the trainer does per step in Python decides the throughput, as it does on a
GPU. This runs hvdtrain's sync loop (Trainer._train_epoch, one block of steps as an epoch) and
the hand-written Horovod loop of scripts/bench/common.py in the same job, alternating blocks
(A B A B ..., which goes first alternates too), so that the machine's drift hits both alike;
separate launches on a shared machine differ by more than the gap being measured. Each block is
timed from outside, the same way for both.

    python scripts/bench_step_overhead.py [--blocks 12] [--steps 200] [--profile]

prints samples/s medians and spread of both and the ratio hvdtrain / hand loop (per pair of
blocks, then the median); with --profile, rank 0's cProfile of hvdtrain's blocks, top functions
by own time, in microseconds per step; with --count-ops, the torch operators each loop
dispatches per step and those whose counts differ (on a GPU, kernel launches).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHAPE = dict(features=784, hidden="64,64", classes=10, batch=32)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--blocks", type=int, default=12, help="blocks of each loop, alternating")
    parser.add_argument("--steps", type=int, default=200, help="steps per block")
    parser.add_argument("--np", type=int, default=2, help="processes under mpirun")
    parser.add_argument("--profile", action="store_true",
                        help="cProfile rank 0's hvdtrain blocks; print the top functions")
    parser.add_argument("--count-ops", action="store_true",
                        help="count the torch operators each loop dispatches per step (rank 0) "
                             "and list those whose counts differ: on a GPU each is a kernel "
                             "launch or a host-side call, where this machine times only Python")
    parser.add_argument("--hvdtrain-flags", default="", help="extra flags for hvdtrain's config")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def drive(args: argparse.Namespace) -> None:
    """Launch the job, then print its figures."""
    sys.path.insert(0, str(HERE))
    from launching import run

    cmd = ["mpirun", "-np", str(args.np), "--oversubscribe", sys.executable, __file__,
           "--worker", "--blocks", str(args.blocks), "--steps", str(args.steps),
           "--hvdtrain-flags", args.hvdtrain_flags, *(["--profile"] if args.profile else []),
           *(["--count-ops"] if args.count_ops else [])]
    out = run(cmd, timeout=900)
    for line in out.splitlines():
        if line.startswith(("PROFILE", "OPS")):
            print(line.split(" ", 1)[1])
        elif line.startswith("OVERHEAD "):
            result = json.loads(line[len("OVERHEAD "):])
            print(summary(result))


def summary(result: dict) -> str:
    ours, theirs, ratios = result["hvdtrain"], result["hand"], result["ratios"]
    cpu = result["cpu_us_per_step"]
    profiled = " (hvdtrain's profiled: cProfile adds to it)" if result["profiled"] else ""
    spread = lambda v: f"{min(v):,.0f}-{max(v):,.0f}"  # noqa: E731
    return (f"np={result['world_size']}, {result['blocks']} blocks of {result['steps']} steps "
            f"each, MLP {result['shape']}\n"
            f"  hvdtrain sync  median {statistics.median(ours):,.0f} samples/s "
            f"(blocks {spread(ours)})\n"
            f"  hand Horovod   median {statistics.median(theirs):,.0f} samples/s "
            f"(blocks {spread(theirs)})\n"
            f"  ratio hvdtrain / hand: median of pairs {statistics.median(ratios):.3f} "
            f"(pairs {min(ratios):.3f}-{max(ratios):.3f}); of medians "
            f"{statistics.median(ours) / statistics.median(theirs):.3f}\n"
            f"  main thread's CPU per step (rank 0): hvdtrain {cpu['hvdtrain']:.0f} us, hand "
            f"{cpu['hand']:.0f} us{profiled}")


def work(args: argparse.Namespace) -> None:
    """One rank of the job: both loops, alternating blocks."""
    import shlex
    import tempfile
    import time

    import torch

    import horovod.torch as hvd

    sys.path.insert(0, str(HERE / "bench"))
    from common import plain_horovod_block
    from hvdtrain import launch
    from hvdtrain.cli import build_parser, config_from_args
    from hvdtrain.models import build_model
    from hvdtrain.scheme import Progress
    from hvdtrain.workload import workload_from_config

    s, steps = SHAPE, args.steps
    with tempfile.TemporaryDirectory() as run_dir:
        cfg = config_from_args(build_parser().parse_args([
            "train", "--dataset", "synthetic", "--synthetic-shape", str(s["features"]),
            "--synthetic-samples", "16384", "--synthetic-classes", str(s["classes"]),
            "--hidden", s["hidden"], "--batch-size", str(s["batch"]),
            "--epochs", str(2 * args.blocks + 2), "--max-steps-per-epoch", str(steps),
            "--lr", "0.01", "--eval-every", "1000", "--checkpoint-every", "0", "--no-progress",
            "--run-dir", run_dir, *shlex.split(args.hvdtrain_flags)]))
        workload = workload_from_config(cfg)
        torch.manual_seed(cfg.run.seed)
        trainer = launch.prepare_sync(cfg, workload, workload.build_model())
        trainer.scheme.attach(trainer.replica)
        trainer.scheme.start(None, resuming=False)
        def hvdtrain_block(epoch: int, profiler=None) -> float:
            # global steps go on from block to block, as a run's do (the stop vote's cadence)
            trainer.progress = Progress(epoch=epoch, global_step=epoch * steps,
                                        workers=hvd.size())
            t0 = time.perf_counter()
            if profiler:
                profiler.enable()
            trainer._train_epoch()
            if profiler:
                profiler.disable()
            return steps * s["batch"] * hvd.size() / (time.perf_counter() - t0)

        # The hand loop (Horovod's pytorch_mnist example) on a second copy of the model.
        hand_block = plain_horovod_block(
            hvd, build_model("mlp", (s["features"],), s["classes"], cfg.model),
            workload.train.x, workload.train.y, s["batch"], steps, "hand")

        run_blocks(args, hvd, hvdtrain_block, hand_block)


def run_blocks(args, hvd, hvdtrain_block, hand_block) -> None:
    import cProfile
    import time

    hvdtrain_block(0)  # warm up both (the profile leaves this block out)
    hand_block()
    if args.count_ops:
        count_ops(hvd, hvdtrain_block, hand_block, args.steps)
    # On the main thread's CPU clock: on a crowded machine wall time mostly measures the others
    profiler = (cProfile.Profile(time.thread_time) if args.profile and hvd.rank() == 0
                else None)
    ours, theirs, cpu = [], [], {"hvdtrain": 0.0, "hand": 0.0}

    def timed(name, block, *more):
        t0 = time.thread_time()  # this process's main thread: the loop's own CPU
        rate = block(*more)
        cpu[name] += time.thread_time() - t0
        return rate

    for b in range(args.blocks):
        if b % 2:
            theirs.append(timed("hand", hand_block))
            ours.append(timed("hvdtrain", hvdtrain_block, b + 1, profiler))
        else:
            ours.append(timed("hvdtrain", hvdtrain_block, b + 1, profiler))
            theirs.append(timed("hand", hand_block))
    if hvd.rank() != 0:
        return
    if profiler:
        print_profile(profiler, args.blocks * args.steps)
    s = SHAPE
    print("OVERHEAD " + json.dumps({
        "world_size": hvd.size(), "profiled": args.profile, "blocks": args.blocks, "steps": args.steps,
        "shape": f"{s['features']}-{s['hidden'].replace(',', '-')}-{s['classes']}, batch "
                 f"{s['batch']} per process",
        "hvdtrain": ours, "hand": theirs, "ratios": [a / b for a, b in zip(ours, theirs)],
        "cpu_us_per_step": {k: v / (args.blocks * args.steps) * 1e6 for k, v in cpu.items()}}),
        flush=True)


def count_ops(hvd, hvdtrain_block, hand_block, steps: int) -> None:
    """Rank 0's torch operators per step in one block of each loop (a TorchDispatchMode sees
    every operator that reaches a kernel, autograd's included), and those whose counts differ
    between the loops. Both ranks run the blocks, so that the allreduces meet."""
    from collections import Counter

    from torch.utils._python_dispatch import TorchDispatchMode

    class Counting(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops[str(func.overloadpacket)] += 1
            return func(*args, **(kwargs or {}))

    counted = {}
    for name, block in (("hvdtrain", lambda: hvdtrain_block(0)), ("hand", hand_block)):
        with Counting() as mode:
            block()
        counted[name] = mode.ops
    if hvd.rank() != 0:
        return
    ours, theirs = counted["hvdtrain"], counted["hand"]
    print(f"OPS torch operators per step: hvdtrain {sum(ours.values()) / steps:.1f}, hand "
          f"{sum(theirs.values()) / steps:.1f}; those whose counts differ, per step (hvdtrain "
          f"less hand):", flush=True)
    differ = {op: ours[op] - theirs[op] for op in ours | theirs if ours[op] != theirs[op]}
    for op, n in sorted(differ.items(), key=lambda kv: -abs(kv[1])):
        print(f"OPS {n / steps:+7.2f}  {op}", flush=True)


def print_profile(profiler, steps: int, top: int = 30) -> None:
    """Top functions by own time, in microseconds per step (cProfile's own overhead inflates
    small functions: compare the lines with each other, not with the timed blocks)."""
    import pstats

    stats = pstats.Stats(profiler)
    rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:top]
    total = sum(v[2] for v in stats.stats.values())
    print(f"PROFILE rank 0, hvdtrain blocks: {total / steps * 1e6:.0f} us per step in all "
          f"(profiled, main thread's CPU time); own time per step, calls per step, cumulative, "
          f"function: hvdtrain's by cumulative, then all by own time", flush=True)
    loop = [v[3] for (f, _, n), v in stats.stats.items() if n == "_step" and "trainer" in f]
    scheme = [v[3] for (f, _, n), v in stats.stats.items() if n == "step" and
              f.endswith("collective.py")]  # sync/collective.py CollectiveSync.step
    if loop and scheme:
        print(f"PROFILE the loop around the scheme's step: {(loop[0] - scheme[0]) / steps * 1e6:.0f}"
              f" us per step (Trainer._step less the scheme's step, profiled)", flush=True)
    ours = sorted(((k, v) for k, v in stats.stats.items() if "hvdtrain" in k[0]),
                  key=lambda kv: -kv[1][3])[:top // 2]
    for (file, line, name), (_, calls, own, cumulative, _) in [*ours, *rows]:
        where = f"{Path(file).parent.name}/{Path(file).name}:{line}" if line else file
        print(f"PROFILE {own / steps * 1e6:8.1f} us {calls / steps:6.2f}x  "
              f"{cumulative / steps * 1e6:8.1f} us cum  {name}  {where}", flush=True)


if __name__ == "__main__":
    arguments = parse()
    work(arguments) if arguments.worker else drive(arguments)
