"""``hvdtrain compare``: plan, run, read, report, plot."""

from __future__ import annotations

import argparse
import math
import os
import shlex
import sys
import time
from pathlib import Path

from ..config import ConfigError, check_writable_folder
from ..stragglers import parse_straggler
from ..run_lock import FolderLock

# What the plan sets on every run's command line, and the compare flag to use instead: given in
# --train-args too, the later flag would silently win and the runs would no longer be the plan.
PLANNED = {"mode": "--modes", "staleness": "--staleness-bounds", "seed": "--seeds",
           "straggler": "--stragglers", "bsp": "--modes backup", "backup_workers":
           "--backup-workers", "local_steps": "--local-steps", "staleness_lr": "--modes async-slr",
           "dc_lambda": "--modes dcasgd", "eval_every_steps": "compare's own --eval-every-steps",
           "run_dir": "--out (each run writes into OUT/runs/NAME)",
           "num_servers": "--workers (each async run has one server besides the workers)",
           "dataset": "compare's own --dataset", "model": "compare's own --model",
           "epochs": "compare's own --epochs"}


# The named plans. demo: what `make demo` runs in about five minutes on two cores: a wide CNN
# on digits (~1.3M parameters, ~40 ms a step on one core), so that training, not start-up, is
# most of each run and sync needs about 10 s to 95% under the condition that separates the
# schemes; 5 seeds; 12 epochs are the budget of runs that stop at the target; its async mode
# is async-slr, the fastest async variant of the full plan under 3x, and the one that still
# reaches 95% with 8 simulated workers, where plain async does not. full: every mode
# and straggler condition on the same workload, for docs/comparison.md. Flags given on the
# command line win.
WORKLOAD = dict(model="cnn", train_args="--channels 256,512", epochs=12, eval_every_steps=4)
PLANS = {
    "demo": dict(modes="sync,async-slr,backup", stragglers="3x", seeds=5, **WORKLOAD),
    "full": dict(modes="sync,local,async,ssp,async-slr,dcasgd,backup",
                 stragglers="none,3x,3x@0.3,exp:30ms,pareto:30ms", seeds=5, **WORKLOAD),
}


