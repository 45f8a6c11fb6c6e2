"""The runs of a comparison: every (straggler condition, mode, seed), as mpirun command lines."""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Mode:
    """One row of the comparison: an update scheme and its settings, as ``hvdtrain train``
    flags. The simulator (simulate.py) reads the same fields, so a mode means one thing in
    both."""

    name: str                    # sync, local4, async, ssp2, backup1, async-slr, dcasgd, ...
    scheme: str = "async"        # "sync" (Horovod) or "async" (parameter server)
    staleness: float = math.inf  # async: the SSP bound; 0 with bsp
    bsp: bool = False            # async: lock-step rounds through the server
    backup_workers: int = 0      # bsp: rounds close with the first N-b gradients
    staleness_lr: bool = False   # async: each step scaled by 1/max(1, staleness)
    dc_lambda: float = 0.0       # async: DC-ASGD delay compensation
    local_steps: int = 1         # sync: average the models every H steps (local SGD)
    outer_lr: float = 0.0        # local SGD: DiLoCo's outer Nesterov step (0: plain averaging)
    outer_momentum: float = 0.0  # DiLoCo: the outer step's momentum

    @property
    def is_async(self) -> bool:
        return self.scheme == "async"

    def train_flags(self) -> list[str]:
        if not self.is_async:
            outer = (["--outer-lr", f"{self.outer_lr:g}", "--outer-momentum",
                      f"{self.outer_momentum:g}"] if self.outer_lr else [])
            return ["--mode", "sync", *(["--local-steps", str(self.local_steps)]
                                        if self.local_steps != 1 else []), *outer]
        # Nobody trains while worker 0 evaluates, as in sync mode: the time to target is read
        # on worker 0's training clock, which leaves the evaluations out.
        if self.bsp:
            return ["--mode", "async", "--eval-pauses-workers", "--bsp", "--backup-workers",
                    str(self.backup_workers)]
        bound = "inf" if math.isinf(self.staleness) else str(int(self.staleness))
        flags = ["--mode", "async", "--eval-pauses-workers", "--staleness", bound]
        if self.staleness_lr:
            flags.append("--staleness-lr")
        if self.dc_lambda:
            flags += ["--dc-lambda", f"{self.dc_lambda:g}"]
        return flags


MODE_NAMES = "sync, local, diloco, async, ssp, backup, async-slr, dcasgd"
DC_LAMBDA = 0.04  # the DC-ASGD strength the comparison uses (Zheng et al. 2017's default range)
DILOCO_OUTER_LR = 0.7        # DiLoCo's outer step as in Douillard et al. 2023
DILOCO_OUTER_MOMENTUM = 0.9


def modes(names: list[str], bounds: list[int], backups: list[int] = (1,),
          local_steps: list[int] = (4,)) -> list[Mode]:
    """The named modes; ``ssp``, ``backup`` and ``local`` (and ``diloco``) expand to one mode
    per staleness bound, number of backup workers and number of local steps."""
    out: list[Mode] = []
    expand = {"ssp": (bounds, "--staleness-bounds", "a bound, e.g. 2"),
              "backup": (backups, "--backup-workers", "a number, e.g. 1"),
              "local": (local_steps, "--local-steps", "a number of steps, e.g. 4"),
              "diloco": (local_steps, "--local-steps", "a number of steps, e.g. 4")}
    for name in names:
        if name in expand and not expand[name][0]:
            _, flag, example = expand[name]
            raise ValueError(f"{flag}: {name} needs at least {example}")
        if name == "sync":
            out.append(Mode("sync", scheme="sync"))
        elif name == "local":
            out += [Mode(f"local{h}", scheme="sync", local_steps=h) for h in local_steps]
        elif name == "diloco":
            out += [Mode(f"diloco{h}", scheme="sync", local_steps=h, outer_lr=DILOCO_OUTER_LR,
                         outer_momentum=DILOCO_OUTER_MOMENTUM) for h in local_steps]
        elif name == "async":
            out.append(Mode("async"))
        elif name == "ssp":
            out += [Mode(f"ssp{b}", staleness=float(b)) for b in bounds]
        elif name == "backup":
            out += [Mode(f"backup{b}", staleness=0.0, bsp=True, backup_workers=b)
                    for b in backups]
        elif name == "async-slr":
            out.append(Mode("async-slr", staleness_lr=True))
        elif name == "dcasgd":
            out.append(Mode("dcasgd", dc_lambda=DC_LAMBDA))
        else:
            raise ValueError(f"--modes: unknown mode {name!r}; use any of {MODE_NAMES}")
    if not out:
        raise ValueError(f"--modes: no mode given, so the plan is empty; name one or more of "
                         f"{MODE_NAMES}")
    return out


@dataclass(frozen=True)
class PlannedRun:
    name: str
    mode: Mode
    seed: int
    straggler: str      # "" for none
    processes: int      # workers, plus the server for async modes
    train_args: tuple[str, ...] = field(default=())
    launcher_args: tuple[str, ...] = field(default=())  # --hostfile and the user's mpirun flags

    def command(self, python: str, run_dir: str, cores: int | None = None) -> list[str]:
        cores = cores or os.cpu_count() or 1
        launch = ["mpirun", "-np", str(self.processes), *self.launcher_args]
        # One host with more processes than cores: mpirun refuses without this. Across hosts
        # the hostfile's slots decide.
        if "--hostfile" not in self.launcher_args:
            if self.processes > cores:
                launch.append("--oversubscribe")
            if self.processes >= cores:
                # Every core is taken: a process waiting for a message must yield its core to
                # one that computes, not spin on it. Open MPI does so by itself only when
                # oversubscribed, so a sync run on exactly the cores would spin while an async
                # run on more processes yields: the modes would be timed under different rules.
                launch += ["--mca", "mpi_yield_when_idle", "1"]
        return [*launch, python, "-m", "hvdtrain", "train", *self.mode.train_flags(),
                "--seed", str(self.seed), "--run-dir", run_dir, "--no-progress",
                *(["--straggler", self.straggler] if self.straggler else []), *self.train_args]


def plan(mode_list: list[Mode], seeds: list[int], stragglers: list[str], workers: int,
         train_args: list[str], launcher_args: list[str] = ()) -> list[PlannedRun]:
    runs = []
    for straggler in stragglers:
        straggler = straggler.strip()
        straggler = "" if straggler.lower() in ("", "none") else straggler
        # A run's name is its folder: "exp:50ms" becomes "exp-50ms" (a colon upsets Windows
        # copies, scp and rsync, which read "host:path").
        slug = re.sub(r"[^\w.@-]", "-", straggler)
        for mode in mode_list:
            for seed in seeds:
                name = f"{mode.name}-seed{seed}" + (f"-straggler{slug}" if straggler else "")
                processes = workers + (1 if mode.is_async else 0)
                runs.append(PlannedRun(name, mode, seed, straggler, processes, tuple(train_args),
                                       tuple(launcher_args)))
    return runs
