#!/usr/bin/env python
"""The simulator's link model against the slow-link lab, run by run, beside a worker and alone.

Async DiLoCo (H = 4, digits, an MLP of 19k parameters: 77 KB a copy) on the lab's two namespace
hosts (hvdtrain/compare/link_lab.py), the link throttled with tc tbf to each rate, the server
either beside worker 1 (the lab's default, worker 0 across the link) or alone on its host (both
workers across its link). Each run's mean step over its epochs after the first is set against
the simulator's prediction for the same epochs (link_lab.predicted_step_seconds: the run's
compute and loop as measured, every exchange priced by the link model), and the ratio printed.

tests/multiproc/test_link_lab.py holds the model to 25% in CI for the server alone, epoch by
epoch. Beside a worker the epochs alternate between ones where worker 0 takes a round and ones
it only ends, and the simulator, which has no jitter, settles on one such pattern per run: its
prediction moves in steps as the fitted timings cross a threshold (docs/comparison.md, stop 58),
so it is measured here over repeated runs instead.

    sudo python scripts/bench_link_model.py [--repeats 3] [--rates 10,25] [--placement beside]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from hvdtrain.compare import plan as planning  # noqa: E402
from hvdtrain.compare.from_run import read_run  # noqa: E402
from hvdtrain.compare.link_lab import (SlowLinks, lab_runs, launching_into,  # noqa: E402
                                       predicted_step_seconds, unavailable_reason)
from hvdtrain.compare.runner import OUTPUT, last_lines, run_one  # noqa: E402
from hvdtrain.compare.sim.link import Link  # noqa: E402
from hvdtrain.compare.sim.timing import measure_timing  # noqa: E402

MODEL = ["--dataset", "digits", "--model", "mlp", "--hidden", "256", "--batch-size", "32",
         "--threads", "1", "--max-steps-per-epoch", "20", "--seed", "0"]
BESIDE = {"beside": True, "alone": False}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rates", default="10,25", help="Mbit/s, comma-separated")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--placement", choices=["beside", "alone", "both"], default="beside")
    parser.add_argument("--timeout", type=float, default=300, help="seconds a run may take")
    args = parser.parse_args()
    reason = unavailable_reason()
    if reason is not None:
        sys.exit(f"no slow-link lab here: {reason}")
    rates = [float(r) for r in args.rates.split(",")]
    placements = ["beside", "alone"] if args.placement == "both" else [args.placement]
    modes = planning.modes(["adiloco"], [0], [0], [4])
    apply_seconds = measure_timing(MODEL, step_seconds=1.0, repeats=10).apply_seconds
    ratios: dict[tuple[str, float], list[float]] = {}
    print("| placement | Mbit/s | run | measured ms a step | predicted | predicted / measured |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp, SlowLinks() as lab, launching_into(lab):
        for repeat in range(args.repeats):
            for placement in placements:
                for mbit in rates:
                    folder = Path(tmp) / f"{placement}-{mbit:g}-{repeat}"
                    planned = planning.plan(modes, [0], ["none"], 2, [
                        *MODEL, "--epochs", str(args.epochs), "--no-progress"])
                    for run in lab_runs(lab, planned, folder, server_beside=BESIDE[placement]):
                        lab.throttle(mbit)
                        status = run_one(run, folder, args.timeout, force=True)
                        run_dir = folder / "runs" / run.name
                        if status["status"] != "ok":  # its folder goes with the temporary one
                            sys.exit(f"{run.name} failed ({status['reason']}):\n"
                                     + last_lines(run_dir / OUTPUT, 20))
                        epochs = read_run(run_dir).epochs[1:]
                        measured = sum(e.seconds for e in epochs) / sum(e.steps for e in epochs)
                        predicted = predicted_step_seconds(
                            run.mode, MODEL, epochs, Link(mbit), apply_seconds,
                            beside_server=(1,) if BESIDE[placement] else ())
                        ratio = predicted / measured
                        ratios.setdefault((placement, mbit), []).append(ratio)
                        print(f"| {placement} | {mbit:g} | {repeat + 1} | {measured * 1000:.2f} "
                              f"| {predicted * 1000:.2f} | {ratio:.2f} |", flush=True)
    print()
    for (placement, mbit), values in ratios.items():
        print(f"{placement} at {mbit:g} Mbit/s: predicted / measured {min(values):.2f} to "
              f"{max(values):.2f} (median {statistics.median(values):.2f}, {len(values)} runs)")


if __name__ == "__main__":
    main()
