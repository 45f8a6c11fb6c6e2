"""The comparison's modes, in one table, and the rule objects that a mode's (or a run's) options
build. A mode's name gives its scheme (sync or async), its ``hvdtrain train`` flags, the Config
options those flags set, and the rules of its server. The real server and the simulator both call
:func:`server_rules` on the Config's ``ps`` options, so they run the very same rule objects.

Adding a mode is one entry in ``FAMILIES`` (and, for a new option, a Mode field with its flag in
Mode.train_flags and Mode.config_options)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable

from .apply import Adjustment, ApplyStep
from .backup import BackupWorkers, check_backup_workers
from .bsp import LockStepRounds
from .dc_asgd import DelayCompensation
from .ssp import StalenessBound
from .staleness_lr import RoundWeight, StalenessWeight

DC_LAMBDA = 0.04  # the DC-ASGD strength the comparison uses (Zheng et al. 2017's default range)
# DiLoCo's outer step as in Douillard et al. 2023: the defaults of compare's --outer-lr and
# --outer-momentum for the diloco and adiloco modes
DILOCO_OUTER_LR = 0.7
DILOCO_OUTER_MOMENTUM = 0.9


@dataclass(frozen=True)
class Mode:
    """One row of the comparison: an update scheme and its settings, as ``hvdtrain train``
    flags. The simulator reads the same fields, so a mode means one thing in both."""

    name: str                    # sync, balanced, local4, diloco8, async, ssp2, backup1, dcasgd, ...
    scheme: str = "async"        # "sync" (Horovod) or "async" (parameter server)
    staleness: float = math.inf  # async: the SSP bound; 0 with bsp
    bsp: bool = False            # async: lock-step rounds through the server
    backup_workers: int = 0      # bsp: rounds close with the first N-b gradients
    staleness_lr: bool = False   # async: each step scaled by 1/max(1, staleness)
    dc_lambda: float = 0.0       # async: DC-ASGD delay compensation
    local_steps: int = 1         # sync: average the models every H steps (local SGD); async:
                                 # push a pseudo-gradient every H steps (async DiLoCo)
    outer_lr: float = 0.0        # local SGD: DiLoCo's outer Nesterov step (0: plain averaging)
    outer_momentum: float = 0.0  # DiLoCo: the outer step's momentum
    balance: bool = False        # sync: each worker's share of the global batch follows its speed
    round_staleness_weight: bool = True  # async DiLoCo: each round weighted (RoundWeight)

    @property
    def is_async(self) -> bool:
        return self.scheme == "async"

    def train_flags(self) -> list[str]:
        if not self.is_async:
            outer = (["--outer-lr", f"{self.outer_lr:g}", "--outer-momentum",
                      f"{self.outer_momentum:g}"] if self.outer_lr else [])
            return ["--mode", "sync", *(["--local-steps", str(self.local_steps)]
                                        if self.local_steps != 1 else []), *outer,
                    *(["--balance"] if self.balance else [])]
        # Nobody trains while worker 0 evaluates, as in sync mode: the time to target is read
        # on worker 0's training clock, which leaves the evaluations out.
        if self.bsp:
            return ["--mode", "async", "--eval-pauses-workers", "--bsp", "--backup-workers",
                    str(self.backup_workers)]
        bound = "inf" if math.isinf(self.staleness) else str(int(self.staleness))
        flags = ["--mode", "async", "--eval-pauses-workers", "--staleness", bound]
        if self.local_steps != 1:  # asynchronous DiLoCo: the server takes the outer step
            flags += ["--local-steps", str(self.local_steps), "--outer-lr",
                      f"{self.outer_lr:g}", "--outer-momentum", f"{self.outer_momentum:g}",
                      *([] if self.round_staleness_weight else
                        ["--no-round-staleness-weight"])]
        if self.staleness_lr:
            flags.append("--staleness-lr")
        if self.dc_lambda:
            flags += ["--dc-lambda", f"{self.dc_lambda:g}"]
        return flags

    def config_options(self) -> dict:
        """The Config options (flag names with underscores) that train_flags set, so that
        Config.validate refuses the same combinations."""
        if not self.is_async:
            return {"mode": "sync", "local_steps": self.local_steps, "outer_lr": self.outer_lr,
                    "outer_momentum": self.outer_momentum,
                    **({"balance": True} if self.balance else {})}
        # --bsp rounds have no staleness bound: its flags leave --staleness alone, and so do
        # these options (the round policy never reads it).
        return {"mode": "async", **({} if self.bsp else {"staleness": self.staleness}),
                "bsp": self.bsp, "backup_workers": self.backup_workers,
                "dc_lambda": self.dc_lambda, "staleness_lr": self.staleness_lr,
                **({"local_steps": self.local_steps, "outer_lr": self.outer_lr,
                    "outer_momentum": self.outer_momentum,
                    "round_staleness_weight": self.round_staleness_weight}
                   if self.local_steps != 1 else {})}

    def server_rules(self, num_workers: int) -> ServerRules:
        """The rule objects of this mode's parameter server (async modes)."""
        return server_rules(self, num_workers, self.local_steps)


