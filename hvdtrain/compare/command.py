"""``hvdtrain compare``: plan, run, read, report, plot. Its options are options.py's
CompareConfig."""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

from ..exit_codes import EXIT_FAILED
from ..run_lock import FolderLock
from . import plan as planning
from .options import CompareConfig, add_compare_flags, ints
from .runner import stop_on_sigterm
from .stats import MIN_RUNS
from .target_metric import check_plan_target


def add_parser(commands) -> None:
    p = commands.add_parser(
        "compare", help="compare sync, async and SSP training: tables and plots",
        description="Launch sync (Horovod), async (parameter server, no staleness bound) and SSP "
                    "runs with the same workers, model, data and budget, for several seeds and "
                    "straggler conditions; write every run's log, a summary CSV, PNG plots and a "
                    "Markdown report into one folder. Finished runs are skipped when run again.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter, allow_abbrev=False)
    add_compare_flags(p)


def validate(args: argparse.Namespace) -> CompareConfig:
    """The parsed flags as a checked CompareConfig (ConfigError names the flag to fix)."""
    cfg = CompareConfig.from_args(args)
    if cfg.measured is not None and cfg.measured.warning():
        print(cfg.measured.warning(), flush=True)  # an unfit cluster's links are still measured
    if cfg.seeds < MIN_RUNS:
        print(f"hvdtrain compare: with {cfg.seeds} seed(s) per mode there is no interval (two "
              "runs' is only their range), so no finding can be settled; use --seeds 5 or more",
              flush=True)
    return cfg


def main(args: argparse.Namespace) -> int:
    cfg = validate(args)
    if cfg.from_run is not None:
        from .from_run_replay import main as answer_from_run

        return answer_from_run(cfg)
    modes = cfg.planned_modes()
    train_args = ["--dataset", cfg.dataset, "--model", cfg.model, "--epochs", str(cfg.epochs),
                  # --faults: a checkpoint every epoch, which a restarted sync run resumes
                  "--checkpoint-every", "1" if cfg.faults else "0",
                  "--eval-every-steps", str(cfg.eval_every_steps),
                  # a run ends at its target: the epochs are a budget, not the length of a run
                  "--stop-at", cfg.goal.stop_at(), *shlex.split(cfg.train_args)]
    if cfg.tracker and not cfg.simulate:
        train_args += ["--tracker", cfg.tracker]  # each run a child of the comparison's run
    launcher = [*(["--hostfile", cfg.hostfile] if cfg.hostfile else []),
                *shlex.split(cfg.launcher_args)]
    runs = planning.plan(modes, list(range(cfg.seeds)), cfg.stragglers.split(","),
                         cfg.workers, train_args, launcher, cfg.faults)
    # Before any run starts: a metric the workload does not report would fail every run at
    # its start (--stop-at), one after another.
    check_plan_target(cfg.goal, train_args, modes[0].config_options() if modes else {})
    if cfg.plan == "links":
        from .link_lab import check_lab
        check_lab(cfg)  # root, namespaces and tc, before any run starts
    out = Path(cfg.out)
    # Two compares into one folder would run the same plan twice and overwrite each other's
    # runs and report.
    lock = FolderLock(out, flag="--out")
    with stop_on_sigterm():
        lock.acquire()
        try:
            if cfg.plan == "links":
                from .link_lab import run_lab
                return run_lab(cfg, out, runs, modes, _run_plan)
            return _run_plan(cfg, out, runs, modes)
        finally:
            lock.release()


def _reading_mode(cfg: CompareConfig, train_args: list[str]):
    """The mode under which the simulated plan reads its train flags for what no mode changes
    (the batch, the rate, the budget, the measured step): sync's, unless a flag suits only the
    planned modes that are not sync (--outer-momentum-every and --dynamic-local-steps suit
    async DiLoCo alone, --wire-dtype bf16 not plain sync), then the first planned mode's.
    option_checks.check_train_args has made sure that every planned mode takes the flags."""
    from ..config import ConfigError
    from .sim.flat_model import config_from_train_args

    sync = planning.Mode("sync", scheme="sync")
    try:
        config_from_train_args(train_args, sync.config_options())
    except ConfigError:
        return cfg.planned_modes()[0]
    return sync


def _simulated_args(cfg: CompareConfig, train_args: list[str]) -> list[str]:
    """The train flags of the simulated plan's workers: with --global-batch, their share of it."""
    from .sim.sweep import strong_scaling_args

    if not cfg.global_batch:
        return train_args
    return strong_scaling_args(train_args, cfg.workers, cfg.global_batch,
                               _reading_mode(cfg, train_args))


def _simulation_timing(cfg: CompareConfig, train_args):
    from dataclasses import replace

    from .measured_links import server_link
    from .sim.timing import measure_timing

    timing = measure_timing(train_args, allreduce_seconds=cfg.sim_seconds("allreduce"),
                            push_seconds=cfg.sim_seconds("push"),
                            step_seconds=cfg.sim_seconds("step"),
                            apply_seconds=cfg.sim_seconds("apply"),
                            sample_seconds=cfg.sim_seconds("sample"), link=cfg.sim_link(),
                            under=_reading_mode(cfg, train_args))
    return replace(timing, server_link=server_link(cfg))


def _per_sample(timing, batch: int) -> str:
    """How the step's compute splits into a fixed part and a part per sample (what a --balance
    share changes), given or measured."""
    if timing.sample_seconds is None:
        return ", in proportion to its samples"
    fixed = timing.step_seconds - timing.sample_seconds * batch
    return f": {fixed * 1000:.2f} ms fixed + {timing.sample_seconds * 1e6:.2f} us a sample"


def _simulate_plan(cfg: CompareConfig, runs, modes, train_args, timing) -> list:
    """The plan's runs on the simulated cluster (--simulate), one result per planned run."""
    from .budget import sync_budget
    from .sim.flat_model import config_from_train_args
    from .sim.sweep import sweep

    simulated_args = _simulated_args(cfg, train_args)
    reading = _reading_mode(cfg, train_args)
    batch = config_from_train_args(simulated_args, reading.config_options()).run.batch_size
    budget = sync_budget(simulated_args, cfg.workers, reading)
    print(budget.warning(cfg.goal) or f"budget: {budget.describe()}", flush=True)
    shared = (f"sharing a global batch of {cfg.global_batch}" if cfg.global_batch else
              f"a global batch of {batch * cfg.workers} (--global-batch keeps it fixed)")
    print(f"simulated cluster: {cfg.workers} virtual workers, {batch} samples a step each, "
          f"{shared}; a step computes in {timing.step_seconds * 1000:.1f} ms "
          f"({'--sim-step-ms' if cfg.sim_step_ms is not None else 'measured here'}"
          f"{_per_sample(timing, batch)}) and the "
          f"server applies a gradient in {timing.apply_seconds * 1000:.2f} ms "
          f"({'--sim-apply-ms' if cfg.sim_apply_ms is not None else 'measured here'}); "
          f"{cfg.measured.describe() if cfg.measured else timing.describe_network()}",
          flush=True)
    done = []

    def show(result):
        done.append(result)
        reached = (f"reached {cfg.goal.short()} at {result.time_to_target:.2f} virtual s"
                   if result.time_to_target is not None else
                   f"did not reach {cfg.goal.short()}")
        state = reached if result.status == "ok" else f"FAILED ({result.reason})"
        print(f"[{len(done)}/{len(runs)}] {result.name} (simulated): {state}", flush=True)

    return sweep(modes, [cfg.workers], train_args, cfg.goal, timing,
                 stragglers=list(dict.fromkeys(r.straggler or "none" for r in runs)),
                 seeds=list(range(cfg.seeds)), eval_every_steps=cfg.eval_every_steps,
                 progress=show, global_batch=cfg.global_batch,
                 stop_at_target=True)  # as the real runs' --stop-at


def _sweep(cfg: CompareConfig, modes, train_args, out: Path, timing) -> tuple[list, list[str]]:
    """--sweep-workers: the modes at each number of workers, simulated with the plan's global
    batch (strong scaling: weak scaling would run out of samples at a few dozen workers, and
    cut the steps of a fixed budget as 1/N), each run up to the target; (results, report
    lines)."""
    from .plots import write_sweep_plot
    from .report import sweep_table
    from .sim.flat_model import config_from_train_args
    from .sim.sweep import sweep

    counts = ints(cfg.sweep_workers, "--sweep-workers")
    if not counts:
        return [], []
    plan = config_from_train_args(train_args,
                                  _reading_mode(cfg, train_args).config_options()).run
    global_batch = cfg.global_batch or plan.batch_size * cfg.workers
    # The plan's budget: under strong scaling sync takes the same steps to the target at every
    # N (the same global batches and rate), so what suffices for the plan suffices here; a
    # mode that has not reached the target by then is slower than the plan allows.
    epochs = cfg.epochs
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
          f"{global_batch}, {cfg.sweep_seeds} seed(s) each, every run up to {cfg.goal.short()} "
          f"(at most {epochs} epochs) ...", flush=True)

    def show(result):
        reached = (f"{result.time_to_target:.2f} virtual s" if result.time_to_target is not None
                   else "not reached" if result.status == "ok" else f"FAILED ({result.reason})")
        print(f"  {result.name}: {reached}", flush=True)

    results = sweep(modes, counts, sweep_args, cfg.goal,
                    _sweep_timing(cfg, sweep_args, global_batch, plan_timing, timings),
                    stragglers=[s.strip() for s in cfg.stragglers.split(",")],
                    seeds=list(range(cfg.sweep_seeds)), eval_every_steps=cfg.eval_every_steps,
                    progress=show, global_batch=global_batch, stop_at_target=True)
    write_sweep_plot(results, out / "sweep.png", cfg.goal)
    return results, sweep_table(results, cfg.goal, timings, global_batch, epochs,
                                plan.threads or 1)


