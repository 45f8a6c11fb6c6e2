#!/usr/bin/env python
"""Benchmark hvdtrain's sync training step against the loops a user would otherwise write.

All figures come from one run of this script and are reported as ratios:

  floor   hvdtrain / a hand-written Horovod loop with the same Horovod settings and threads,
          measured A/B inside one job (scripts/bench/ab_same_settings.py), because separate
          launches on a shared machine vary more than the difference being measured
  goal    ``hvdtrain train`` with its defaults, against ``hvdtrain train --collective torch``
          (the same loop over torch.distributed), the hand-written loop with Horovod's and
          torch's own defaults, and PyTorch DDP over Gloo (torchrun), each a separate launch,
          in interleaved rounds; medians
  scaling the np=2 throughput divided by twice the np=1 throughput, for each
  compile ``hvdtrain train --compile`` / ``hvdtrain train``, each a separate launch, in
          interleaved rounds (the order alternates from round to round); ratio of the medians

The model is a synthetic-data MLP 1024-1024-1024-10 (~2.1M parameters), batch 64 per process.
A goal launch that fails is printed with its output and its round left out of the medians (the
table says how many rounds ran); the script then exits 1 after the tables.

    python scripts/bench_sync.py [--launcher mpi|gloo] [--rounds 3] [--hvdtrain-flags "..."]
                                 [--sections goal,floor,compile]
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
sys.path.insert(0, str(HERE.parent))
from hvdtrain.config import SyncConfig  # noqa: E402
from hvdtrain.runtime import horovod_environment, horovod_wakes_on_enqueue  # noqa: E402
from launching import BIN, run  # noqa: E402

MODEL = dict(features=1024, hidden="1024,1024", classes=10)


def launch(np: int, launcher: str, command: list[str]) -> list[str]:
    if launcher == "mpi":
        return ["mpirun", "-np", str(np), "--oversubscribe", *command]
    return [str(BIN / "horovodrun"), "-np", str(np), "--gloo", *command]


def bench_line(output: str) -> float:
    for line in output.splitlines():
        if "BENCH " in line:
            return json.loads(line.split("BENCH ", 1)[1])["samples_per_sec"]
    raise SystemExit(f"no BENCH line in output:\n{output[-3000:]}")


def loop_args(args: argparse.Namespace) -> list[str]:
    return ["--features", str(MODEL["features"]), "--hidden", MODEL["hidden"],
            "--classes", str(MODEL["classes"]), "--batch-size", str(args.batch_size),
            "--steps", str(args.steps)]


def measure_hvdtrain(np: int, args: argparse.Namespace, extra: tuple[str, ...] = (),
                     drop_last: bool = False) -> float:
    """Median samples/s of the epochs after the first (warmup; with --compile, compiling).
    ``drop_last``: run one more epoch and leave it out too, since the last epoch's time holds
    the final evaluation (with --compile, the compile of the eval-mode graph as well)."""
    # --steps timed steps, in epochs of at most 50 (the first epoch, warmup, is not timed):
    # 150 is 3 x 50, 20 one epoch of 20, 70 two of 35 (was at least 50, and a multiple of 50)
    timed_epochs = -(-args.steps // 50)
    steps_per_epoch = -(-args.steps // timed_epochs)
    epochs = 1 + timed_epochs + drop_last
    with tempfile.TemporaryDirectory() as run_dir:
        cmd = [str(BIN / "hvdtrain"), "train", "--dataset", "synthetic",
               "--synthetic-shape", str(MODEL["features"]), "--synthetic-samples", "16384",
               "--synthetic-classes", str(MODEL["classes"]), "--hidden", MODEL["hidden"],
               "--batch-size", str(args.batch_size), "--epochs", str(epochs),
               "--max-steps-per-epoch", str(steps_per_epoch), "--lr", "0.01",
               "--eval-every", str(epochs), "--checkpoint-every", "0", "--no-progress",
               "--run-dir", run_dir, *shlex.split(args.hvdtrain_flags), *extra]
        run(launch(np, args.launcher, cmd))
        with open(Path(run_dir) / "metrics.jsonl") as f:
            epochs_seen = [json.loads(line) for line in f if '"epoch"' in line]
    rates = [e["samples_per_sec"] for e in epochs_seen if e["type"] == "epoch"][1:]
    return statistics.median(rates[:-1] if drop_last else rates)


def measure_hvdtrain_torch(np: int, args: argparse.Namespace) -> float:
    """hvdtrain over torch.distributed instead of Horovod: the same loop and engine, the other
    collective backend (sync/torch_collective.py), under the same launcher."""
    return measure_hvdtrain(np, args, ("--collective", "torch"))


def goal_contenders() -> dict:
    """The goal section's launches, by name; the first is what the ratios divide."""
    return {
        "hvdtrain": measure_hvdtrain,
        "hvdtrain --collective torch": measure_hvdtrain_torch,
        "plain Horovod loop, defaults": measure_plain,
        "DDP over Gloo": measure_ddp,
    }


