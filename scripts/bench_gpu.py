#!/usr/bin/env python
"""Benchmark training on CUDA GPUs against the same runs on CPUs, and what the async GPU worker's
host<->device copies cost against what the bus allows.

For a machine with CUDA GPUs; without one it prints "no CUDA GPU: nothing to measure", the
commands it would have run, and exits with code 0. All figures come from one run of this script,
in interleaved rounds (each round runs every contender once); the table gives medians.

1. Throughput: sync (``mpirun -np W hvdtrain train``, Horovod) and async (``mpirun -np W+1
   hvdtrain train --mode async``: W workers and 1 parameter server, which stays on the CPU),
   each with ``--device cuda`` (one GPU per local rank) and with ``--device cpu``. A run's rate is
   the mean samples/s (all workers added up) of its epochs after the first, which is warm-up.
2. Bandwidth: a large pinned host tensor copied to GPU 0 and back with non-blocking copies,
   each direction timed with CUDA events, median of the repeats.
3. The async GPU worker's copies: worker 0 logs, per epoch, ``device_copy_seconds`` (its copies'
   time on the copy streams, CUDA events around each chunk's copy, or around a whole gradient's
   chunks when it is copied after backward rather than during it),
   ``device_copy_wait_seconds`` (time the worker was blocked on them) and ``epoch_seconds``. The
   measured share is device_copy_seconds / epoch_seconds over the epochs after the first (the
   wait share is shown beside it). The bound is the share the copies would take at the measured
   bandwidth: a step sends the gradient to the host and takes the parameters back (P bytes each
   way, P = float32 parameter bytes, with the default --pull-every 1), at least P / (device->host)
   + P / (host->device) seconds, which is 2P / bandwidth when both directions run at the same
   rate; divided by the measured step time (epoch_seconds / steps per epoch). measured / bound
   near 1: the copies run at bus speed; above 1: they take longer than the bytes need (chunks
   that arrive slower than the bus takes them, pageable memory that CUDA stages itself, which
   the shared-memory window was until a GPU worker registered it: ps/host_pinning.py). The
   wait share is what the worker actually loses to copying. Issue 43's goal: measured / bound
   at most 2 (it was 5 on an H200 before the window was registered).
4. On the GPU alone: sync with ``--precision bf16`` against float32, sync with ``--compile``
   against eager (one more epoch, left out: it holds the compile of the evaluation graph), and
   a hand-written Horovod loop on the same GPUs (scripts/gpu/hand_loop.py), which sync and async
   are given as ratios of.
5. Async on the GPU beyond the plain run (ASYNC_VARIANTS), each against the hand loop: the
   server's shard on the GPU (``--server-device cuda``), and asynchronous DiLoCo with H = 32
   (``--local-steps 32``) with the server on the GPU and on the CPU. Issue 43's goal: async
   DiLoCo H = 32 at least 0.9 of the hand loop. The last lines say which goals were met.
6. Where the step time goes: in the first round, the hand loop, plain sync and async DiLoCo
   (server on the CPU) each run torch.profiler over one round's worth of warm-up steps
   (PROFILE_STEPS wide, ending on a DiLoCo round's last step, outside the timed epochs):
   hvdtrain's --profile-steps, and the same summary from the hand loop. Per step: operators,
   kernel launches, synchronizations with the GPU, copies and GPU busy time, then the operator
   tables (printed in full after the round; their first lines again at the end).

The default model is a synthetic-data MLP 1024-4096-4096-10 (~21M parameters, 84 MB of float32),
batch 256 per worker, 200 steps an epoch: big enough that a GPU has work and the copies are not
negligible.

    python scripts/bench_gpu.py [--rounds 3] [--workers N] [--hidden 4096,4096] [--copy-mib 256]
                                [--no-cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from hvdtrain.run_output import read_jsonl  # noqa: E402
from launching import BIN, launch_env  # noqa: E402

MODES = ("sync", "async")
DEVICES = ("cpu", "cuda")
# Sync runs on the GPU with one flag changed, each against the plain sync GPU run.
VARIANTS = {"bf16": ("--precision", "bf16"), "compile": ("--compile",)}
# Async runs on the GPU besides the plain one (whose server is on the CPU), each against the
# hand loop: the server's shard on the GPU (--server-device), and asynchronous DiLoCo with
# H = 32, whose server sees 1/32 of plain async's traffic (issue 43's goal: >= 0.9 of the hand
# loop), with the server on the GPU and on the CPU.
DILOCO = ("--local-steps", "32", "--outer-lr", "0.7", "--outer-momentum", "0.9")
ASYNC_VARIANTS = {"server-gpu": ("--server-device", "cuda"),
                  "adiloco32-server-gpu": (*DILOCO, "--server-device", "cuda"),
                  "adiloco32": DILOCO}
# Issue 43's goals for the GPU: (row of variant_rows, least ratio), and the copies' most.
GOALS = (("async DiLoCo H=32, server on the GPU / hand loop", 0.9),)
COPY_GOAL = 2.0  # plain async's copy time over its bandwidth bound, at most
FLOAT32_BYTES = 4
PROFILE_STEPS = 32  # one DiLoCo round (DILOCO's H): its push is the window's last step
PROFILED = {"hand loop": ("hand", "cuda"), "sync": ("sync", "cuda"),
            "async DiLoCo H=32, server on the CPU": ("async", "cuda", *DILOCO)}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved repetitions; medians")
    parser.add_argument("--workers", type=int, default=0,
                        help="training processes per run (0: one per GPU)")
    parser.add_argument("--features", type=int, default=1024, help="synthetic input size")
    parser.add_argument("--hidden", default="4096,4096", help="the MLP's hidden layers")
    parser.add_argument("--batch-size", type=int, default=256, help="per worker")
    parser.add_argument("--epochs", type=int, default=3, help="per run; the first is warm-up")
    # An epoch's fixed costs (its permutation, the epoch line, an evaluation) count in its
    # samples/s: 30 steps an epoch made them a third of a 1.5 ms GPU step's epoch (stop 36).
    parser.add_argument("--steps", type=int, default=200, help="steps per epoch")
    parser.add_argument("--copy-mib", type=int, default=256, help="size of the bandwidth copy")
    parser.add_argument("--copy-repeats", type=int, default=20, help="timed copies per direction")
    parser.add_argument("--hvdtrain-flags", default="", help="extra flags for every hvdtrain run")
    parser.add_argument("--run-timeout", type=int, default=600, help="seconds per run")
    parser.add_argument("--no-cpu", action="store_true",
                        help="skip the --device cpu runs (the GPU check, to save device time)")
    # A model large enough for the GPU to dominate makes the CPU server's async step minutes
    # long; bf16 and compile against eager are measured on sync alone.
    parser.add_argument("--no-async", action="store_true", help="skip the async runs")
    args = parser.parse_args(argv)
    if args.epochs < 2:
        parser.error("--epochs must be at least 2: the first epoch is warm-up")
    if args.rounds < 1 or args.workers < 0 or args.copy_mib < 1 or args.copy_repeats < 1:
        parser.error("--rounds, --copy-mib and --copy-repeats must be positive, --workers >= 0")
    return args


def train_command(mode: str, device: str, workers: int, run_dir: str,
                  args: argparse.Namespace, extra: tuple[str, ...] = ()) -> list[str]:
    np = workers + (1 if mode == "async" else 0)
    epochs = args.epochs + (1 if "--compile" in extra else 0)
    return ["mpirun", "-np", str(np), "--oversubscribe", "--bind-to", "none",
            str(BIN / "hvdtrain"), "train", "--mode", mode, "--device", device,
            "--dataset", "synthetic", "--synthetic-shape", str(args.features),
            # the test split takes a fifth: enough training samples for --steps full steps
            "--synthetic-samples",
            str(max(16384, args.batch_size * workers * args.steps * 5 // 4 + 1)),
            "--hidden", args.hidden, "--batch-size", str(args.batch_size),
            "--epochs", str(epochs), "--max-steps-per-epoch", str(args.steps),
            "--eval-every", str(epochs), "--checkpoint-every", "0", "--no-progress",
            "--run-dir", run_dir, *shlex.split(args.hvdtrain_flags), *extra]


def launch(cmd: list[str], args: argparse.Namespace) -> str | None:
    """Run a job; its stdout, or None after printing why it failed."""
    try:
        proc = subprocess.run(cmd, env=launch_env(), capture_output=True, text=True,
                              timeout=args.run_timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        print(f"timed out after {args.run_timeout} s: {shlex.join(cmd)}", flush=True)
        return None
    if proc.returncode != 0:
        print(f"failed ({proc.returncode}): {shlex.join(cmd)}\n{proc.stdout[-3000:]}\n"
              f"{proc.stderr[-3000:]}", flush=True)
        return None
    return proc.stdout


def profile_window(args: argparse.Namespace) -> str | None:
    """"FIRST:LAST": the last PROFILE_STEPS warm-up steps (epoch 1) that end on a DiLoCo round;
    None where epoch 1 is shorter than a window after step 1."""
    last = PROFILE_STEPS * (args.steps // PROFILE_STEPS)
    first = last - PROFILE_STEPS + 1
    return f"{first}:{last}" if first >= 2 else None


def read_profile(folder: Path, profile: dict | None) -> None:
    """Fill ``profile`` with rank 0's --profile-steps summary in ``folder``, if it wrote one."""
    written = sorted(folder.glob("profile-rank0-*.txt"))
    if profile is not None and written:
        profile["text"] = written[0].read_text()


