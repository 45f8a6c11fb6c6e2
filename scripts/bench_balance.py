#!/usr/bin/env python
"""--balance under a persistent straggler: throughput with and without it, in one run.

Runs ``mpirun -np 2 hvdtrain train --straggler 3x`` on digits without and with ``--balance``
(otherwise the same flags), alternating in rounds (the order flips from round to round) so the
machine's drift hits both alike. Throughput is the samples trained per second of training time
(the epoch lines' samples over their train_seconds, which leave evaluations out), counted from
epoch ``--skip + 1`` on: the first epoch runs at equal shares, as nothing is measured yet, and
the shares take a re-plan or two to settle. Prints each round's figures, the ratio of the medians
(balanced over plain), each round's ratio of the epochs' median rates (less sensitive to a burst
of load from other jobs on a shared machine), and each mode's final test accuracy, as one JSON
object.

The issue's goal (26): ratio >= 1.6 with test accuracy >= 0.95. The ceiling under a 3x straggler
with 2 workers is about 2 where compute is proportional to the samples; a step's fixed costs
(the allreduce, Python) are paid in full by every worker whatever its share.

With --within-job it runs one job instead, whose epochs alternate between equal shares and the
balanced ones (scripts/bench/balance_ab.py), and prints each balanced epoch's rate over the mean
of the plain epochs beside it: on a shared machine whose load swings from minute to minute,
adjacent epochs see nearly the same load, separate jobs do not. Beside it, the same ratio of
worker 0's median step (median compute + median wait), which a burst of load that hits a few
steps of an epoch leaves out.

    python scripts/bench_balance.py [--rounds 3] [--epochs 30] [--skip 2] [--flags "..."]
    python scripts/bench_balance.py --within-job [--epochs 40]
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from launching import BIN, launch_env, run  # noqa: E402

MODES = {"plain": [], "balanced": ["--balance"]}


def measure(args: argparse.Namespace, extra: list[str]) -> dict:
    """One job: its training throughput after the skipped epochs, its shares, its accuracy."""
    with tempfile.TemporaryDirectory() as run_dir:
        cmd = ["mpirun", "-np", "2", "--oversubscribe", "--bind-to", "none",
               str(BIN / "hvdtrain"), "train", "--dataset", "digits", "--straggler",
               args.straggler, "--epochs", str(args.epochs), "--no-progress",
               "--checkpoint-every", "0", "--run-dir", run_dir, *shlex.split(args.flags), *extra]
        run(cmd, env=launch_env(HERE.parent), timeout=600)
        with open(Path(run_dir) / "metrics.jsonl") as f:
            epochs = [r for r in map(json.loads, f) if r["type"] == "epoch"]
    counted, before = epochs[args.skip:], epochs[args.skip - 1] if args.skip else None
    seconds = counted[-1]["train_seconds"] - (before["train_seconds"] if before else 0.0)
    rates, last = [], before["train_seconds"] if before else 0.0
    for e in counted:  # per epoch: robust to a burst of load from other jobs in one epoch
        rates.append(e["samples"] / max(e["train_seconds"] - last, 1e-9))
        last = e["train_seconds"]
    return {"samples_per_sec": sum(e["samples"] for e in counted) / seconds,
            "median_epoch_rate": statistics.median(rates),
            "test_acc": epochs[-1]["test_acc"],
            "last_shares": epochs[-1].get("batch_shares")}


def within_job(args: argparse.Namespace) -> dict:
    """One job whose epochs alternate plain / balanced (scripts/bench/balance_ab.py): each
    balanced epoch's rate over the mean of the plain epochs on either side of it."""
    with tempfile.TemporaryDirectory() as run_dir:
        cmd = ["mpirun", "-np", "2", "--oversubscribe", "--bind-to", "none", sys.executable,
               str(HERE / "bench" / "balance_ab.py"), "--dataset", "digits", "--balance",
               "--straggler", args.straggler, "--epochs", str(args.epochs), "--no-progress",
               "--checkpoint-every", "0", "--run-dir", run_dir, *shlex.split(args.flags)]
        run(cmd, env=launch_env(HERE.parent), timeout=600)
        with open(Path(run_dir) / "metrics.jsonl") as f:
            epochs = [r for r in map(json.loads, f) if r["type"] == "epoch"]
    rates, last = [], 0.0
    for e in epochs:
        rates.append(e["samples"] / max(e["train_seconds"] - last, 1e-9))
        last = e["train_seconds"]
    # Epoch 2 (index 1) is the first balanced one; from index 1 + skip on, each with plain
    # epochs on both sides.
    ratios = [rates[i] / ((rates[i - 1] + rates[i + 1]) / 2)
              for i in range(1 + args.skip, len(epochs) - 1) if epochs[i]["ab"] == "balanced"]
    # Robust to bursts that hit a few steps: worker 0's median compute + median wait per step.
    step = [e["step_times"]["compute_p50"][0] + e["step_times"]["wait_p50"][0] for e in epochs]
    step_ratios = [(step[i - 1] + step[i + 1]) / 2 / step[i]
                   for i in range(1 + args.skip, len(epochs) - 1) if epochs[i]["ab"] == "balanced"]
    return {"epoch_ratios": [round(r, 3) for r in ratios],
            "median_ratio": round(statistics.median(ratios), 3),
            "median_step_ratios": [round(r, 3) for r in step_ratios],
            "median_of_median_step_ratios": round(statistics.median(step_ratios), 3),
            "balanced_shares": [e["batch_shares"] for e in epochs if e["ab"] == "balanced"][-3:],
            "test_acc": epochs[-1]["test_acc"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--skip", type=int, default=2, help="epochs left out at the start")
    parser.add_argument("--straggler", default="3x")
    parser.add_argument("--flags", default="", help="more hvdtrain train flags, for both")
    parser.add_argument("--within-job", action="store_true", help="instead, one job whose "
                        "epochs alternate plain / balanced (less noise on a shared machine)")
    args = parser.parse_args()
    if args.within_job:
        print(json.dumps(within_job(args), indent=1))
        return

    results: dict[str, list[dict]] = {mode: [] for mode in MODES}
    for r in range(args.rounds):
        order = list(MODES) if r % 2 == 0 else list(reversed(MODES))
        for mode in order:
            results[mode].append(measure(args, MODES[mode]))
        print(f"round {r + 1}: " + ", ".join(
            f"{m} {results[m][-1]['samples_per_sec']:,.0f} samples/s "
            f"(acc {results[m][-1]['test_acc']:.4f})" for m in MODES), flush=True)
    median = {m: statistics.median(x["samples_per_sec"] for x in results[m]) for m in MODES}
    print(json.dumps({
        "straggler": args.straggler, "epochs": args.epochs, "skipped_epochs": args.skip,
        "rounds": args.rounds,
        "samples_per_sec": {m: [round(x["samples_per_sec"]) for x in results[m]] for m in MODES},
        "round_ratios": [round(b["samples_per_sec"] / p["samples_per_sec"], 3)
                         for p, b in zip(results["plain"], results["balanced"])],
        "ratio_of_medians": round(median["balanced"] / median["plain"], 3),
        "median_epoch_rate_ratios": [round(b["median_epoch_rate"] / p["median_epoch_rate"], 3)
                                     for p, b in zip(results["plain"], results["balanced"])],
        "test_acc": {m: [x["test_acc"] for x in results[m]] for m in MODES},
        "balanced_last_shares": [x["last_shares"] for x in results["balanced"]],
    }, indent=1))


if __name__ == "__main__":
    main()