# The compile section: the same hvdtrain launch with and without the flag.
COMPILE_AB = {"hvdtrain": (), "hvdtrain --compile": ("--compile",)}
SECTIONS = ("goal", "floor", "compile")


def measure_plain(np: int, args: argparse.Namespace) -> float:
    """The hand-written loop with Horovod's and torch's defaults."""
    cmd = [sys.executable, str(HERE / "bench" / "plain_horovod_loop.py"), *loop_args(args)]
    return bench_line(run(launch(np, args.launcher, cmd)))


def measure_ab(np: int, args: argparse.Namespace) -> list[float]:
    """hvdtrain / plain loop with hvdtrain's settings, A/B within one job: per-block ratios."""
    cmd = [sys.executable, str(HERE / "bench" / "ab_same_settings.py"), str(args.ab_blocks)]
    out = run(launch(np, args.launcher, cmd))
    for line in out.splitlines():
        if "AB " in line:
            return json.loads(line.split("AB ", 1)[1])["ratios"]
    raise SystemExit(f"no AB line in output:\n{out[-3000:]}")


def measure_ddp(np: int, args: argparse.Namespace) -> float:
    cmd = [str(BIN / "torchrun"), "--standalone", f"--nproc_per_node={np}",
           str(HERE / "bench" / "ddp_loop.py"), *loop_args(args)]
    return bench_line(run(cmd))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--launcher", choices=("gloo", "mpi"), default="gloo",
                        help="horovodrun --gloo or mpirun, for hvdtrain and the plain loop alike")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved repetitions; medians")
    parser.add_argument("--steps", type=int, default=150, help="timed steps per measurement")
    parser.add_argument("--batch-size", type=int, default=64, help="per process")
    parser.add_argument("--nps", default="1,2", help="process counts to measure")
    parser.add_argument("--hvdtrain-flags", default="", help="extra flags for hvdtrain train")
    parser.add_argument("--ab-blocks", type=int, default=20,
                        help="alternating 50-step blocks in the A/B job")
    parser.add_argument("--sections", default=",".join(SECTIONS),
                        help="what to measure, of: goal (hvdtrain over Horovod and over "
                             "torch.distributed, the plain loop and DDP), "
                             "floor (the A/B job), compile (hvdtrain with and without --compile)")
    args = parser.parse_args()
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown or not sections:
        parser.error(f"--sections {args.sections}: choose from {', '.join(SECTIONS)}")

    contenders = goal_contenders() if "goal" in sections else {}
    nps = [int(n) for n in args.nps.split(",")]
    samples: dict[tuple[str, int], list[float]] = {}
    compiled: dict[tuple[str, int], list[float]] = {}
    ab: dict[int, list[float]] = {}
    for round_ in range(args.rounds):
        for np in nps:
            for name, measure in contenders.items():
                rate = attempt(measure, np, args)
                samples.setdefault((name, np), [])
                if rate is None:
                    continue
                samples[(name, np)].append(rate)
                print(f"round {round_ + 1}/{args.rounds} np={np} {name:<30} {rate:10.0f} samples/s",
                      flush=True)
            if "compile" in sections:
                # Alternate which goes first, so a machine that drifts within a round favours
                # neither.
                order = list(COMPILE_AB) if round_ % 2 == 0 else list(reversed(COMPILE_AB))
                for name in order:
                    rate = measure_hvdtrain(np, args, COMPILE_AB[name], drop_last=True)
                    compiled.setdefault((name, np), []).append(rate)
                    print(f"round {round_ + 1}/{args.rounds} np={np} {name:<30} {rate:10.0f} "
                          "samples/s (compile A/B)", flush=True)
                eager, fast = (compiled[(name, np)][-1] for name in COMPILE_AB)
                print(f"round {round_ + 1}/{args.rounds} np={np} compiled / eager: "
                      f"{fast / eager:.3f}", flush=True)
    for np in nps if "floor" in sections else []:
        ab[np] = measure_ab(np, args)
        print(f"A/B np={np}: hvdtrain / plain with the same settings, per block: "
              + ", ".join(f"{r:.3f}" for r in ab[np]), flush=True)
    median = {key: statistics.median(v) for key, v in samples.items() if v}

    print(f"\nlauncher: {args.launcher}; model: MLP {MODEL['features']}-{MODEL['hidden']}-"
          f"{MODEL['classes']} (~2.1M params); batch {args.batch_size} per process; "
          f"{args.rounds} rounds; hvdtrain's Horovod settings: "
          f"{horovod_environment(SyncConfig(), horovod_wakes_on_enqueue())}, "
          "torch threads per process = cores / processes")
    both = {1, 2} <= set(nps)
    if contenders:
        print("\n| contender | " + " | ".join(f"np={n} samples/s (min-max)" for n in nps) +
              (" | scaling efficiency np=2 |" if both else " |"))
        print("|---" * (len(nps) + 1 + both) + "|")
        for name in contenders:
            row = f"| {name} | " + " | ".join(
                rate_cell(samples[(name, n)], args.rounds) for n in nps)
            if both:
                row += f" | {ratio(median, (name, 2), (name, 1), times=2, digits=2)}"
            print(row + " |")
    if contenders or ab:
        print("\n| ratio | " + " | ".join(f"np={n}" for n in nps) + " |")
        print("|---" * (len(nps) + 1) + "|")
    if ab:
        print("| floor: hvdtrain / plain loop, same settings (A/B in one job, median of blocks) | "
              + " | ".join(f"{statistics.median(ab[n]):.3f}" for n in nps) + " |")
    for name in list(contenders)[1:]:
        print(f"| goal: hvdtrain / {name} (separate launches, medians) | " +
              " | ".join(ratio(median, ("hvdtrain", n), (name, n)) for n in nps) + " |")
    if compiled:
        print_compile_table(compiled, nps, args.steps)
    failed = sum(args.rounds - len(rates) for rates in samples.values())
    if failed:
        raise SystemExit(f"{failed} launch(es) failed (output above); the tables leave their "
                         "rounds out")


