"""Every option of ``hvdtrain compare``, as one documented dataclass.

Each field's ``metadata["help"]`` is its documentation and also its ``--flag`` help text, as in
config/ for ``hvdtrain train``. A CompareConfig is built from the parsed flags in one place
(:meth:`CompareConfig.from_args`); fields left unset take the named plan's values, and the whole
set is checked on construction, before any run starts, with a message that names the flag and
the fix (the checks that look past one flag: option_checks.py).
"""

from __future__ import annotations

import argparse
import math
import shlex
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ..config import ConfigError, check_faults, check_writable_folder
from ..faults.schedule import parse_faults
from ..rules.registry import DILOCO_OUTER_LR, DILOCO_OUTER_MOMENTUM, FAMILIES
from ..stragglers import parse_straggler
from . import plan as planning
from .option_checks import (check_processes_fit, check_simulation, check_train_args, check_unread,
                            ints)
from .sim.link import Link
from .target_metric import Target

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
    # links: the slow-link lab (link_lab.py): an MLP of 2.2M parameters (9 MB a float32 copy),
    # whose every exchange is most of a second at 100 Mbit/s, across two throttled namespace
    # hosts. DiLoCo needs more epochs than sync (comparison.md), and an evaluation inside a
    # round ends it early: evaluations every 8 steps suit --local-steps 4 and 8. Outer momentum
    # 0.5, not the paper's 0.9: 0.9 carries a round's step on for about 10 rounds, longer than
    # this problem's whole run (sync reaches 95% in about 50 steps, 7 rounds of 8), and the
    # DiLoCo modes then needed 2.5 to 3.8 times sync's samples; with 0.5, 1.0 to 1.3 times
    # (compare --simulate, comparison.md). Outer learning rate 0.5, not 0.7: in the lab at
    # 100 Mbit/s (5 and 4 seeds), async DiLoCo reached 95% in 22.5 s with 0.7 and 14.8 s with
    # 0.5, DiLoCo in 16.1 and 14.1 s (comparison.md, "The lab on an honest clock").
    "links": dict(modes="sync,diloco,adiloco", stragglers="none,3x", seeds=3, model="mlp",
                  train_args="--hidden 2048,1024", epochs=20, eval_every_steps=8,
                  outer_lr=0.5, outer_momentum=0.5),
}

def _opt(default: Any, help: str, type: type | None = None, choices: tuple | None = None) -> Any:
    """A field whose metadata carries its help text, its flag's type (the default's when not
    given; None for a switch) and its allowed values."""
    if type is None and not isinstance(default, bool):
        type = default.__class__
    return field(default=default, metadata={"help": help, "type": type, "choices": choices})


def _plans_help() -> str:
    return ("the defaults of --modes, --stragglers, --seeds, --epochs, --model, --train-args and "
            "--eval-every-steps: " + "; ".join(
                f"{name}: " + ", ".join(f"{k}={v}" for k, v in values.items())
                for name, values in PLANS.items()))


