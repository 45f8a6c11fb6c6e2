"""The checks of ``hvdtrain compare``'s options that look past one flag (compare/options.py holds
the options themselves): whether the runs fit the hosts, whether --train-args suit every planned
mode, and the simulator's flags. All run on construction of a CompareConfig, before any run
starts, each with a message that names the flag and the fix. Each takes that CompareConfig as
``cfg`` (unannotated: options.py imports this module, so naming its class here would make a
cycle)."""

from __future__ import annotations

import argparse
import math
import os
import shlex
from pathlib import Path

from ..config import ConfigError
from ..config.cross_checks import ASYNC_RULES
from ..config.values import UnreadOption
from ..train_flags import config_from_args, parse_train_flags
from .plan import unread_tuning
from .measured_links import links_flag
from .sim.link import check_link_flags

# What the plan sets on every run's command line, and the compare flag to use instead: given in
# --train-args too, the later flag would silently win and the runs would no longer be the plan.
PLANNED = {"mode": "--modes", "staleness": "--staleness-bounds", "seed": "--seeds",
           "straggler": "--stragglers", "bsp": "--modes backup", "backup_workers":
           "--backup-workers", "local_steps": "--local-steps", "staleness_lr": "--modes async-slr",
           "dc_lambda": "--modes dcasgd", "outer_lr": "--outer-lr",
           "outer_momentum": "--outer-momentum", "balance": "--modes balanced",
           "eval_every_steps": "compare's own --eval-every-steps",
           "run_dir": "--out (each run writes into OUT/runs/NAME)",
           "num_servers": "--workers (each async run has one server besides the workers)",
           "dataset": "compare's own --dataset", "model": "compare's own --model",
           "epochs": "compare's own --epochs", "inject_faults": "--faults",
           "stop_at": "--target (every run stops at it)",
           "auto_resume": "--faults (sync runs restart with --auto-resume)",
           "round_staleness_weight": "the adiloco modes' own setting (weighted rounds, "
                                     "docs/async.md)"}

# The most processes a run may start per core of this host (per slot of a --hostfile, with
# --oversubscribe in --launcher-args): beyond that a run times the kernel's scheduler rather
# than the update schemes, and each process holds its own torch (hundreds of MB), so a mistyped
# --workers 100000 would start a job that swamps the machine. The demo runs 1.5 a core.
PROCESSES_PER_CORE = 4

# The --sim-*-ms flags: milliseconds on the simulated cluster's virtual clock.
SIM_FIGURES = ("sim_allreduce_ms", "sim_push_ms", "sim_step_ms", "sim_apply_ms", "sim_sample_ms")


