"""The runs of a comparison: every (straggler condition, mode, seed), as mpirun command lines."""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Mode:
    name: str          # "sync", "async" (no staleness bound) or "ssp2" (bound 2)
    staleness: float   # inf for async; unused for sync

    @property
    def is_async(self) -> bool:
        return self.name != "sync"

    def train_flags(self) -> list[str]:
        if not self.is_async:
            return ["--mode", "sync"]
        bound = "inf" if math.isinf(self.staleness) else str(int(self.staleness))
        return ["--mode", "async", "--staleness", bound]


def modes(names: list[str], bounds: list[int]) -> list[Mode]:
    """``sync``, ``async`` and ``ssp`` (expanded to one mode per staleness bound)."""
    out: list[Mode] = []
    for name in names:
        if name == "sync":
            out.append(Mode("sync", 0.0))
        elif name == "async":
            out.append(Mode("async", math.inf))
        elif name == "ssp":
            if not bounds:
                raise ValueError("--staleness-bounds: ssp needs at least one bound, e.g. 2")
            out += [Mode(f"ssp{b}", float(b)) for b in bounds]
        else:
            raise ValueError(f"--modes: unknown mode {name!r}; use sync, async and ssp")
    if not out:
        raise ValueError("--modes: no mode given, so the plan is empty; name one or more of "
                         "sync, async and ssp")
    return out


@dataclass(frozen=True)
class PlannedRun:
    name: str
    mode: Mode
    seed: int
    straggler: str      # "" for none
    processes: int      # workers, plus the server for async modes
    train_args: tuple[str, ...] = field(default=())

    def command(self, python: str, run_dir: str, cores: int | None = None) -> list[str]:
        cores = cores or os.cpu_count() or 1
        launch = ["mpirun", "-np", str(self.processes)]
        if self.processes > cores:
            launch.append("--oversubscribe")
        return [*launch, python, "-m", "hvdtrain", "train", *self.mode.train_flags(),
                "--seed", str(self.seed), "--run-dir", run_dir, "--no-progress",
                *(["--straggler", self.straggler] if self.straggler else []), *self.train_args]


def plan(mode_list: list[Mode], seeds: list[int], stragglers: list[str], workers: int,
         train_args: list[str]) -> list[PlannedRun]:
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
                runs.append(PlannedRun(name, mode, seed, straggler, processes, tuple(train_args)))
    return runs