def _sweep_timing(cfg: CompareConfig, train_args, global_batch: int, plan_timing, measured: dict):
    """The sweep's Timing for N workers: a step's compute depends on the per-worker batch, so
    it is measured with N's batch, once per batch (``plan_timing``, if given, is the simulated
    plan's workers' batch's). ``measured`` collects each N's Timing, for the report."""
    from .sim.flat_model import config_from_train_args
    from .sim.sweep import strong_scaling_args

    reading = _reading_mode(cfg, train_args)
    plan_batch = config_from_train_args(_simulated_args(cfg, train_args),
                                        reading.config_options()).run.batch_size
    by_batch = {plan_batch: plan_timing} if plan_timing else {}

    def timing(workers: int):
        batch = global_batch // workers
        if batch not in by_batch:
            by_batch[batch] = _simulation_timing(
                cfg, strong_scaling_args(train_args, workers, global_batch, reading))
        measured[workers] = by_batch[batch]
        return measured[workers]
    return timing


def _run_plan(cfg: CompareConfig, out: Path, runs, modes) -> int:
    from ..trackers.parent import start_parent
    from .plots import write_plots
    from .report import write_csv, write_report
    from .runner import check_no_other_plan

    if not (cfg.simulate or cfg.force):
        check_no_other_plan(runs, out)
    print(f"hvdtrain compare: {len(runs)} runs ({', '.join(m.name for m in modes)}; "
          f"{cfg.seeds} seed(s); stragglers: {cfg.stragglers}) on {cfg.workers} workers, "
          f"{cfg.dataset}/{cfg.model}, {cfg.epochs} epochs each; into {out}", flush=True)
    started = time.perf_counter()
    train_args = list(runs[0].train_args)
    # Measured once, so the simulated plan and the sweep run on the same clock (and the report
    # states one set of figures).
    timing = (_simulation_timing(cfg, _simulated_args(cfg, train_args))
              if cfg.simulate or cfg.sweep_workers.strip() else None)
    parent = start_parent(out, cfg) if cfg.tracker and not cfg.simulate else None
    if cfg.simulate:
        results = _simulate_plan(cfg, runs, modes, train_args, timing)
    else:
        results = _launch_runs(cfg, out, runs)
    swept, sweep_lines = _sweep(cfg, modes, train_args, out, timing)
    write_csv(results + swept, out / "summary.csv")
    plots = write_plots(results, out, cfg.goal) + (["sweep.png"] if swept else [])
    report = write_report(results, out / "report.md", cfg.goal, cfg.workers, _describe(cfg),
                          plots, sweep_lines)
    print("\n" + report.split("\n## Plots")[0].rstrip())
    failed = sum(r.status != "ok" for r in results)
    if parent:
        parent.finish([out / "report.md", out / "summary.csv", *(out / p for p in plots)],
                      failed)
    print(f"\ndone in {time.perf_counter() - started:.0f} s; {failed} failed run(s)."
          f"\nreport: {out / 'report.md'}\nsummary: {out / 'summary.csv'}"
          f"\nplots: {', '.join(str(out / p) for p in plots)}", flush=True)
    return EXIT_FAILED if failed else 0


