#!/usr/bin/env python
"""Soak test of async training: 2 workers and 1 server for about --minutes (default 10).

Prints the server's resident memory after its first push and at the end (it must stay flat:
parameters, optimizer state and buffers are allocated once), its peak, and the count of applied
gradients against the pushes the workers made (they must be equal: no update lost).

    python scripts/soak_async.py [--minutes 10]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent
TRAIN = ["--mode", "async", "--dataset", "synthetic", "--synthetic-shape", "256",
         "--synthetic-samples", "8192", "--hidden", "512,512", "--batch-size", "32",
         "--no-progress", "--checkpoint-every", "20", "--eval-every", "20"]


def launch(epochs: int, run_dir: str) -> tuple[float, list[dict]]:
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    t0 = time.monotonic()
    proc = subprocess.run(["mpirun", "-np", "3", "--oversubscribe", str(BIN / "hvdtrain"), "train",
                           *TRAIN, "--epochs", str(epochs), "--run-dir", run_dir], env=env,
                          capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise SystemExit(f"soak run failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    records = [json.loads(line) for line in open(Path(run_dir) / "metrics.jsonl")]
    return time.monotonic() - t0, records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        _, records = launch(20, str(Path(tmp) / "calibrate"))
        # Steady-state rate: training time of epochs 11-20 only, because start-up and the first
        # epochs (allocator warm-up, first checkpoint) are slower and made earlier soaks too short.
        # The 10% margin keeps a run on a machine that speeds up from falling below --minutes.
        walls = [r["wall_seconds"] for r in records if r["type"] == "epoch"]
        per_epoch = (walls[19] - walls[9]) / 10
        epochs = max(20, int(1.1 * args.minutes * 60 / per_epoch))
        print(f"calibration: {per_epoch:.3f} s per epoch; soaking with {epochs} epochs", flush=True)
        seconds, records = launch(epochs, str(Path(tmp) / "soak"))
    server = next(r for r in records if r["type"] == "scheme")["servers"][0]
    mib = 2 ** 20
    training = [r for r in records if r["type"] == "epoch"][-1]["wall_seconds"]
    print(f"ran {seconds / 60:.1f} min ({training / 60:.1f} min of training), {epochs} epochs, "
          "2 workers + 1 server")
    print(f"server RSS after the first push: {server['rss_at_first_push_bytes'] / mib:.1f} MiB; "
          f"at the end: {server['rss_at_end_bytes'] / mib:.1f} MiB; peak: "
          f"{server['peak_rss_bytes'] / mib:.1f} MiB "
          f"(growth {(server['rss_at_end_bytes'] - server['rss_at_first_push_bytes']) / mib:+.1f} MiB)")
    print(f"gradients applied: {server['pushes_applied']:,}; pushes made by the workers: "
          f"{server['pushes_made_by_workers']:,}; lost: "
          f"{server['pushes_made_by_workers'] - server['pushes_applied']}")


if __name__ == "__main__":
    main()