def add_parser(commands) -> None:
    p = commands.add_parser(
        "compare", help="compare sync, async and SSP training: tables and plots",
        description="Launch sync (Horovod), async (parameter server, no staleness bound) and SSP "
                    "runs with the same workers, model, data and budget, for several seeds and "
                    "straggler conditions; write every run's log, a summary CSV, PNG plots and a "
                    "Markdown report into one folder. Finished runs are skipped when run again.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter, allow_abbrev=False)
    p.add_argument("--out", default="runs/compare", help="folder for the runs, report and plots")
    p.add_argument("--plan", default="demo", choices=sorted(PLANS),
                   help="the defaults of --modes, --stragglers, --seeds, --epochs, --model, "
                        "--train-args and --eval-every-steps: " + "; ".join(
                            f"{name}: " + ", ".join(f"{k}={v}" for k, v in values.items())
                            for name, values in PLANS.items()))
    p.add_argument("--workers", type=int, default=2, help="training processes in every run")
    p.add_argument("--modes", default=None,
                   help="any of sync; local (local SGD, one mode per --local-steps); async (no "
                        "staleness bound); ssp (one mode per --staleness-bounds); backup (sync "
                        "through the server with backup workers, one mode per "
                        "--backup-workers); async-slr (the staleness-aware learning rate); "
                        "dcasgd (delay compensation)")
    p.add_argument("--staleness-bounds", default="2", help="SSP bounds, one run set per bound")
    p.add_argument("--backup-workers", default="1",
                   help="backup workers of the backup mode, one run set per number")
    p.add_argument("--local-steps", default="4",
                   help="steps between model averages of the local mode, one run set per number")
    p.add_argument("--seeds", type=int, default=None, help="seeds per mode (0, 1, ...)")
    p.add_argument("--stragglers", default=None,
                   help="straggler conditions (see hvdtrain train --help, --straggler): none; "
                        "the last worker slowed, 3x or 50ms; one random worker slowed at a step "
                        "with a probability, 3x@0.1; every worker waiting a random delay, "
                        "exp:50ms or pareto:50ms")
    p.add_argument("--target", type=float, default=0.95, help="test accuracy to reach")
    p.add_argument("--epochs", type=int, default=None, help="the budget of every run")
    p.add_argument("--eval-every-steps", type=int, default=None,
                   help="evaluate every N global steps (async: of the job, as worker 0 sees "
                        "them), which times the target to within N steps (0: at epoch ends "
                        "only)")
    p.add_argument("--dataset", default="digits")
    p.add_argument("--model", default=None)
    p.add_argument("--train-args", default=None,
                   help="more hvdtrain train flags for every run, e.g. '--batch-size 64'")
    p.add_argument("--hostfile", default=None,
                   help="run every run across the hosts of this mpirun hostfile")
    p.add_argument("--launcher-args", default="",
                   help="more mpirun flags for every run, given with '=' since they start with "
                        "a dash: --launcher-args='--mca btl_tcp_if_include eth0 -x "
                        "LD_LIBRARY_PATH'")
    p.add_argument("--simulate", action="store_true",
                   help="run the plan on a simulated cluster instead of launching it: real "
                        "gradients of the real model and data in this one process, on a virtual "
                        "clock where each worker's step takes the compute time measured here "
                        "plus the straggler's draws (compare/simulate.py); e.g. --workers 64")
    p.add_argument("--sweep-workers", default="",
                   help="also simulate the plan's modes and stragglers at these numbers of "
                        "workers, e.g. 2,8,32,64, with --sweep-seeds seeds: a table and "
                        "sweep.png of time to target against workers")
    p.add_argument("--sweep-seeds", type=int, default=2, help="seeds per point of the sweep")
    p.add_argument("--global-batch", type=int, default=None,
                   help="simulated runs (--simulate, --sweep-workers): the samples of one global "
                        "step, split evenly over the workers, each worker's --lr scaled with "
                        "its share (strong scaling: every N trains on the same global batches). "
                        "Default: the sweep shares --batch-size x --workers; --simulate gives "
                        "each worker --batch-size (weak scaling), which with many workers "
                        "leaves few steps per epoch")
    p.add_argument("--sim-allreduce-ms", type=float, default=0.0,
                   help="simulated sync: milliseconds of each gradient average (0: an ideal "
                        "network; one process cannot measure it)")
    p.add_argument("--sim-push-ms", type=float, default=0.0,
                   help="simulated async: milliseconds of each push and pull")
    p.add_argument("--sim-step-ms", type=float, default=None,
                   help="--simulate: milliseconds of one worker's forward and backward pass, "
                        "instead of the figure measured in this process, which drifts with the "
                        "machine's load; give the figure an earlier run printed to compare "
                        "invocations on one clock (default: measured)")
    p.add_argument("--sim-apply-ms", type=float, default=None,
                   help="--simulate: milliseconds of the server's update with one gradient "
                        "(default: measured)")
    p.add_argument("--run-timeout", type=float, default=300, help="seconds before a run is "
                   "stopped and recorded as failed")
    p.add_argument("--force", action="store_true", help="run again even the finished runs")


def _ints(text: str, flag: str) -> list[int]:
    try:
        return [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise ConfigError(f"{flag}: expected comma-separated whole numbers, got {text!r}") from None


# The most processes a run may start per core of this host (per slot of a --hostfile, with
# --oversubscribe in --launcher-args): beyond that a run times the kernel's scheduler rather
# than the update schemes, and each process holds its own torch (hundreds of MB), so a mistyped
# --workers 100000 would start a job that swamps the machine. The demo runs 1.5 a core.
PROCESSES_PER_CORE = 4


def _planned_modes(args) -> list:
    from . import plan as planning

    try:
        return planning.modes([m.strip() for m in args.modes.split(",") if m.strip()],
                              _ints(args.staleness_bounds, "--staleness-bounds"),
                              _ints(args.backup_workers, "--backup-workers"),
                              _ints(args.local_steps, "--local-steps"))
    except ValueError as e:
        raise ConfigError(str(e)) from None


def _hostfile_slots(path: str) -> int | None:
    """The slots of an mpirun hostfile, None when a host gives none (mpirun then counts that
    host's cores, which cannot be known from here)."""
    total = 0
    for line in Path(path).read_text(errors="replace").splitlines():
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        slots = [w.split("=", 1)[1] for w in words[1:] if w.startswith("slots=")]
        if not slots or not slots[0].isdigit():
            return None
        total += int(slots[0])
    return total


def check_processes_fit(args, modes: list) -> None:
    """Refuse, before anything starts, a run of more processes than the hosts can hold: a
    real run is ``--workers`` processes, plus one parameter server for the async modes."""
    server = any(m.is_async for m in modes)
    processes = args.workers + server
    who = f"{args.workers} workers" + (" and the parameter server of the async modes"
                                       if server else "")
    if args.hostfile:
        slots = _hostfile_slots(args.hostfile)
        if slots is None:
            return
        # Without --oversubscribe mpirun itself refuses more processes than slots, in each run.
        oversubscribed = "--oversubscribe" in shlex.split(args.launcher_args)
        limit = slots * (PROCESSES_PER_CORE if oversubscribed else 1)
        room = f"the hosts of {args.hostfile} have {slots} slots" + (
            f" ({PROCESSES_PER_CORE} processes a slot with --oversubscribe)"
            if oversubscribed else "")
        more = f"add hosts or slots to {args.hostfile}"
    else:
        cores = os.cpu_count() or 1
        limit = cores * PROCESSES_PER_CORE
        room = (f"this host has {cores} cores, and more than {PROCESSES_PER_CORE} processes a "
                f"core would time its scheduler rather than the update schemes")
        more = "run across more hosts with --hostfile"
    if processes > limit:
        raise ConfigError(
            f"--workers {args.workers}: each run starts {processes} processes ({who}), but "
            f"{room}, room for {limit}: use --workers {limit - server} or fewer, {more}, or "
            f"simulate {args.workers} workers in one process with --simulate")


def apply_plan(args) -> None:
    """Fill every flag left unset from the named plan."""
    for key, value in PLANS[args.plan].items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)


def validate(args) -> None:
    apply_plan(args)
    if args.workers < 1:
        raise ConfigError(f"--workers: invalid value {args.workers}; use 1 or more")
    if args.seeds < 1:
        raise ConfigError(f"--seeds: invalid value {args.seeds}; use 1 or more")
    if args.seeds < 2:
        print("hvdtrain compare: with one seed per mode there is no interval, so no finding "
              "can be settled; use --seeds 5 or more", flush=True)
    if not 0 < args.target <= 1:
        raise ConfigError(f"--target: invalid value {args.target}; use an accuracy in (0, 1]")
    if args.epochs < 1:
        raise ConfigError(f"--epochs: invalid value {args.epochs}; use 1 or more")
    if args.eval_every_steps < 0:
        raise ConfigError(f"--eval-every-steps: invalid value {args.eval_every_steps}; use 0 "
                          "or more")
    if args.hostfile is not None and not Path(args.hostfile).is_file():
        raise ConfigError(f"--hostfile: {args.hostfile} is not a file; give an mpirun hostfile "
                          "(one 'HOST slots=N' line per host)")
    try:
        shlex.split(args.launcher_args)
    except ValueError as e:
        raise ConfigError(f"--launcher-args: {e}") from None
    for s in args.stragglers.split(","):
        try:
            parse_straggler(s)
        except ValueError as e:
            raise ConfigError(f"--stragglers: invalid condition {s!r}; {e}") from None
    if any(b < 0 for b in _ints(args.staleness_bounds, "--staleness-bounds")):
        raise ConfigError("--staleness-bounds: bounds must be 0 or more")
    if any(not 0 <= b < args.workers for b in _ints(args.backup_workers, "--backup-workers")):
        raise ConfigError(f"--backup-workers: each number must be 0 to {args.workers - 1} "
                          f"(fewer than the {args.workers} workers)")
    if any(h < 1 for h in _ints(args.local_steps, "--local-steps")):
        raise ConfigError("--local-steps: each number must be 1 or more")
    sweep = _ints(args.sweep_workers, "--sweep-workers")
    if any(n < 1 for n in sweep) or args.sweep_seeds < 1:
        raise ConfigError("--sweep-workers and --sweep-seeds: use whole numbers of 1 or more")
    if args.global_batch is not None:
        if args.global_batch < 1:
            raise ConfigError(f"--global-batch: invalid value {args.global_batch}; use a number "
                              "of samples, 1 or more")
        if args.simulate and args.global_batch % args.workers:
            raise ConfigError(f"--global-batch {args.global_batch} cannot be split evenly over "
                              f"--workers {args.workers}; use a multiple of {args.workers}")
    given = [x for x in (args.sim_step_ms, args.sim_apply_ms) if x is not None]
    # nan fails every comparison, so "x < 0" let it through
    if not all(x >= 0 and math.isfinite(x) for x in (args.sim_allreduce_ms, args.sim_push_ms,
                                                      *given)):
        raise ConfigError("--sim-allreduce-ms, --sim-push-ms, --sim-step-ms and --sim-apply-ms: "
                          "use 0 or more milliseconds (a finite number)")
    if not (args.run_timeout > 0 and math.isfinite(args.run_timeout)):
        raise ConfigError(f"--run-timeout: invalid value {args.run_timeout}; use a positive "
                          "number of seconds, e.g. 300")
    if given and not args.simulate:
        raise ConfigError("--sim-step-ms and --sim-apply-ms time the --simulate plan's workers; "
                          "add --simulate, or drop them")
    if given and args.sweep_workers.strip():
        raise ConfigError("--sim-step-ms and --sim-apply-ms fix the --simulate plan's figures, "
                          "but --sweep-workers measures each N's own batch; drop one of them")
    if args.simulate and (args.hostfile or args.launcher_args):
        raise ConfigError("--simulate runs in this one process: drop --hostfile and "
                          "--launcher-args, or drop --simulate")
    if not args.simulate:
        check_processes_fit(args, _planned_modes(args))
    check_writable_folder(args.out, "--out")
    check_train_args(args)


def check_train_args(args) -> None:
    """--train-args must be valid train flags that leave alone what the plan sets; checked here
    so that a mistake is one message, not every run failing the same way."""
    from ..cli import add_train_flags, config_from_args

    parser = argparse.ArgumentParser(prog="hvdtrain train", add_help=False, allow_abbrev=False,
                                     exit_on_error=False)
    add_train_flags(parser)
    try:
        given, unknown = parser.parse_known_args(shlex.split(args.train_args))
    except (argparse.ArgumentError, ValueError) as e:  # ValueError: an unclosed quote
        raise ConfigError(f"--train-args: {e}") from None
    if unknown:
        raise ConfigError(f"--train-args: unknown flag(s) {' '.join(unknown)}; see "
                          "hvdtrain train --help")
    for name, instead in PLANNED.items():
        if name in vars(given):
            raise ConfigError(f"--train-args: --{name.replace('_', '-')} is set by the plan for "
                              f"each run; use {instead}")
    given.dataset, given.model, given.epochs = args.dataset, args.model, args.epochs
    try:
        config_from_args(given)
    except ConfigError as e:
        raise ConfigError(f"--train-args: {e}") from None


def main(args) -> int:
    from . import plan as planning

    validate(args)
    modes = _planned_modes(args)
    train_args = ["--dataset", args.dataset, "--model", args.model, "--epochs", str(args.epochs),
                  "--checkpoint-every", "0", "--eval-every-steps", str(args.eval_every_steps),
                  # a run ends at its target: the epochs are a budget, not the length of a run
                  "--stop-at", f"test_acc>={args.target:g}", *shlex.split(args.train_args)]
    launcher = [*(["--hostfile", args.hostfile] if args.hostfile else []),
                *shlex.split(args.launcher_args)]
    runs = planning.plan(modes, list(range(args.seeds)), args.stragglers.split(","),
                         args.workers, train_args, launcher)
    out = Path(args.out)
    # Two compares into one folder would run the same plan twice and overwrite each other's
    # runs and report.
    lock = FolderLock(out, flag="--out")
    lock.acquire()
    try:
        return _run_plan(args, out, runs, modes)
    finally:
        lock.release()


def _simulated_args(args, train_args: list[str]) -> list[str]:
    """The train flags of the simulated plan's workers: with --global-batch, their share of it."""
    from .simulate import strong_scaling_args

    if not args.global_batch:
        return train_args
    return strong_scaling_args(train_args, args.workers, args.global_batch)


def _simulation_timing(args, train_args):
    from .simulate import measure_timing

    def seconds(ms):
        return None if ms is None else ms / 1000

    return measure_timing(train_args, allreduce_seconds=args.sim_allreduce_ms / 1000,
                          push_seconds=args.sim_push_ms / 1000,
                          step_seconds=seconds(args.sim_step_ms),
                          apply_seconds=seconds(args.sim_apply_ms))


def _simulate_plan(args, runs, modes, train_args, timing) -> list:
    """The plan's runs on the simulated cluster (--simulate), one result per planned run."""
    from .simulate import config_from_train_args, sweep

    batch = config_from_train_args(_simulated_args(args, train_args), {}).run.batch_size
    shared = (f"sharing a global batch of {args.global_batch}" if args.global_batch else
              f"a global batch of {batch * args.workers} (--global-batch keeps it fixed)")
    print(f"simulated cluster: {args.workers} virtual workers, {batch} samples a step each, "
          f"{shared}; a step computes in {timing.step_seconds * 1000:.1f} ms "
          f"({'--sim-step-ms' if args.sim_step_ms is not None else 'measured here'}) and the "
          f"server applies a gradient in {timing.apply_seconds * 1000:.2f} ms "
          f"({'--sim-apply-ms' if args.sim_apply_ms is not None else 'measured here'})",
          flush=True)
    done = []

    def show(result):
        done.append(result)
        reached = (f"reached {args.target:.0%} at {result.time_to_target:.2f} virtual s"
                   if result.time_to_target is not None else f"did not reach {args.target:.0%}")
        state = reached if result.status == "ok" else f"FAILED ({result.reason})"
        print(f"[{len(done)}/{len(runs)}] {result.name} (simulated): {state}", flush=True)

    return sweep(modes, [args.workers], train_args, args.target, timing,
                 stragglers=list(dict.fromkeys(r.straggler or "none" for r in runs)),
                 seeds=list(range(args.seeds)), eval_every_steps=args.eval_every_steps,
                 progress=show, global_batch=args.global_batch,
                 stop_at_target=True)  # as the real runs' --stop-at


def _sweep(args, modes, train_args, out: Path, timing) -> tuple[list, list[str]]:
    """--sweep-workers: the modes at each number of workers, simulated with the plan's global
    batch (strong scaling: weak scaling would run out of samples at a few dozen workers, and
    cut the steps of a fixed budget as 1/N), each run up to the target; (results, report
    lines)."""
    from .plots import write_sweep_plot
    from .report import sweep_table
    from .simulate import config_from_train_args, sweep

    counts = _ints(args.sweep_workers, "--sweep-workers")
    if not counts:
        return [], []
    plan = config_from_train_args(train_args, {}).run
    global_batch = args.global_batch or plan.batch_size * args.workers
    # The plan's budget: under strong scaling sync takes the same steps to the target at every
    # N (the same global batches and rate), so what suffices for the plan suffices here; a
    # mode that has not reached the target by then is slower than the plan allows.
    epochs = args.epochs
    sweep_args = list(train_args)
    plan_timing = timing
    if not plan.threads:
        # One thread per virtual worker, as each of several real workers on a host gets its
        # share of the cores (runtime.default_threads). It is also this process's fastest way
        # through the workers' small batches, one after another: several threads each would
        # spend more time in handing the work over than in computing it.
        sweep_args += ["--threads", "1"]
        plan_timing = None  # measured with another number of threads
    timings: dict = {}
    print(f"simulated sweep over {','.join(map(str, counts))} workers sharing a global batch of "
          f"{global_batch}, {args.sweep_seeds} seed(s) each, every run up to {args.target:.0%} "
          f"(at most {epochs} epochs) ...", flush=True)

    def show(result):
        reached = (f"{result.time_to_target:.2f} virtual s" if result.time_to_target is not None
                   else "not reached" if result.status == "ok" else f"FAILED ({result.reason})")
        print(f"  {result.name}: {reached}", flush=True)

    results = sweep(modes, counts, sweep_args, args.target,
                    _sweep_timing(args, sweep_args, global_batch, plan_timing, timings),
                    stragglers=[s.strip() for s in args.stragglers.split(",")],
                    seeds=list(range(args.sweep_seeds)), eval_every_steps=args.eval_every_steps,
                    progress=show, global_batch=global_batch, stop_at_target=True)
    write_sweep_plot(results, out / "sweep.png", args.target)
    return results, sweep_table(results, args.target, timings, global_batch, epochs,
                                plan.threads or 1)


def _sweep_timing(args, train_args, global_batch: int, plan_timing, measured: dict):
    """The sweep's Timing for N workers: a step's compute depends on the per-worker batch, so
    it is measured with N's batch, once per batch (``plan_timing``, if given, is the simulated
    plan's workers' batch's). ``measured`` collects each N's Timing, for the report."""
    from .simulate import config_from_train_args, strong_scaling_args

    plan_batch = config_from_train_args(_simulated_args(args, train_args), {}).run.batch_size
    by_batch = {plan_batch: plan_timing} if plan_timing else {}

    def timing(workers: int):
        batch = global_batch // workers
        if batch not in by_batch:
            by_batch[batch] = _simulation_timing(
                args, strong_scaling_args(train_args, workers, global_batch))
        measured[workers] = by_batch[batch]
        return measured[workers]
    return timing


def _run_plan(args, out: Path, runs, modes) -> int:
    from tqdm import tqdm

    from .plots import write_plots
    from .report import write_csv, write_report
    from .results import read_result
    from .runner import OUTPUT, last_lines, run_one

    print(f"hvdtrain compare: {len(runs)} runs ({', '.join(m.name for m in modes)}; "
          f"{args.seeds} seed(s); stragglers: {args.stragglers}) on {args.workers} workers, "
          f"{args.dataset}/{args.model}, {args.epochs} epochs each; into {out}", flush=True)
    results = []
    started = time.perf_counter()
    train_args = list(runs[0].train_args)
    # Measured once, so the simulated plan and the sweep run on the same clock (and the report
    # states one set of figures).
    timing = (_simulation_timing(args, _simulated_args(args, train_args))
              if args.simulate or args.sweep_workers.strip() else None)
    if args.simulate:
        results = _simulate_plan(args, runs, modes, train_args, timing)
        runs = []
    bar = tqdm(runs, unit="run", file=sys.stdout, dynamic_ncols=True, disable=None)
    for i, run in enumerate(bar, 1):
        bar.set_description(run.name)
        status = run_one(run, out, args.run_timeout, args.force)
        run_dir = out / "runs" / run.name
        if status["status"] != "ok":
            status["reason"] += f": {last_lines(run_dir / OUTPUT)}"
        result = read_result(run, run_dir, status, args.target)
        results.append(result)
        if status.get("skipped"):
            line = "skipped (finished earlier; --force runs it again)"
        elif result.status != "ok":
            line = f"FAILED ({result.reason}); output in {run_dir / OUTPUT}"
        else:
            reached = (f"reached {args.target:.0%} at {result.time_to_target:.2f} s"
                       if result.time_to_target is not None else f"did not reach {args.target:.0%}")
            line = (f"ok in {status['seconds']:.1f} s: test acc {result.final_test_acc:.4f}, "
                    f"{reached}")
        tqdm.write(f"[{i}/{len(runs)}] {run.name}: {line}", file=sys.stdout)
    bar.close()
    swept, sweep_lines = _sweep(args, modes, train_args, out, timing)
    write_csv(results + swept, out / "summary.csv")
    plots = write_plots(results, out, args.target) + (["sweep.png"] if swept else [])
    where = "launched with mpirun " + (f"across the hosts of {args.hostfile}" if args.hostfile
                                       else "on one host")
    if args.simulate:
        where = ("run on a SIMULATED cluster (one process, real gradients, a virtual clock; times "
                 "are virtual seconds)")
    shared = (f", the workers sharing a global batch of {args.global_batch}"
              if args.simulate and args.global_batch else "")
    description = (f"Plan {args.plan}: {args.workers} workers, {args.dataset}/{args.model}, "
                   f"{args.epochs} epochs, seeds 0..{args.seeds - 1}, an evaluation every "
                   f"{args.eval_every_steps} global steps; each mode with hvdtrain's "
                   "defaults (the async learning rate is not scaled by the number of workers, "
                   f"sync's is); {where}"
                   f"{' with ' + args.launcher_args if args.launcher_args else ''}{shared}. "
                   "Extra flags: "
                   f"{args.train_args or 'none'}.")
    report = write_report(results, out / "report.md", args.target, args.workers, description,
                          plots, sweep_lines)
    print("\n" + report.split("\n## Plots")[0].rstrip())
    failed = sum(r.status != "ok" for r in results)
    print(f"\ndone in {time.perf_counter() - started:.0f} s; {failed} failed run(s)."
          f"\nreport: {out / 'report.md'}\nsummary: {out / 'summary.csv'}"
          f"\nplots: {', '.join(str(out / p) for p in plots)}", flush=True)
    return 1 if failed else 0