@dataclass
class CompareConfig:
    """What is compared (the plan), how its runs are launched, and the simulated cluster that
    can stand in for them. None: the named --plan's value."""

    # --- the plan: modes, conditions, seeds, each run's workload and budget
    plan: str = _opt("demo", _plans_help(), choices=tuple(sorted(PLANS)))
    modes: str | None = _opt(None, "any of sync; balanced (sync with --balance: each worker's "
                             "share of the global batch follows its measured speed); "
                             "local (local SGD, one mode per --local-steps); "
                             "diloco (local SGD with DiLoCo's outer Nesterov step, "
                             "--outer-lr and --outer-momentum, one mode per --local-steps); "
                             "adiloco (asynchronous DiLoCo through the server, the same); "
                             "async (no staleness bound); ssp (one mode per --staleness-bounds); "
                             "backup (sync through the server with backup workers, one mode per "
                             "--backup-workers); async-slr (the staleness-aware learning rate); "
                             "dcasgd (delay compensation); elastic (sync under horovodrun "
                             "--gloo elastic, which trains on without a killed worker; with "
                             "--faults, on one host, 2 workers at most)", type=str)
    staleness_bounds: str = _opt("2", "SSP bounds, one run set per bound")
    backup_workers: str = _opt("1", "backup workers of the backup mode, one run set per number")
    local_steps: str = _opt("4", "steps between model averages of the local and diloco modes, "
                            "one run set per number")
    outer_lr: float | None = _opt(None, f"the diloco and adiloco modes' outer learning rate "
                                  f"(default {DILOCO_OUTER_LR:g}, as in the DiLoCo paper)",
                                  type=float)
    outer_momentum: float | None = _opt(None, f"the diloco and adiloco modes' outer Nesterov "
                                        f"momentum, in [0, 1) (default "
                                        f"{DILOCO_OUTER_MOMENTUM:g}, as in the paper; a run of "
                                        f"few rounds may want less: docs/comparison.md)",
                                        type=float)
    seeds: int | None = _opt(None, "seeds per mode (0, 1, ...)", type=int)
    stragglers: str | None = _opt(None, "straggler conditions (see hvdtrain train --help, "
                                  "--straggler): none; the last worker slowed, 3x or 50ms; one "
                                  "random worker slowed at a step with a probability, 3x@0.1; "
                                  "every worker waiting a random delay, exp:50ms or pareto:50ms",
                                  type=str)
    faults: str = _opt("", "run every run under this --inject-faults schedule (see hvdtrain train "
                       "--help), e.g. kill:rank=1,step=20: sync modes restart from their "
                       "checkpoint with --auto-resume when the job fails (up to --max-restarts "
                       "times, the failed attempts' time counted), async runs under mpirun's "
                       "recovery settings; the report adds goodput, the final model's samples "
                       "per second of the whole job, restarts included; not with "
                       "--simulate or --from-run, which inject no faults")
    max_restarts: int = _opt(3, "--faults: launches of a failed sync run after the first")
    link_mbit: str = _opt("1000,100", "--plan links: the rates in Mbit/s of the lab's link "
                          "between its two namespace hosts (tc tbf), one comparison per rate")
    target: str = _opt("test_acc>=0.95", "what every run races to, as --stop-at writes it: "
                       "NAME>=VALUE or NAME<=VALUE with NAME a test_ metric the runs report, "
                       "e.g. test_acc>=0.95, test_loss<=1.9 (a language model's token loss) or "
                       "a metric of your own workload; a bare number is a test accuracy "
                       "(0.95: test_acc>=0.95). Checked against the workload's metrics before "
                       "any run starts")
    epochs: int | None = _opt(None, "the budget of every run", type=int)
    eval_every_steps: int | None = _opt(None, "evaluate every N global steps (async: of the job, "
                                        "as worker 0 sees them), which times the target to "
                                        "within N steps (0: at epoch ends only)", type=int)
    dataset: str = _opt("digits", "the --dataset of every run (see hvdtrain train --help)")
    model: str | None = _opt(None, "the --model of every run (see hvdtrain train --help)",
                             type=str)
    train_args: str | None = _opt(None, "more hvdtrain train flags for every run, e.g. "
                                  "'--batch-size 64'; a transport's tuning (--chunk-mb, "
                                  "--fusion-threshold-mb) goes to the modes that read it",
                                  type=str)
    # --- the real runs: processes, hosts, where they write
    workers: int = _opt(2, "training processes in every run")
    out: str = _opt("runs/compare", "folder for the runs, report and plots")
    hostfile: str | None = _opt(None, "run every run across the hosts of this mpirun hostfile",
                                type=str)
    launcher_args: str = _opt("", "more mpirun flags for every run, e.g. --launcher-args "
                              "'--mca btl_tcp_if_include eth0 -x LD_LIBRARY_PATH'")
    run_timeout: float = _opt(300, "seconds before a run is stopped and recorded as failed",
                              type=float)
    force: bool = _opt(False, "run again even the finished runs")
    tracker: str = _opt("", "mlflow: log the comparison to MLflow, as a parent run with the "
                        "report, summary and plots as artifacts and each run of the plan as a "
                        "child run (hvdtrain train --tracker mlflow), in OUT/mlflow.db unless "
                        "MLFLOW_TRACKING_URI is set")
    # --- a finished run replayed (compare/from_run.py)
    from_run: str | None = _opt(None, "instead of a plan, answer from a finished run: fit its "
                                "workers' step times (each one's persistent speed and random "
                                "delays) and replay every mode (default: one of each family; "
                                "or --modes) with its model, data and flags on the simulated "
                                "cluster, --seeds seeds each, to --target (a metric the run "
                                "evaluated, capped at the best value of it the run reached: "
                                "the highest accuracy, the lowest loss); prints the predicted "
                                "time to target "
                                "per mode with intervals and a recommendation, and writes them "
                                "into a new folder under OUT/from-run", type=str)
    # --- the simulated cluster (--simulate) and the sweep over workers
    simulate: bool = _opt(False, "run the plan on a simulated cluster instead of launching it: "
                          "real gradients of the real model and data in this one process, on a "
                          "virtual clock where each worker's step takes the compute time "
                          "measured here plus the straggler's draws (compare/sim/); e.g. "
                          "--workers 64")
    sweep_workers: str = _opt("", "also simulate the plan's modes and stragglers at these numbers "
                              "of workers, e.g. 2,8,32,64, with --sweep-seeds seeds: a table and "
                              "sweep.png of time to target against workers")
    sweep_seeds: int = _opt(2, "seeds per point of the sweep")
    global_batch: int | None = _opt(None, "simulated runs (--simulate, --sweep-workers): the "
                                    "samples of one global step, split evenly over the workers, "
                                    "each worker's --lr scaled with its share (strong scaling: "
                                    "every N trains on the same global batches). Default: the "
                                    "sweep shares --batch-size x --workers; --simulate gives "
                                    "each worker --batch-size (weak scaling), which with many "
                                    "workers leaves few steps per epoch", type=int)
    sim_allreduce_ms: float = _opt(0.0, "simulated runs: milliseconds of each average over the "
                                   "workers (Timing.allreduce_seconds), charged once per round "
                                   "of sync and once per model average of local SGD, in series "
                                   "with the slowest worker's step; 0: an ideal network (one "
                                   "process cannot measure it; calibrate it from real runs)")
    sim_push_ms: float = _opt(0.0, "simulated async: milliseconds of each push and pull")
    sim_link_mbit: float | None = _opt(None, "simulated runs and --from-run: a link of this many "
                                       "Mbit/s prices every exchange by its bytes (the model's "
                                       "elements at the wire's bytes each): a sync average as "
                                       "a ring, 2(N-1)/N x bytes / bandwidth + 2(N-1) x "
                                       "latency; a push or a pull, its bytes over the server's "
                                       "one link after those queued before it, + latency. It "
                                       "wins over --sim-allreduce-ms and --sim-push-ms when "
                                       "both are given (--from-run: instead of the bandwidth "
                                       "fitted from the run's waits)", type=float)
    sim_latency_ms: float = _opt(0.0, "with --sim-link-mbit: milliseconds of latency of each "
                                 "message (a ring hop, a push, a pull); --from-run: the latency "
                                 "its fitted link assumes")
    links: str | None = _opt(None, "simulated runs and --from-run: a doctor.json (hvdtrain "
                             "doctor) whose measured links price the exchanges, instead of "
                             "--sim-link-mbit (docs/compare.md)", type=str)
    sim_step_ms: float | None = _opt(None, "--simulate: milliseconds of one worker's forward and "
                                     "backward pass, instead of the figure measured in this "
                                     "process, which drifts with the machine's load; give the "
                                     "figure an earlier run printed to compare invocations on "
                                     "one clock (default: measured)", type=float)
    sim_apply_ms: float | None = _opt(None, "--simulate: milliseconds of the server's update "
                                      "with one gradient (default: measured)", type=float)
    sim_sample_ms: float | None = _opt(None, "--simulate with --sim-step-ms: milliseconds that "
                                       "each sample of a step adds, the rest of --sim-step-ms "
                                       "being fixed per step (what a balanced share changes; "
                                       "default: the whole step grows with its samples)",
                                       type=float)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> CompareConfig:
        """The options of ``hvdtrain compare``'s parsed flags, checked."""
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls)})

    def __post_init__(self) -> None:
        check_unread(self, {f.name for f in fields(self) if getattr(self, f.name) != f.default})
        if self.from_run is not None and self.modes is None:  # every scheme, for one run's answer
            self.modes = ",".join(FAMILIES)
        plan = dict(PLANS[self.plan])
        if self.model is not None and self.model != plan["model"]:
            plan["train_args"] = ""  # the plan's model's own flags (its --channels) are not yours
        for key, value in plan.items():  # fill every option left unset
            if getattr(self, key) is None:
                setattr(self, key, value)
        if self.outer_lr is None:  # the plan's, else the paper's
            self.outer_lr = DILOCO_OUTER_LR
        if self.outer_momentum is None:
            self.outer_momentum = DILOCO_OUTER_MOMENTUM
        self._check_plan()
        self._check_elastic()
        self._check_launch()
        check_simulation(self)
        if self.from_run is not None:
            self._check_from_run()
        elif not self.simulate:
            check_processes_fit(self, self.planned_modes())
        check_writable_folder(self.out, "--out")
        check_train_args(self)
        if self.tracker:
            from ..trackers.build import check_installed
            if self.tracker != "mlflow":
                raise ConfigError(f"--tracker: {self.tracker!r} is not a tracker compare logs "
                                  f"to; use mlflow, or --train-args '--tracker wandb' for "
                                  f"each run alone")
            check_installed(["mlflow"])

    def planned_modes(self) -> list[planning.Mode]:
        names = [m.strip() for m in self.modes.split(",") if m.strip()]
        elastic = [planning.ELASTIC] if "elastic" in names else []
        names = [m for m in names if m != "elastic"]
        try:
            return (planning.modes(names, ints(self.staleness_bounds, "--staleness-bounds"),
                                   ints(self.backup_workers, "--backup-workers"),
                                   ints(self.local_steps, "--local-steps"),
                                   (self.outer_lr, self.outer_momentum))
                    if names or not elastic else []) + elastic
        except ValueError as e:
            raise ConfigError(str(e)) from None

    def _check_elastic(self) -> None:
        """Elastic sync runs under horovodrun on this machine's own host names (plan.py)."""
        if "elastic" not in [m.strip() for m in (self.modes or "").split(",")]:
            return
        limit = len(planning.ELASTIC_HOSTS)
        for wrong, fix in [(not self.faults, "add --faults SCHEDULE (without a fault elastic "
                                             "sync trains as sync does)"),
                           (self.workers > limit, f"use --workers {limit} or fewer (each "
                                                  "elastic worker needs a host name of its own "
                                                  "on this machine)"),
                           (self.hostfile is not None or self.simulate or
                            self.sweep_workers.strip(), "drop --hostfile, --simulate and "
                                                        "--sweep-workers")]:
            if wrong:
                raise ConfigError(f"--modes elastic: runs on this machine under --faults only; "
                                  f"{fix}, or drop elastic")

    def sim_seconds(self, name: str) -> float | None:
        """A --sim-*-ms figure in seconds (None: measure it)."""
        ms = getattr(self, f"sim_{name}_ms")
        return None if ms is None else ms / 1000

    def _check_plan(self) -> None:
        if self.workers < 1:
            raise ConfigError(f"--workers: invalid value {self.workers}; use 1 or more")
        if self.seeds < 1:
            raise ConfigError(f"--seeds: invalid value {self.seeds}; use 1 or more")
        try:
            self.goal = Target.parse(self.target)  # what the plan, report and simulator judge
        except ValueError as e:
            raise ConfigError(f"--target: invalid value {self.target!r}; {e}") from None
        if self.epochs < 1:
            raise ConfigError(f"--epochs: invalid value {self.epochs}; use 1 or more")
        if self.eval_every_steps < 0:
            raise ConfigError(f"--eval-every-steps: invalid value {self.eval_every_steps}; use 0 "
                              "or more")
        self._check_faults()
        if self.max_restarts < 0:
            raise ConfigError(f"--max-restarts: invalid value {self.max_restarts}; use 0 or more")
        for s in self.stragglers.split(","):
            try:
                parse_straggler(s)
            except ValueError as e:
                raise ConfigError(f"--stragglers: invalid condition {s!r}; {e}") from None
        if any(b < 0 for b in ints(self.staleness_bounds, "--staleness-bounds")):
            raise ConfigError("--staleness-bounds: bounds must be 0 or more")
        backup = "backup" in [m.strip() for m in (self.modes or "").split(",")]
        if backup and self.workers < 2:
            raise ConfigError(f"--modes backup: a backup worker is one of 2 or more workers; "
                              f"raise --workers (now {self.workers}) or drop backup")
        if backup and any(not 0 <= b < self.workers
                          for b in ints(self.backup_workers, "--backup-workers")):
            raise ConfigError(f"--backup-workers: each number must be 0 to {self.workers - 1} "
                              f"(fewer than the {self.workers} workers)")
        if any(h < 1 for h in ints(self.local_steps, "--local-steps")):
            raise ConfigError("--local-steps: each number must be 1 or more")
        if not (math.isfinite(self.outer_lr) and self.outer_lr > 0):
            raise ConfigError(f"--outer-lr: invalid value {self.outer_lr}; use a rate above 0 "
                              "(--modes local averages the models without an outer step)")
        if not 0 <= self.outer_momentum < 1:
            raise ConfigError(f"--outer-momentum: invalid value {self.outer_momentum}; use 0 "
                              "or more and below 1")

    def _check_faults(self) -> None:
        """Before any run starts: a run that refused its schedule's rank at its own start left
        the plan half done. The simulator and --from-run inject no faults, so --faults there
        would be ignored in silence."""
        check_faults(self.faults, "--faults")
        if not self.faults:
            return
        if self.simulate or self.from_run is not None:
            raise ConfigError("--faults: the simulator (--simulate) and --from-run inject no "
                              "faults; drop --faults there, or run the plan for real without "
                              "--simulate/--from-run")
        ranks = sorted({f.rank for f in parse_faults(self.faults) if f.rank >= self.workers})
        if ranks:
            raise ConfigError(f"--faults: rank {ranks[0]} is not a training process: each run "
                              f"has --workers {self.workers} (ranks 0..{self.workers - 1}); "
                              f"name a rank below {self.workers}")

    def _check_from_run(self) -> None:
        if not Path(self.from_run).is_dir():
            raise ConfigError(f"--from-run: {self.from_run} is not a folder; give the --run-dir "
                              "of a finished hvdtrain train run")
        if self.simulate or self.sweep_workers.strip():
            raise ConfigError("--from-run replays the run on the simulator by itself: drop "
                              "--simulate and --sweep-workers")

    def _check_launch(self) -> None:
        if self.hostfile is not None and not Path(self.hostfile).is_file():
            raise ConfigError(f"--hostfile: {self.hostfile} is not a file; give an mpirun "
                              "hostfile (one 'HOST slots=N' line per host)")
        try:
            shlex.split(self.launcher_args)
        except ValueError as e:
            raise ConfigError(f"--launcher-args: {e}") from None
        if not (self.run_timeout > 0 and math.isfinite(self.run_timeout)):
            raise ConfigError(f"--run-timeout: invalid value {self.run_timeout}; use a positive "
                              "number of seconds, e.g. 300")

    def sim_link(self) -> Link | None:
        """The ring's link (compare/sim/link.py): --links' or --sim-link-mbit's, or None."""
        if self.measured is not None:
            return self.measured.ring
        return None if self.sim_link_mbit is None else Link(self.sim_link_mbit,
                                                             self.sim_latency_ms / 1000)


def add_compare_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per CompareConfig field, its help the field's."""
    for f in fields(CompareConfig):
        kwargs: dict[str, Any] = {"default": f.default, "help": f.metadata["help"]}
        if f.metadata["type"] is None:
            kwargs["action"] = "store_true"
        else:
            kwargs["type"] = f.metadata["type"]
        if f.metadata["choices"]:
            kwargs["choices"] = f.metadata["choices"]
        parser.add_argument("--" + f.name.replace("_", "-"), **kwargs)