def train(mode: str, device: str, workers: int, args: argparse.Namespace,
          extra: tuple[str, ...] = (), profile: dict | None = None) -> list[dict] | str:
    """The run's metrics.jsonl records, or why it failed (one line). ``profile``: a dict to
    fill with rank 0's --profile-steps summary ("text"), profiling the run's profile_window."""
    window = profile_window(args) if profile is not None else None
    if window:
        extra = (*extra, "--profile-steps", window)
    with tempfile.TemporaryDirectory() as run_dir:
        cmd = train_command(mode, device, workers, run_dir, args, extra)
        if launch(cmd, args) is None:
            return "failed (output above)"
        read_profile(Path(run_dir), profile)
        records = read_jsonl(Path(run_dir) / "metrics.jsonl")
        if "--compile" in extra:  # the extra last epoch holds the eval graph's compile
            records = records[:max(i for i, r in enumerate(records) if r.get("type") == "epoch")]
        return records


def hand_loop(workers: int, args: argparse.Namespace, profile: dict | None = None) -> float | str:
    """Global samples/s of the hand-written Horovod loop on the GPUs, or why it failed;
    ``profile`` as train()'s."""
    cmd = ["mpirun", "-np", str(workers), "--oversubscribe", "--bind-to", "none",
           sys.executable, str(HERE / "gpu" / "hand_loop.py"), "--features", str(args.features),
           "--hidden", args.hidden, "--batch-size", str(args.batch_size),
           "--warmup-steps", str(args.steps), "--steps", str(args.steps * (args.epochs - 1))]
    window = profile_window(args) if profile is not None else None
    with tempfile.TemporaryDirectory() as folder:
        if window:
            cmd += ["--profile-steps", window, "--profile-dir", folder]
        out = launch(cmd, args)
        read_profile(Path(folder), profile)
    for line in (out or "").splitlines():
        if line.startswith("BENCH "):
            return json.loads(line[len("BENCH "):])["samples_per_sec"]
    return "failed (output above)"


