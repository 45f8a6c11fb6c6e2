#!/usr/bin/env python
"""Benchmark the parameter server, with every figure a ratio against a baseline from this run.

1. Push-plus-pull throughput for a 16 MiB model, 1 server and 1 worker, against
   ``python -m mpi4py.bench pingpong -a numpy`` at the same message size (its bandwidth moves the
   same bytes: one message each way per round trip). Target: at least 0.7.
2. The server's peak memory above a bare interpreter with torch (and mpi4py) imported, in units
   of the model's size. Target: at most 4.
3. Async training throughput against sync training with the same number of workers.

    python scripts/bench_ps.py [--rounds 3] [--mib 16] [--messages-only]

``--messages-only``: pingpong and the messages-only row alone, with a float32 and a bf16 wire
(--wire-dtype); the bf16 row counts model bytes, of which its messages carry half. With
``--link RATE`` (e.g. 1gbit; needs root) the two processes run on two network namespaces of
scripts/netns/two_hosts.py, over TCP through a veth throttled to RATE by ``tc tbf``: the path
between hosts, where a push and its reply share the link, one in each direction.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from launching import BIN, launch_env, run  # noqa: E402

ENV = launch_env(pythonpath=HERE.parent)  # the jobs import hvdtrain from this tree


def mpirun(np: int, *command: str) -> list[str]:
    return ["mpirun", "-np", str(np), "--oversubscribe", *command]


@contextlib.contextmanager
def two_hosts(rate: str):
    """(launch, env) that run 2 ranks on two network namespaces whose veth is throttled to
    ``rate`` (tc tbf), one rank each."""
    sys.path.insert(0, str(HERE / "netns"))
    from two_hosts import TwoHosts, unavailable_reason

    reason = unavailable_reason()
    if reason:
        raise SystemExit(f"--link: {reason}")
    with TwoHosts("bench") as hosts, tempfile.TemporaryDirectory() as tmp:
        for ns in hosts.namespaces:
            subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "hvd0", "root",
                            "tbf", "rate", rate, "burst", "256kb", "latency", "50ms"],
                           check=True, capture_output=True, timeout=30)
        hostfile = Path(tmp) / "hostfile"
        hostfile.write_text("".join(f"{a} slots=1\n" for a in hosts.addresses))
        env = {**ENV, **hosts.env,
               "PATH": f"{hosts.env['PATH']}{os.pathsep}{ENV['PATH']}"}  # ssh, then the venv

        def launch(np: int, *command: str) -> list[str]:
            return hosts.on(0, ["mpirun", "-np", str(np), "--hostfile", str(hostfile),
                                *hosts.mpirun_flags(), "-x", "PATH", "-x", "PYTHONPATH",
                                "-x", "OMPI_ALLOW_RUN_AS_ROOT",
                                "-x", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", *command])
        yield launch, env


def pingpong_bandwidth(nbytes: int, launch=mpirun, env=ENV) -> float:
    """Bytes per second that mpi4py's own ping-pong reaches at this message size."""
    out = run(launch(2, sys.executable, "-m", "mpi4py.bench", "pingpong", "-a", "numpy",
                     "-m", str(nbytes), "-n", str(nbytes), "--loop-huge", "40",
                     "--skip-huge", "5"), env)
    # "# Size [B]  Bandwidth [MB/s] | Time Mean [s] ..." where MB = 1e6 bytes and the time is
    # one way, so bandwidth = size / (half the round trip).
    rows = [line.split() for line in out.splitlines() if re.match(r"^\s*\d+\s", line)]
    size, bandwidth = int(rows[-1][0]), float(rows[-1][1])
    assert size == nbytes, out
    return bandwidth * 1e6


def ps_throughput(mib: float, momentum: float = 0.9, shared: bool = True,
                  wire: str = "fp32", launch=mpirun, env=ENV) -> tuple[float, dict]:
    """Model bytes (float32) pushed plus pulled per second, and the server's statistics: with
    a 16-bit ``wire`` the messages carry half of them."""
    out = run(launch(2, sys.executable, str(HERE / "bench" / "ps_throughput.py"),
                     "--mib", str(mib), "--momentum", str(momentum), "--wire-dtype", wire,
                     *([] if shared else ["--no-shared-memory"])), env)
    worker = json.loads(out.split("BENCH ", 1)[1].splitlines()[0])
    server = json.loads(out.split("SERVER ", 1)[1].splitlines()[0])
    return worker["bytes_per_sec"], {**server, "model_bytes": worker["model_bytes"]}


def bare_rss() -> int:
    """Peak memory of an MPI process that imported torch and mpi4py and did nothing else."""
    out = run(mpirun(1, sys.executable, "-c",
                     "import resource, torch, numpy; from mpi4py import MPI; "
                     "print('RSS', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)"), ENV)
    return int(out.split("RSS", 1)[1].split()[0])