def ints(text: str, flag: str) -> list[int]:
    try:
        return [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise ConfigError(f"{flag}: expected comma-separated whole numbers, got {text!r}") from None


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


def check_processes_fit(cfg, modes: list) -> None:
    """Refuse, before anything starts, a run of more processes than the hosts can hold: a
    real run is ``--workers`` processes, plus one parameter server for the async modes."""
    server = any(m.is_async for m in modes)
    processes = cfg.workers + server
    who = f"{cfg.workers} workers" + (" and the parameter server of the async modes"
                                      if server else "")
    if cfg.hostfile:
        slots = _hostfile_slots(cfg.hostfile)
        if slots is None:
            return
        # Without --oversubscribe mpirun itself refuses more processes than slots, in each run.
        oversubscribed = "--oversubscribe" in shlex.split(cfg.launcher_args)
        limit = slots * (PROCESSES_PER_CORE if oversubscribed else 1)
        room = f"the hosts of {cfg.hostfile} have {slots} slots" + (
            f" ({PROCESSES_PER_CORE} processes a slot with --oversubscribe)"
            if oversubscribed else "")
        more = f"add hosts or slots to {cfg.hostfile}"
    else:
        cores = os.cpu_count() or 1
        limit = cores * PROCESSES_PER_CORE
        room = (f"this host has {cores} cores, and more than {PROCESSES_PER_CORE} processes a "
                f"core would time its scheduler rather than the update schemes")
        more = "run across more hosts with --hostfile"
    if processes > limit:
        raise ConfigError(
            f"--workers {cfg.workers}: each run starts {processes} processes ({who}), but "
            f"{room}, room for {limit}: use --workers {limit - server} or fewer, {more}, or "
            f"simulate {cfg.workers} workers in one process with --simulate")


def check_train_args(cfg) -> None:
    """--train-args must be valid train flags that leave alone what the plan sets; checked here
    so that a mistake is one message, not every run failing the same way."""
    try:
        argv = shlex.split(cfg.train_args)
    except ValueError as e:  # an unclosed quote
        raise ConfigError(f"--train-args: {e}") from None
    given = parse_train_flags(argv, "--train-args")
    for name, instead in PLANNED.items():
        if name in vars(given):
            raise ConfigError(f"--train-args: --{name.replace('_', '-')} is set by the plan for "
                              f"each run; use {instead}")
    given.dataset, given.model, given.epochs = cfg.dataset, cfg.model, cfg.epochs
    if cfg.tracker and not cfg.simulate:  # what command.py adds to each run's flags
        given.tracker = cfg.tracker
    # Each planned mode's own options over the flags: a flag can suit some modes and not others
    # (--wire-dtype bf16 suits async and DiLoCo, not plain sync), and the message names the
    # modes it does not suit rather than letting their runs fail one by one.
    refused = {}
    modes = cfg.planned_modes()
    for mode in modes:
        own = {k: v for k, v in vars(given).items() if k not in unread_tuning(mode)}
        try:
            config_from_args(argparse.Namespace(**{**own, **mode.config_options()}))
        except UnreadOption as e:  # the plan sets the mode: its "add --mode async" is no fix
            refused[mode.name] = (f"{str(e).split(':', 1)[0]}: an option of the parameter "
                                  "server, which this mode has not: drop it"
                                  if e.option in ASYNC_RULES else str(e))
        except ConfigError as e:
            refused[mode.name] = str(e)
    if len(set(refused.values())) == 1 and len(refused) == len(modes):  # wrong under any mode
        raise ConfigError(f"--train-args: {next(iter(refused.values()))}")
    if refused:
        name, message = next(iter(refused.items()))
        raise ConfigError(f"--train-args under mode {name}: {message}; or leave "
                          f"{', '.join(refused)} out of --modes")


# What --from-run would not read: the run fixes its workers, model, data, flags and launch, and
# its replay is the simulator's at the run's own figures.
NOT_FROM_RUN = ("plan", "stragglers", "epochs", "eval_every_steps", "dataset", "model",
                "train_args", "workers", "hostfile", "launcher_args", "run_timeout", "force",
                "global_batch", "sim_allreduce_ms", "sim_push_ms", "sweep_seeds", "max_restarts",
                "link_mbit")
# What only simulated runs (--simulate, --sweep-workers) read.
SIMULATED_ONLY = ("global_batch", "sim_allreduce_ms", "sim_push_ms")


def check_unread(cfg, given: set[str]) -> None:
    """Refuse a compare flag, given (set away from its default), that this invocation would
    ignore: --workers 8 with --from-run answered for the run's 2 workers, and --global-batch
    64 on a real plan ran at --batch-size x --workers, each without a word."""
    def flag(name: str) -> str:
        return "--" + name.replace("_", "-")

    if cfg.from_run is not None:
        unread = [flag(name) for name in NOT_FROM_RUN if name in given]
        if unread:
            raise ConfigError(f"{', '.join(unread)}: --from-run answers for the run as it ran "
                              "(its workers, model, data, flags and stragglers), so this would "
                              "be ignored; drop it, or run a plan (--simulate with the run's "
                              "flags, to try others)")
        return
    simulated = cfg.simulate or bool(cfg.sweep_workers.strip())
    unread = [flag(name) for name in SIMULATED_ONLY if name in given and not simulated]
    if "sweep_seeds" in given and not cfg.sweep_workers.strip():
        unread.append("--sweep-seeds")
    if "link_mbit" in given and cfg.plan != "links":
        unread.append("--link-mbit")
    if unread:
        raise ConfigError(f"{', '.join(unread)}: read only by "
                          + ("--plan links" if unread == ["--link-mbit"] else
                             "--sweep-workers" if unread == ["--sweep-seeds"] else
                             "simulated runs (--simulate, --sweep-workers)")
                          + ", which this invocation has not; drop it, or add what reads it")


def check_simulation(cfg) -> None:
    """The simulator's flags (--simulate, --sweep-*, --global-batch, --sim-*, --links); sets
    cfg.measured to --links' doctor.json, read and checked."""
    sweep = ints(cfg.sweep_workers, "--sweep-workers")
    if any(n < 1 for n in sweep) or cfg.sweep_seeds < 1:
        raise ConfigError("--sweep-workers and --sweep-seeds: use whole numbers of 1 or more")
    if cfg.global_batch is not None:
        if cfg.global_batch < 1:
            raise ConfigError(f"--global-batch: invalid value {cfg.global_batch}; use a "
                              "number of samples, 1 or more")
        if cfg.simulate and cfg.global_batch % cfg.workers:
            raise ConfigError(f"--global-batch {cfg.global_batch} cannot be split evenly "
                              f"over --workers {cfg.workers}; use a multiple of "
                              f"{cfg.workers}")
    if cfg.sim_step_ms == 0:  # every run would reach its target at 0 s, and no ratio exists
        raise ConfigError("--sim-step-ms: a step takes time; give the milliseconds of one "
                          "worker's forward and backward pass, above 0, or drop it to measure")
    figures = [getattr(cfg, name) for name in SIM_FIGURES]
    # nan fails every comparison, so "value < 0" would let it through
    if not all(x >= 0 and math.isfinite(x) for x in figures if x is not None):
        raise ConfigError("--sim-allreduce-ms, --sim-push-ms, --sim-step-ms, "
                          "--sim-apply-ms and --sim-sample-ms: use 0 or more milliseconds "
                          "(a finite number)")
    if cfg.sim_sample_ms is not None and cfg.sim_step_ms is None:
        raise ConfigError("--sim-sample-ms is a part of --sim-step-ms: give --sim-step-ms "
                          "too, or drop it (a measured step measures its part per sample)")
    given = cfg.sim_step_ms is not None or cfg.sim_apply_ms is not None
    if given and not cfg.simulate:
        raise ConfigError("--sim-step-ms and --sim-apply-ms time the --simulate plan's "
                          "workers; add --simulate, or drop them")
    if given and cfg.sweep_workers.strip():
        raise ConfigError("--sim-step-ms and --sim-apply-ms fix the --simulate plan's "
                          "figures, but --sweep-workers measures each N's own batch; drop "
                          "one of them")
    check_link_flags(cfg.sim_link_mbit, cfg.sim_latency_ms, cfg.from_run is not None,
                     bool(cfg.simulate or cfg.sweep_workers.strip()))
    cfg.measured = links_flag(cfg)  # --links' doctor.json, read and checked
    if cfg.simulate and (cfg.hostfile or cfg.launcher_args):
        raise ConfigError("--simulate runs in this one process: drop --hostfile and "
                          "--launcher-args, or drop --simulate")