@dataclass(frozen=True)
class Family:
    """A name that --modes takes. ``expand`` names the plan's list it expands over (one mode per
    value: ssp's bounds, backup's numbers of workers, local's steps), with the flag that gives
    the list and an example for the error when it is empty."""

    build: Callable[..., Mode]
    expand: tuple[str, str, str] | None = None


FAMILIES: dict[str, Family] = {
    "sync": Family(lambda: Mode("sync", scheme="sync")),
    # sync whose workers' shares of the global batch follow their measured speed (--balance,
    # rules/balance.py): the same update as sync, so only the time per round differs
    "balanced": Family(lambda: Mode("balanced", scheme="sync", balance=True)),
    "local": Family(lambda h: Mode(f"local{h}", scheme="sync", local_steps=h),
                    ("local_steps", "--local-steps", "a number of steps, e.g. 4")),
    "diloco": Family(lambda h: Mode(f"diloco{h}", scheme="sync", local_steps=h,
                                    outer_lr=DILOCO_OUTER_LR,
                                    outer_momentum=DILOCO_OUTER_MOMENTUM),
                     ("local_steps", "--local-steps", "a number of steps, e.g. 4")),
    "async": Family(lambda: Mode("async")),
    # asynchronous DiLoCo (Liu et al. 2024): H inner steps per push, the server's outer step
    "adiloco": Family(lambda h: Mode(f"adiloco{h}", local_steps=h, outer_lr=DILOCO_OUTER_LR,
                                     outer_momentum=DILOCO_OUTER_MOMENTUM),
                      ("local_steps", "--local-steps", "a number of steps, e.g. 8")),
    "ssp": Family(lambda s: Mode(f"ssp{s}", staleness=float(s)),
                  ("bounds", "--staleness-bounds", "a bound, e.g. 2")),
    "backup": Family(lambda b: Mode(f"backup{b}", staleness=0.0, bsp=True, backup_workers=b),
                     ("backups", "--backup-workers", "a number, e.g. 1")),
    "async-slr": Family(lambda: Mode("async-slr", staleness_lr=True)),
    "dcasgd": Family(lambda: Mode("dcasgd", dc_lambda=DC_LAMBDA)),
}
MODE_NAMES = ", ".join(FAMILIES)


def modes(names: list[str], bounds: list[int], backups: list[int] = (1,),
          local_steps: list[int] = (4,),
          outer: tuple[float, float] = (DILOCO_OUTER_LR, DILOCO_OUTER_MOMENTUM)) -> list[Mode]:
    """The named modes; ``ssp``, ``backup``, ``local``, ``diloco`` and ``adiloco`` expand to one
    mode per staleness bound, number of backup workers and number of local steps. ``outer``:
    the DiLoCo modes' outer learning rate and momentum."""
    lists = {"bounds": bounds, "backups": backups, "local_steps": local_steps}
    out: list[Mode] = []
    for name in names:
        family = FAMILIES.get(name)
        if family is None:
            raise ValueError(f"--modes: unknown mode {name!r}; use any of {MODE_NAMES}")
        if family.expand is None:
            out.append(family.build())
            continue
        values, flag, example = lists[family.expand[0]], family.expand[1], family.expand[2]
        if not values:
            raise ValueError(f"{flag}: {name} needs at least {example}")
        # a mode with an outer step (diloco, adiloco) takes the plan's
        out += [replace(m, outer_lr=outer[0], outer_momentum=outer[1]) if m.outer_lr else m
                for m in map(family.build, values)]
    if not out:
        raise ValueError(f"--modes: no mode given, so the plan is empty; name one or more of "
                         f"{MODE_NAMES}")
    return out


@dataclass(frozen=True)
class ServerRules:
    """A parameter server's rules: its round policy and its apply step."""

    policy: StalenessBound | LockStepRounds
    step: ApplyStep

    @property
    def weighs_by_staleness(self) -> bool:
        """--staleness-lr, or asynchronous DiLoCo's round weight: the mean weight is reported."""
        return any(isinstance(a, (StalenessWeight, RoundWeight)) for a in self.step.adjustments)


def server_rules(ps, num_workers: int, local_steps: int = 1) -> ServerRules:
    """The rule objects for the parameter-server options ``ps`` (a Config's ``cfg.ps``, or a
    Mode: both name them staleness, bsp, backup_workers, staleness_lr, round_staleness_weight
    and dc_lambda); ``local_steps``: H of asynchronous DiLoCo, whose pushes are rounds."""
    check_backup_workers(ps.backup_workers, num_workers)
    if ps.bsp:
        policy = (BackupWorkers(num_workers, ps.backup_workers) if ps.backup_workers
                  else LockStepRounds(num_workers))
    else:
        policy = StalenessBound(ps.staleness)
    adjustments: list[Adjustment] = []
    if ps.staleness_lr:
        adjustments.append(StalenessWeight())
    elif local_steps != 1 and ps.round_staleness_weight and not ps.bsp:
        adjustments.append(RoundWeight(num_workers))
    if ps.dc_lambda:
        adjustments.append(DelayCompensation(ps.dc_lambda))
    return ServerRules(policy, ApplyStep(adjustments))
