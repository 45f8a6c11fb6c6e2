"""The options that study a run's behaviour under trouble: slowed workers, injected faults,
and the warning about a slow rank."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError, require
from ..stragglers import parse_straggler
from .values import check_faults, opt


@dataclass
class StudyOptions:
    """Stragglers and faults made on purpose, and the slow-rank warning."""

    straggler: str = opt("", "slow workers down, to study stragglers: 3x (the last worker's "
                         "steps take 3 times as long) or 50ms (it waits 50 ms per step); "
                         "3x@0.1 or 50ms@0.1 (at each step, with probability 0.1, one random "
                         "worker is slowed so); exp:50ms or pareto:50ms (every worker waits a "
                         "random delay with mean 50 ms at each step: exponential, or Pareto "
                         "with shape 1.5, heavy-tailed). Random draws follow --seed. A factor "
                         "stretches the worker's compute in proportion to its samples, as a "
                         "slower device does (--balance can remove it); a fixed delay is a "
                         "cost per step that no batch share removes")
    inject_faults: str = opt("", "inject faults, to test recovery: events separated by ';', "
                             "each kill:rank=R,step=S (SIGKILL, as an OOM kill), "
                             "stop:rank=R,step=S,seconds=T (the process frozen for T s), "
                             "slow:rank=R,steps=A-B,factor=F (steps A to B compute F times as "
                             "long) or exception:rank=R,step=S (an error in the loop). R: the "
                             "world rank of a training process (async: a worker, 0..W-1); S: "
                             "the job's global step, after which it fires, once per job (the "
                             "run folder and each checkpoint record it, so a resumed run, also "
                             "one into another --run-dir, does not fire it again); a step after "
                             "the run's last is refused")
    slow_rank_factor: float = opt(1.5, "warn about a worker whose median compute time per "
                                  "step is this many times the median of the others' "
                                  "(naming its rank, host and PID), once while it stays slow; "
                                  "every epoch line names it. 0: never warn")

    def check_study(self) -> None:
        require(self.slow_rank_factor == 0 or self.slow_rank_factor > 1, "--slow-rank-factor",
                self.slow_rank_factor, "use 0 (never warn) or a factor above 1, e.g. 1.5")
        try:
            parse_straggler(self.straggler)
        except ValueError as e:
            raise ConfigError(f"--straggler: invalid value {self.straggler!r}; {e}") from None
        check_faults(self.inject_faults)