def later_epochs(records: list[dict]) -> list[dict]:
    return [r for r in records if r.get("type") == "epoch"][1:]


def samples_per_sec(records: list[dict]) -> float:
    return statistics.fmean(r["samples_per_sec"] for r in later_epochs(records))


def flops_note(records: list[dict]) -> str:
    """" (T TFLOP/s, MFU m)" from the epochs after the first, where the run logged them."""
    epochs = later_epochs(records)
    if not epochs or any("tflops" not in e for e in epochs):
        return ""
    note = f"{statistics.fmean(e['tflops'] for e in epochs):.3g} TFLOP/s"
    if all("mfu" in e for e in epochs):
        note += f", MFU {statistics.fmean(e['mfu'] for e in epochs):.3f}"
    return f" ({note})"


def copy_figures(records: list[dict]) -> dict | None:
    """Worker 0's copy time and bytes per step, its step time, and the parameter bytes, from an
    async GPU run's log; None when its epoch lines carry no device_copy_seconds."""
    epochs = later_epochs(records)
    if not epochs or any("device_copy_seconds" not in e for e in epochs):
        return None
    header = next(r for r in records if r.get("type") == "header")
    steps = header["steps_per_epoch"] * len(epochs)
    seconds = sum(e["epoch_seconds"] for e in epochs)
    copy_bytes = [e.get("device_copy_bytes") for e in epochs]
    waits = [e.get("device_copy_wait_seconds") for e in epochs]
    return {"copy_share": sum(e["device_copy_seconds"] for e in epochs) / seconds,
            "wait_share": sum(waits) / seconds if None not in waits else None,
            "step_seconds": seconds / steps,
            "param_bytes": header["num_parameters"] * FLOAT32_BYTES,
            "copy_bytes_per_step": (sum(copy_bytes) / steps if None not in copy_bytes else None)}


