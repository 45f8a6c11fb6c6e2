#!/usr/bin/env python
"""The same sync training run on one host and across two "hosts" (network namespaces joined by
a veth pair, TCP between them; scripts/netns/two_hosts.py), with the throughput ratio measured
in the same run. Needs root for the namespaces.

Contenders (mpirun -np 2, the benchmark MLP of scripts/bench_sync.py):
- one host, Open MPI's defaults (shared memory between the ranks);
- one host, TCP over loopback (``--mca btl tcp,self``): the transport without the namespaces;
- two hosts, one rank each, TCP over the veth pair.

    sudo python scripts/bench_multihost.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "netns"))
from launching import BIN, launch_env  # noqa: E402
from two_hosts import TwoHosts, unavailable_reason  # noqa: E402

TRAIN = ["--dataset", "synthetic", "--synthetic-shape", "1024", "--synthetic-samples", "16384",
         "--hidden", "1024,1024", "--batch-size", "64", "--epochs", "3",
         "--max-steps-per-epoch", "80", "--eval-every", "3", "--checkpoint-every", "0",
         "--no-progress", "--threads", "1"]
# --threads 1: the two "hosts" share this machine's cores, but each rank sees a host of its own
# and would take all its cores (hvdtrain's default: cores / ranks on the host), running twice as
# many compute threads as there are cores. One thread per rank is what one-host mpirun gets.


def env(extra: dict[str, str] | None = None) -> dict[str, str]:
    e = launch_env()
    if extra:
        e.update(extra, PATH=f"{extra.get('PATH', '')}{os.pathsep}{e['PATH']}")
    return e


def rate(command: list[str], run_dir: str, extra_env: dict[str, str] | None = None) -> float:
    proc = subprocess.run(command, env=env(extra_env), capture_output=True, text=True,
                          timeout=600, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise SystemExit(f"failed: {' '.join(command)}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    epochs = [json.loads(line) for line in open(Path(run_dir) / "metrics.jsonl")
              if '"type": "epoch"' in line]
    return statistics.median(e["samples_per_sec"] for e in epochs[1:])  # after the first epoch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    reason = unavailable_reason()
    if reason:
        raise SystemExit(f"cannot run: {reason}")
    hvdtrain = [str(BIN / "hvdtrain"), "train", *TRAIN]
    rates: dict[str, list[float]] = {"one host (shared memory)": [],
                                     "one host, TCP over loopback": [],
                                     "two hosts, TCP over veth": []}
    with TwoHosts() as hosts, tempfile.TemporaryDirectory() as tmp:
        hostfile = Path(tmp) / "hostfile"
        hostfile.write_text("".join(f"{a} slots=1\n" for a in hosts.addresses))
        for r in range(args.rounds):
            for name in rates:
                run_dir = str(Path(tmp) / f"{r}-{len(rates[name])}-{name[:3]}")
                if name.startswith("two"):
                    command = hosts.on(0, [
                        "mpirun", "-np", "2", "--hostfile", str(hostfile), *hosts.mpirun_flags(),
                        "-x", "PATH", "-x", "OMPI_ALLOW_RUN_AS_ROOT",
                        "-x", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", *hvdtrain, "--run-dir", run_dir])
                    rates[name].append(rate(command, run_dir, hosts.env))
                else:
                    tcp = ["--mca", "btl", "tcp,self"] if "TCP" in name else []
                    command = ["mpirun", "-np", "2", *tcp, *hvdtrain, "--run-dir", run_dir]
                    rates[name].append(rate(command, run_dir))
            print(f"round {r + 1}/{args.rounds}: " + ", ".join(
                f"{n} {v[-1]:,.0f}" for n, v in rates.items()), flush=True)
    base = statistics.median(rates["one host (shared memory)"])
    print("\nsync, mpirun -np 2, MLP 1024-1024-1024-10 (2.1M parameters), batch 64 per rank; "
          f"samples/s after the first epoch, median of {args.rounds} rounds")
    print("| placement | samples/s | ratio to one host |")
    print("|---|---|---|")
    for name, values in rates.items():
        median = statistics.median(values)
        print(f"| {name} | {median:,.0f} ({min(values):,.0f}-{max(values):,.0f}) | "
              f"{median / base:.2f} |")


if __name__ == "__main__":
    main()
