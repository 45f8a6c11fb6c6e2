#!/usr/bin/env python
"""Is this tree slower than an earlier one? The same ``hvdtrain train`` command from both trees,
launched alternately in one run of this script, compared by the median of their throughputs.

Separate launches on a shared machine drift by tens of percent within minutes; alternating the
two trees launch by launch (the order flips every round) lets the drift hit both alike. The
earlier tree is checked out with ``git worktree`` into a temporary folder and imported through
PYTHONPATH; both run in this venv, with its torch and Horovod.

    python scripts/bench_ab_trees.py [--base REV] [--rounds 6] [--np 2] [--mode sync]
                                     [--train-args "--epochs 12 --straggler 3x"]

Prints each launch's samples per second (epoch lines after the first, which warms up), then the
ratio of the medians, this tree over the base: 1.0 is no change; below 1, this tree is slower.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from launching import launch_env, run  # noqa: E402

TREE = HERE.parent


def throughput(tree: Path, np: int, train_args: list[str], run_dir: Path) -> float:
    """Samples per second of training time over the epochs after the first."""
    command = ["mpirun", "-np", str(np), "--oversubscribe", "--bind-to", "none", "-x",
               "PYTHONPATH", sys.executable, "-m", "hvdtrain", "train", "--no-progress",
               "--run-dir", str(run_dir), *train_args]
    # run in the tree: ``python -m`` puts the working folder ahead of PYTHONPATH on sys.path
    run(command, env=launch_env(tree), cwd=tree)
    epochs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    epochs = [e for e in epochs if e["type"] == "epoch"][1:]
    if not epochs:
        raise SystemExit("give --train-args at least 2 epochs: the first one warms up")
    return sum(e["samples"] for e in epochs) / sum(e["epoch_seconds"] for e in epochs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="HEAD", help="the earlier tree: a git revision")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--train-args", default="--epochs 12",
                        help="hvdtrain train's arguments, the same for both trees")
    args = parser.parse_args()
    train_args = shlex.split(args.train_args)
    with tempfile.TemporaryDirectory() as scratch:
        base = Path(scratch) / "base"
        subprocess.run(["git", "-C", str(TREE), "worktree", "add", "--detach", "-q", str(base),
                        args.base], check=True)
        try:
            rates: dict[str, list[float]] = {"base": [], "this": []}
            for r in range(args.rounds):
                order = [("base", base), ("this", TREE)][::1 if r % 2 == 0 else -1]
                for name, tree in order:
                    rate = throughput(tree, args.np, train_args, Path(scratch) / f"{name}{r}")
                    rates[name].append(rate)
                    print(f"round {r + 1} {name}: {rate:,.0f} samples/s", flush=True)
        finally:
            subprocess.run(["git", "-C", str(TREE), "worktree", "remove", "--force", str(base)],
                           check=False)
    ratio = statistics.median(rates["this"]) / statistics.median(rates["base"])
    spread = [t / b for t, b in zip(rates["this"], rates["base"])]
    print(f"this tree / {args.base}: {ratio:.3f} (median of {args.rounds} rounds; "
          f"round by round {min(spread):.2f} to {max(spread):.2f})")


if __name__ == "__main__":
    main()