def copy_bound(param_bytes: float, step_seconds: float, to_device: float,
               to_host: float) -> float:
    """The least share of a step that copying the gradient out and the parameters in can take
    at these bandwidths (bytes/s)."""
    return (param_bytes / to_host + param_bytes / to_device) / step_seconds


def pinned_bandwidth(mib: int, repeats: int) -> tuple[float, float]:
    """(host->device, device->host) bytes/s for a pinned buffer of ``mib`` MiB on GPU 0."""
    n = mib * 2**20
    host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    device = torch.empty(n, dtype=torch.uint8, device="cuda:0")
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)

    def rate(dst: torch.Tensor, src: torch.Tensor) -> float:
        dst.copy_(src, non_blocking=True)  # the first copy pays for setting up the transfer
        torch.cuda.synchronize()
        times = []
        for _ in range(repeats):
            start.record()
            dst.copy_(src, non_blocking=True)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)  # milliseconds
        return n / statistics.median(times)

    try:
        return rate(device, host), rate(host, device)
    finally:
        del host, device
        torch.cuda.empty_cache()


def spread(values: list[float], fmt: str) -> str:
    if not values:
        return "-"
    med = statistics.median(values)
    if len(values) == 1:
        return format(med, fmt)
    return f"{format(med, fmt)} ({format(min(values), fmt)}-{format(max(values), fmt)})"


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def result_rows(results: dict, workers: int) -> list[list[str]]:
    """The table's rows from every round's figures:

    results[(mode, device)]: samples/s per round, or a failure reason (str) in its place;
    results["to_device"], results["to_host"]: bytes/s per round;
    results["copies"]: per round whose async GPU run finished, copy_figures() with that round's
    bandwidths added as "to_device" and "to_host" (None: the run logged no copy figures).
    """
    rows = []
    for mode in MODES:
        who = f"{workers} worker{'s' if workers != 1 else ''}"
        name = (f"sync, {who}: samples/s" if mode == "sync"
                else f"async, {who} + 1 server (CPU): samples/s")
        cells, medians = [], {}
        for device in DEVICES:
            runs = results.get((mode, device), [])
            failed = [r for r in runs if isinstance(r, str)]
            rates = [r for r in runs if not isinstance(r, str)]
            cells.append(f"failed: {failed[0]}" if failed else spread(rates, ",.0f"))
            if rates and not failed:
                medians[device] = statistics.median(rates)
        ratio = (f"{medians['cuda'] / medians['cpu']:.2f}" if len(medians) == 2 else "-")
        rows.append([name, *cells, ratio])
    to_device = [b / 1e9 for b in results.get("to_device", [])]
    to_host = [b / 1e9 for b in results.get("to_host", [])]
    rows.append(["pinned host -> GPU 0, GB/s", "-", spread(to_device, ".1f"), "-"])
    rows.append(["pinned GPU 0 -> host, GB/s", "-", spread(to_host, ".1f"), "-"])
    copies = results.get("copies", [])
    logged = [c for c in copies if c is not None]
    worker = "async GPU worker 0:"
    if copies and not logged:
        rows.append([f"{worker} copy share of step time", "-",
                     "not logged (no device_copy_seconds in its epoch lines)", "-"])
    elif logged:
        measured = [c["copy_share"] for c in logged]
        bounds = [copy_bound(c["param_bytes"], c["step_seconds"], c["to_device"], c["to_host"])
                  for c in logged]
        med_measured, med_bound = statistics.median(measured), statistics.median(bounds)
        bound_name = "the same, bound by the bandwidth: (P / to-host + P / to-device) / step time"
        rows.append([f"{worker} copy share of step time (device_copy_seconds / epoch_seconds)",
                     "-", spread(measured, ".3f"), "-"])
        rows.append([bound_name, "-", spread(bounds, ".3f"),
                     f"measured / bound {med_measured / med_bound:.2f}" if med_bound else "-"])
        waits = [c["wait_share"] for c in logged if c["wait_share"] is not None]
        if waits:
            wait_name = (f"{worker} share of step time blocked on copies "
                         "(device_copy_wait_seconds / epoch_seconds)")
            rows.append([wait_name, "-", spread(waits, ".3f"), "-"])
        step_ms = [c["step_seconds"] * 1e3 for c in logged]
        rows.append([f"{worker} step time, ms", "-", spread(step_ms, ".2f"), "-"])
        per_step = [c["copy_bytes_per_step"] for c in logged if c["copy_bytes_per_step"]]
        if per_step:
            bytes_name = (f"{worker} copied MB per step (2P, plus the pulls of an evaluation "
                          "or checkpoint)")
            rows.append([bytes_name, "-", spread([b / 1e6 for b in per_step], ".1f"),
                         f"2P = {2 * logged[0]['param_bytes'] / 1e6:.1f} MB"])
    return rows