def _launch_runs(cfg: CompareConfig, out: Path, runs) -> list:
    """The plan's real runs, one after another (finished ones skipped), one result each."""
    from tqdm import tqdm

    from .results import read_result
    from .runner import OUTPUT, last_lines, run_one

    results = []
    bar = tqdm(runs, unit="run", file=sys.stdout, dynamic_ncols=True, disable=None)
    for i, run in enumerate(bar, 1):
        bar.set_description(run.name)
        status = run_one(run, out, cfg.run_timeout, cfg.force, cfg.max_restarts)
        run_dir = out / "runs" / run.name
        if status["status"] != "ok":
            status["reason"] += f": {last_lines(run_dir / OUTPUT)}"
        result = read_result(run, run_dir, status, cfg.goal)
        results.append(result)
        if status.get("skipped"):
            line = "skipped (finished earlier; --force runs it again)"
        elif result.status != "ok":
            line = f"FAILED ({result.reason}); output in {run_dir / OUTPUT}"
        else:
            reached = (f"reached {cfg.goal.short()} at {result.time_to_target:.2f} s"
                       if result.time_to_target is not None else
                       f"did not reach {cfg.goal.short()}")
            final = ("-" if result.final_value is None else f"{result.final_value:.4f}")
            line = f"ok in {status['seconds']:.1f} s: {cfg.goal.label} {final}, {reached}"
        tqdm.write(f"[{i}/{len(runs)}] {run.name}: {line}", file=sys.stdout)
    bar.close()
    return results