def attempt(measure, np: int, args: argparse.Namespace) -> float | None:
    """The measurement, or None after saying why it failed: a launch that crashes (torch's Gloo
    aborted one DDP job in stop 39) loses its round, not the rounds measured before it."""
    try:
        return measure(np, args)
    except (SystemExit, subprocess.TimeoutExpired) as e:  # launching.run: failed, timed out
        print(f"np={np}: a launch failed; its round is left out of the medians:\n{e}", flush=True)
        return None


def rate_cell(rates: list[float], rounds: int) -> str:
    """"median (min-max)" of the rounds that ran, saying how many did where some failed."""
    if not rates:
        return "failed"
    cell = f"{statistics.median(rates):,.0f} ({min(rates):,.0f}-{max(rates):,.0f})"
    return cell if len(rates) == rounds else f"{cell}, {len(rates)} of {rounds} rounds"


def ratio(median: dict, top: tuple[str, int], bottom: tuple[str, int], times: int = 1,
          digits: int = 3) -> str:
    """median[top] / (times x median[bottom]) to ``digits`` decimals, or "-" where either never
    ran."""
    if top not in median or bottom not in median:
        return "-"
    return f"{median[top] / (times * median[bottom]):.{digits}f}"


def print_compile_table(compiled: dict[tuple[str, int], list[float]], nps: list[int],
                        steps: int) -> None:
    eager, fast = COMPILE_AB
    middle = {key: statistics.median(v) for key, v in compiled.items()}
    print(f"\n| --compile A/B: separate launches, {steps} timed steps each | "
          + " | ".join(f"np={n} samples/s (min-max)" for n in nps) + " |")
    print("|---" * (len(nps) + 1) + "|")
    for name in COMPILE_AB:
        print(f"| {name} | " + " | ".join(
            f"{middle[(name, n)]:,.0f} ({min(compiled[(name, n)]):,.0f}-"
            f"{max(compiled[(name, n)]):,.0f})" for n in nps) + " |")
    print("| ratio compiled / eager (medians) | "
          + " | ".join(f"{middle[(fast, n)] / middle[(eager, n)]:.3f}" for n in nps) + " |")


if __name__ == "__main__":
    main()