def run_round(workers: int, args: argparse.Namespace, results: dict) -> list[str]:
    """One round of every contender, its figures appended to ``results``; the round's line."""
    to_device, to_host = pinned_bandwidth(args.copy_mib, args.copy_repeats)
    results.setdefault("to_device", []).append(to_device)
    results.setdefault("to_host", []).append(to_host)
    line = [f"pinned {to_device / 1e9:.1f} GB/s to GPU, {to_host / 1e9:.1f} GB/s back"]
    runs = [(mode, device, ()) for mode in MODES for device in DEVICES
            if not (args.no_cpu and device == "cpu")
            and not (args.no_async and mode == "async")]
    runs += [("sync", "cuda", flags) for flags in VARIANTS.values()]
    runs += [("async", "cuda", flags) for flags in ASYNC_VARIANTS.values()
             if not args.no_async]
    # the first round profiles PROFILED's runs: their warm-up epoch, untimed
    first_round = "profiles" not in results
    profiles = results.setdefault("profiles", {})

    def profile_of(key: tuple) -> dict | None:
        return profiles.setdefault(key, {}) if first_round and key in PROFILED.values() else None

    for mode, device, extra in runs:
        key = (mode, device, *extra) if extra else (mode, device)
        records = train(mode, device, workers, args, extra, profile_of(key))
        ok = not isinstance(records, str)
        results.setdefault(key, []).append(samples_per_sec(records) if ok else records)
        if mode == "async" and device == "cuda" and ok and not extra:  # plain async's copies
            copies = copy_figures(records)
            if copies is not None:
                copies.update(to_device=to_device, to_host=to_host)
            results.setdefault("copies", []).append(copies)
        name = " ".join(key)
        line.append(f"{name} " + (f"{results[key][-1]:,.0f} samples/s{flops_note(records)}"
                                  if ok else "failed"))
    results.setdefault(("hand", "cuda"), []).append(
        hand_loop(workers, args, profile_of(("hand", "cuda"))))
    hand = results[("hand", "cuda")][-1]
    line.append("hand loop cuda " + (f"{hand:,.0f} samples/s" if isinstance(hand, float)
                                     else "failed"))
    return line