def _outer_step(cfg: CompareConfig) -> str:
    """The DiLoCo modes' outer step, where the plan has one."""
    if not any(m.outer_lr for m in cfg.planned_modes()):
        return ""
    return (f", and the DiLoCo modes' outer step with learning rate {cfg.outer_lr:g} and "
            f"Nesterov momentum {cfg.outer_momentum:g}")


def _describe(cfg: CompareConfig) -> str:
    """The report's account of how the runs were made."""
    where = "launched with mpirun " + (f"across the hosts of {cfg.hostfile}" if cfg.hostfile
                                       else "on one host")
    if cfg.plan == "links":
        where = (f"launched with mpirun across two network-namespace hosts joined by a link "
                 f"throttled to {cfg.link_mbit} Mbit/s (tc tbf; compare/link_lab.py)")
    if cfg.simulate:
        where = ("run on a SIMULATED cluster (one process, real gradients, a virtual clock; times "
                 "are virtual seconds)")
    shared = (f", the workers sharing a global batch of {cfg.global_batch}"
              if cfg.simulate and cfg.global_batch else "")
    return (f"Plan {cfg.plan}: {cfg.workers} workers, {cfg.dataset}/{cfg.model}, "
            f"{cfg.epochs} epochs, seeds 0..{cfg.seeds - 1}, an evaluation every "
            f"{cfg.eval_every_steps} global steps; each mode with hvdtrain's "
            "defaults (the async learning rate is not scaled by the number of workers, "
            f"sync's is){_outer_step(cfg)}; {where}"
            f"{' with ' + cfg.launcher_args if cfg.launcher_args else ''}{shared}. "
            "Extra flags: "
            f"{cfg.train_args or 'none'}."
            + (f" The simulated exchanges are priced by the {cfg.measured.describe()}."
               if cfg.measured else "")
            + (f" Every run under the fault schedule `{cfg.faults}` (--faults); a failed sync "
               f"run restarted from its checkpoint up to {cfg.max_restarts} times." if cfg.faults
               else ""))