def training_rate(mode: str, workers: int, extra: list[str]) -> float:
    with tempfile.TemporaryDirectory() as run_dir:
        np = workers + (1 if mode == "async" else 0)
        cmd = [str(BIN / "hvdtrain"), "train", "--mode", mode, "--dataset", "synthetic",
               "--synthetic-shape", "1024", "--synthetic-samples", "16384", "--hidden", "1024,1024",
               "--batch-size", "64", "--epochs", "2", "--max-steps-per-epoch", "60",
               "--eval-every", "2", "--checkpoint-every", "0", "--no-progress",
               "--run-dir", run_dir, *extra]
        run(mpirun(np, *cmd), ENV)
        records = [json.loads(line) for line in open(Path(run_dir) / "metrics.jsonl")]
    if mode == "async":
        return next(r for r in records if r["type"] == "scheme")["samples_per_sec"]
    return statistics.median(r["samples_per_sec"] for r in records if r["type"] == "epoch")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mib", type=float, default=16.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--messages-only", action="store_true",
                        help="only pingpong and the rows over messages (fp32 and bf16 wires)")
    parser.add_argument("--link", default=None, metavar="RATE",
                        help="--messages-only between two network namespaces joined by a veth "
                             "throttled to RATE (tc tbf, e.g. 1gbit); needs root")
    args = parser.parse_args()
    if args.messages_only or args.link:
        with (two_hosts(args.link) if args.link else contextlib.nullcontext((mpirun, ENV))) \
                as (launch, env):
            return messages_only(args, launch, env)
    nbytes = int(args.mib * 1024 * 1024)

    pp, ps, ps_plain, ps_messages, servers, sync_rate, async_rate = [], [], [], [], [], [], []
    ps_bf16 = []
    for r in range(args.rounds):
        pp.append(pingpong_bandwidth(nbytes))
        rate, server = ps_throughput(args.mib)
        ps.append(rate)
        servers.append(server)
        ps_plain.append(ps_throughput(args.mib, momentum=0.0)[0])
        ps_messages.append(ps_throughput(args.mib, shared=False)[0])
        ps_bf16.append(ps_throughput(args.mib, shared=False, wire="bf16")[0])
        sync_rate.append(training_rate("sync", args.workers, []))
        async_rate.append(training_rate("async", args.workers, []))
        print(f"round {r + 1}/{args.rounds}: pingpong {pp[-1] / 2**30:.2f} GiB/s, "
              f"ps push+pull {ps[-1] / 2**30:.2f} GiB/s (plain SGD {ps_plain[-1] / 2**30:.2f}, "
              f"messages {ps_messages[-1] / 2**30:.2f}), sync {sync_rate[-1]:,.0f} samples/s, "
              f"async {async_rate[-1]:,.0f} samples/s", flush=True)
    bare = bare_rss()
    peak = max(s["peak_rss_bytes"] for s in servers)
    model = servers[0]["model_bytes"]
    med = statistics.median
    print(f"\nmessage/model size: {args.mib:g} MiB; medians of {args.rounds} rounds")
    print("| measure | value | baseline | ratio | target |")
    print("|---|---|---|---|---|")
    print(f"| push+pull throughput, 1 server 1 worker, server SGD momentum 0.9 | "
          f"{med(ps) / 2**30:.2f} GiB/s | pingpong {med(pp) / 2**30:.2f} GiB/s | "
          f"{med(ps) / med(pp):.2f} | >= 0.7 |")
    print(f"| the same, server plain SGD (no momentum state) | {med(ps_plain) / 2**30:.2f} GiB/s | "
          f"pingpong {med(pp) / 2**30:.2f} GiB/s | {med(ps_plain) / med(pp):.2f} | >= 0.7 |")
    print(f"| momentum 0.9 over messages only (--no-shared-memory, the path between hosts) | "
          f"{med(ps_messages) / 2**30:.2f} GiB/s | pingpong {med(pp) / 2**30:.2f} GiB/s | "
          f"{med(ps_messages) / med(pp):.2f} | >= 0.8 |")
    print(f"| the same with --wire-dtype bf16 (model bytes; the messages carry half) | "
          f"{med(ps_bf16) / 2**30:.2f} GiB/s | pingpong {med(pp) / 2**30:.2f} GiB/s | "
          f"{med(ps_bf16) / med(pp):.2f} | >= 0.8 |")
    print(f"| server peak RSS above bare torch process | {(peak - bare) / 2**20:.0f} MiB | "
          f"model {model / 2**20:.0f} MiB | {(peak - bare) / model:.2f}x | <= 4x |")
    print(f"| async training, {args.workers} workers + 1 server | {med(async_rate):,.0f} samples/s "
          f"| sync, {args.workers} workers {med(sync_rate):,.0f} samples/s | "
          f"{med(async_rate) / med(sync_rate):.2f} | - |")


def messages_only(args, launch, env) -> None:
    """The path between hosts alone: pingpong, then push+pull over messages with a float32 and
    a bf16 wire, each round measured back to back (the machine's load moves all three)."""
    nbytes = int(args.mib * 1024 * 1024)
    pp, wide, narrow = [], [], []
    for r in range(args.rounds):
        pp.append(pingpong_bandwidth(nbytes, launch, env))
        wide.append(ps_throughput(args.mib, shared=False, launch=launch, env=env)[0])
        narrow.append(ps_throughput(args.mib, shared=False, wire="bf16", launch=launch,
                                    env=env)[0])
        print(f"round {r + 1}/{args.rounds}: pingpong {pp[-1] / 2**30:.2f} GiB/s, messages "
              f"fp32 {wide[-1] / 2**30:.2f}, bf16 {narrow[-1] / 2**30:.2f} GiB/s of the model "
              f"(ratios {wide[-1] / pp[-1]:.2f}, {narrow[-1] / pp[-1]:.2f})", flush=True)
    med = statistics.median
    where = f", two hosts over {args.link}" if args.link else ", one host"
    print(f"\nmessage/model size: {args.mib:g} MiB{where}; medians of {args.rounds} rounds")
    print("| measure | value | baseline | ratio | target |")
    print("|---|---|---|---|---|")
    for label, rates in (("fp32", wide), ("bf16 (half the bytes on the wire)", narrow)):
        print(f"| momentum 0.9 over messages only, --wire-dtype {label} | "
              f"{med(rates) / 2**30:.2f} GiB/s of the model | pingpong {med(pp) / 2**30:.2f} "
              f"GiB/s | {med(rates) / med(pp):.2f} | >= 0.8 |")


if __name__ == "__main__":
    main()
