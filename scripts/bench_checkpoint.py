#!/usr/bin/env python
"""Benchmark the step-time stall of a checkpoint: written at once (today's default) against
--async-checkpoint (a copy in CPU memory, written by a background thread).

One process trains an MLP (784-2048-2048-2048-10 by default, Adam: about 42 MB of parameters
and 84 MB of optimizer state, 126 MB in all) and saves a checkpoint every --every steps through
hvdtrain's own Checkpointer, the object the training loop calls. Blocks of --steps steps run in
turn, interleaved so that a slow minute of a shared machine hits every contender alike:

  none    no checkpoint: the baseline step time
  sync    Checkpointer.save writes at once (torch.save, fsync, rename, fsync of the folder)
  async   Checkpointer.save with --async-checkpoint

Two figures per contender, medians over the blocks:

  stall     how long the step that saves is held up: the save call itself, what the training
            thread waits for (for async: the copy, and any wait for the write before it)
  overhead  (block time - the same round's baseline block time) / checkpoints in the block:
            what a checkpoint costs the run in all, including the slower steps while a
            background write competes for the cores and memory bandwidth (and the wait for the
            last write at the end of the block, as a run's end waits for it)

The ratio async / sync of each is printed; issue 27 asks for a stall ratio of at most 1/5.
Each block builds its own Checkpointer, so the first async save of a block also allocates the
copy's buffers (in a run, only the run's first save does): the spread's high end.

    python scripts/bench_checkpoint.py [--rounds 3] [--steps 24] [--every 8] [--hidden 2048,...]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from hvdtrain.config import Config  # noqa: E402
from hvdtrain.loop.checkpointer import Checkpointer  # noqa: E402
from hvdtrain.scheme import Progress  # noqa: E402

CONTENDERS = ("none", "sync", "async")


class OneProcess:
    """The part of an update scheme that Checkpointer.save calls: worker 0 of 1, its state."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer):
        self.model, self.optimizer = model, optimizer

    def workers(self) -> tuple[int, int]:
        return 0, 1

    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}


def build(hidden: list[int], batch: int):
    torch.manual_seed(0)
    sizes = [784, *hidden, 10]
    layers: list[torch.nn.Module] = []
    for a, b in zip(sizes, sizes[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers[:-1])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    x, y = torch.randn(batch, 784), torch.randint(0, 10, (batch,))
    return model, optimizer, x, y


def state_megabytes(model, optimizer) -> float:
    tensors = [*model.state_dict().values(),
               *(t for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t))]
    return sum(t.numel() * t.element_size() for t in tensors) / 1e6


def train_step(model, optimizer, x, y) -> None:
    optimizer.zero_grad(set_to_none=True)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()


def block(contender: str, setup, folder: Path, steps: int, every: int) -> tuple[float, list]:
    """(the block's seconds, each save call's seconds) for one contender."""
    model, optimizer, x, y = setup
    cfg = Config.from_overrides({"async_checkpoint": contender == "async",
                                 "run_dir": str(folder)})
    saver = Checkpointer(cfg, OneProcess(model, optimizer), folder, dict, model.state_dict)
    stalls = []
    started = time.perf_counter()
    for step in range(1, steps + 1):
        train_step(model, optimizer, x, y)
        if contender != "none" and step % every == every // 2:  # mid-block: writes overlap steps
            t = time.perf_counter()
            saver.save(Progress(0, step, step, 1))
            stalls.append(time.perf_counter() - t)
    saver.finish_writes()
    return time.perf_counter() - started, stalls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=24, help="steps per block")
    parser.add_argument("--every", type=int, default=8, help="a checkpoint every N steps")
    parser.add_argument("--hidden", default="2048,2048,2048")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (shared machines)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    setup = build([int(h) for h in args.hidden.split(",")], args.batch)
    for _ in range(3):  # warm-up, and Adam's state exists before it is measured
        train_step(*setup)
    print(f"state: {state_megabytes(*setup[:2]):.0f} MB (parameters + Adam state); "
          f"{args.steps} steps a block, a checkpoint every {args.every}, {args.rounds} rounds, "
          f"torch threads {args.threads}", flush=True)
    times = {c: [] for c in CONTENDERS}
    stalls = {c: [] for c in CONTENDERS}
    with tempfile.TemporaryDirectory(dir=".") as tmp:
        for r in range(args.rounds):
            for contender in CONTENDERS:
                seconds, saved = block(contender, setup, Path(tmp) / contender, args.steps,
                                       args.every)
                times[contender].append(seconds)
                stalls[contender] += saved
                print(f"round {r + 1} {contender:5s}: block {seconds:.2f} s, save calls "
                      f"{' '.join(f'{s * 1000:.0f}' for s in saved) or '-'} ms", flush=True)
    report(times, stalls, args.steps // args.every)


def report(times: dict, stalls: dict, saves: int) -> None:
    base = statistics.median(times["none"])
    print(f"\nbaseline block (no checkpoint): median {base:.2f} s "
          f"(spread {min(times['none']):.2f}-{max(times['none']):.2f})")
    figures = {}
    for contender in ("sync", "async"):
        stall = statistics.median(stalls[contender])
        # paired with the baseline block of the same round: the load of a shared machine drifts
        overhead = statistics.median((t - b) / saves
                                     for t, b in zip(times[contender], times["none"]))
        figures[contender] = (stall, overhead)
        print(f"{contender:5s}: stall per checkpoint median {stall * 1000:.0f} ms (spread "
              f"{min(stalls[contender]) * 1000:.0f}-{max(stalls[contender]) * 1000:.0f}), "
              f"overhead per checkpoint {overhead * 1000:.0f} ms")
    print(f"async / sync: stall {figures['async'][0] / figures['sync'][0]:.3f}, overhead "
          f"{figures['async'][1] / figures['sync'][1]:.3f}")


if __name__ == "__main__":
    main()