def variant_rows(results: dict) -> list[list[str]]:
    """bf16 / float32 and compile / eager for sync on the GPU, and sync and async on the GPU
    against the hand-written loop: samples/s and the ratio of the medians."""
    def med(key: tuple) -> float | None:
        rates = [r for r in results.get(key, []) if not isinstance(r, str)]
        return statistics.median(rates) if rates else None

    rows = []
    for name, key, base in (
            ("hand-written Horovod loop", ("hand", "cuda"), None),
            ("sync / hand loop", ("sync", "cuda"), ("hand", "cuda")),
            ("async / hand loop", ("async", "cuda"), ("hand", "cuda")),
            ("sync bf16 / float32", ("sync", "cuda", *VARIANTS["bf16"]), ("sync", "cuda")),
            ("sync compile / eager", ("sync", "cuda", *VARIANTS["compile"]), ("sync", "cuda")),
            ("async, server on the GPU / hand loop",
             ("async", "cuda", *ASYNC_VARIANTS["server-gpu"]), ("hand", "cuda")),
            ("async DiLoCo H=32, server on the GPU / hand loop",
             ("async", "cuda", *ASYNC_VARIANTS["adiloco32-server-gpu"]), ("hand", "cuda")),
            ("async DiLoCo H=32, server on the CPU / hand loop",
             ("async", "cuda", *ASYNC_VARIANTS["adiloco32"]), ("hand", "cuda"))):
        rates = [r for r in results.get(key, []) if not isinstance(r, str)]
        a, b = med(key), med(base) if base else None
        rows.append([name, spread(rates, ",.0f") if rates
                     else "failed" if key in results else "not run",
                     f"{a / b:.2f}" if a and b else "-"])
    return rows


def profile_lines(results: dict) -> list[str]:
    """Each profiled run's figures per step (its summary's first lines), one block each."""
    lines = [f"profiles of {PROFILE_STEPS} warm-up steps (first round):"]
    for name, key in PROFILED.items():
        text = results.get("profiles", {}).get(key, {}).get("text")
        head = text.split("\n\n")[0].splitlines() if text else ["none written"]
        lines += [f"  {name}: {head[0]}", *(f"    {line}" for line in head[1:])]
    return lines


def goal_lines(results: dict, workers: int) -> list[str]:
    """One line per goal of issue 43 that a GPU run settles: the ratio measured, and met or
    not (or why it has no figure)."""
    ratios = {row[0]: row[2] for row in variant_rows(results)}
    lines = []
    for name, least in GOALS:
        ratio = ratios.get(name, "-")
        verdict = "no figure" if ratio == "-" else (
            "met" if float(ratio) >= least else "NOT met")
        lines.append(f"goal: {name} >= {least}: {ratio} ({verdict})")
    bound = [row[3] for row in result_rows(results, workers) if row[3].startswith("measured /")]
    ratio = bound[0].split()[-1] if bound else "-"
    verdict = "no figure" if ratio == "-" else (
        "met" if float(ratio) <= COPY_GOAL else "NOT met")
    lines.append(f"goal: plain async's copies / their bandwidth bound <= {COPY_GOAL:g}: "
                 f"{ratio} ({verdict})")
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA GPU: nothing to measure. On a machine with one, this script runs, for "
              "--device cpu and --device cuda alike:")
        for mode, extra in [(m, ()) for m in MODES] + [
                ("async", flags) for flags in ASYNC_VARIANTS.values()]:
            cmd = train_command(mode, "cuda", args.workers or 1, "RUN_DIR", args, extra)
            print("  " + shlex.join(cmd))
        return 0
    workers = args.workers or torch.cuda.device_count()
    print(f"GPU 0: {torch.cuda.get_device_name(0)}; {torch.cuda.device_count()} GPU(s), "
          f"{os.cpu_count()} cores; torch {torch.__version__}; {workers} worker(s)", flush=True)
    results: dict = {}
    for round_ in range(args.rounds):
        line = run_round(workers, args, results)
        print(f"round {round_ + 1}/{args.rounds}: " + ", ".join(line), flush=True)
        if round_ == 0:
            for name, key in PROFILED.items():
                text = results["profiles"].get(key, {}).get("text")
                print(f"\nprofile, {name}:\n{text or 'none written'}", flush=True)

    print(f"\nmodel: MLP {args.features}-{args.hidden.replace(',', '-')}-10, synthetic data, "
          f"batch {args.batch_size} per worker, {args.steps} steps per epoch, epochs "
          f"2-{args.epochs} timed; copy {args.copy_mib} MiB x {args.copy_repeats}; medians "
          f"(min-max) of {args.rounds} rounds\n")
    print(markdown_table(["measure", "cpu", "cuda", "cuda / cpu"], result_rows(results, workers)))
    print()
    print(markdown_table(["on the GPU", "samples/s", "ratio"], variant_rows(results)))
    print()
    print("\n".join(profile_lines(results)))
    print()
    print("\n".join(goal_lines(results, workers)))
    failed = any(isinstance(r, str) for key in results if isinstance(key, tuple)
                 for r in results[key])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
