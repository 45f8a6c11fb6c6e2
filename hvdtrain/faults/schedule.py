"""The text of --inject-faults: events separated by ';', each ``KIND:KEY=VALUE,...``.

    kill:rank=2,step=40             SIGKILL the process (as the kernel's OOM killer does)
    stop:rank=1,step=80,seconds=20  freeze the process (SIGSTOP) for 20 s, then go on (SIGCONT)
    slow:rank=1,steps=10-40,factor=4  steps 10 to 40 compute 4 times as long on that rank
    exception:rank=0,step=5         raise an error in the training loop

``rank`` is the world rank of a training process: in sync, elastic sync and pipeline runs every
rank (after an elastic reset, the process that holds that rank then); in async runs the workers,
ranks 0..W-1 (a server's loop has no step to fire at, so servers are not targets yet). ``step``
is the job's global step: the fault fires once its step-th step is done, on that rank. Several
events: ``kill:rank=2,step=40;slow:rank=1,steps=10-40,factor=4``. ';' separates events because
',' separates an event's keys."""

from __future__ import annotations

import math
from dataclasses import dataclass

KINDS = {"kill": {"rank", "step"}, "stop": {"rank", "step", "seconds"},
         "slow": {"rank", "steps", "factor"}, "exception": {"rank", "step"}}
FORMS = ("write it as kind:rank=R,step=S (kill, exception), stop:rank=R,step=S,seconds=T, or "
         "slow:rank=R,steps=A-B,factor=F, several separated by ';', e.g. "
         "kill:rank=2,step=40;slow:rank=1,steps=10-40,factor=4")


@dataclass(frozen=True)
class Fault:
    kind: str            # kill | stop | slow | exception
    rank: int
    step: int = 0        # kill, stop, exception: fires once the job's step-th step is done
    last_step: int = 0   # slow: steps step..last_step (counted from 1) are slowed
    seconds: float = 0.0  # stop: how long the process stays frozen
    factor: float = 1.0  # slow: a slowed step computes this many times as long

    @property
    def once(self) -> bool:
        """An event that fires once per job (slow is a condition over a range of steps)."""
        return self.kind != "slow"

    def text(self) -> str:
        """The event as it is written, the key of the record of fired faults."""
        if self.kind == "slow":
            return f"slow:rank={self.rank},steps={self.step}-{self.last_step},factor={self.factor:g}"
        extra = f",seconds={self.seconds:g}" if self.kind == "stop" else ""
        return f"{self.kind}:rank={self.rank},step={self.step}{extra}"

    def describe(self) -> str:
        """The event in words, for the log line when it fires."""
        if self.kind == "slow":
            return (f"slow rank {self.rank} by {self.factor:g}x over steps "
                    f"{self.step}-{self.last_step}")
        extra = f" for {self.seconds:g} s" if self.kind == "stop" else ""
        return f"{self.kind} rank {self.rank} at step {self.step}{extra}"


def check_within(faults: list[Fault], last_step: int, flag: str = "--inject-faults") -> None:
    """ValueError for an event whose step comes after the run's last step: it would never
    fire, and a test of recovery would pass without its fault."""
    late = [f for f in faults if f.step > last_step]
    if late:
        key = "steps" if late[0].kind == "slow" else "step"
        raise ValueError(f"{flag}: {late[0].text()} would never fire: this run's last step is "
                         f"{last_step} (the job's global steps, over every epoch); give a "
                         f"{key} of {last_step} or less, or more --epochs")


def parse_faults(text: str) -> list[Fault]:
    """The events of a schedule, in order; ``""`` or ``"none"``: none. ValueError says what is
    wrong and how to write it."""
    text = (text or "").strip()
    if text.lower() in ("", "none"):
        return []
    return [_event(part.strip()) for part in text.split(";") if part.strip()]


def _event(part: str) -> Fault:
    kind, colon, rest = part.partition(":")
    kind = kind.strip().lower()
    if not colon or kind not in KINDS:
        raise ValueError(f"{part!r} is not an event: its kind must be one of "
                         f"{', '.join(KINDS)}; {FORMS}")
    keys: dict[str, str] = {}
    for item in rest.split(","):
        key, eq, value = item.partition("=")
        key = key.strip().lower()
        if not eq or not key:
            raise ValueError(f"{part!r}: {item.strip()!r} is not KEY=VALUE; {FORMS}")
        if key in keys:  # the last would silently win: say which one the user meant
            raise ValueError(f"{part!r}: {key} is given twice ({key}={keys[key]} and "
                             f"{key}={value.strip()}); keep one")
        keys[key] = value.strip()
    if set(keys) != KINDS[kind]:
        missing, unknown = sorted(KINDS[kind] - set(keys)), sorted(set(keys) - KINDS[kind])
        wrong = "; ".join([*([f"missing {', '.join(missing)}"] if missing else []),
                           *([f"unknown {', '.join(unknown)}"] if unknown else [])])
        raise ValueError(f"{part!r}: {wrong} ({kind} takes the keys "
                         f"{', '.join(sorted(KINDS[kind]))}); {FORMS}")
    try:
        return _checked(kind, keys)
    except ValueError as e:
        raise ValueError(f"{part!r}: {e}; {FORMS}") from None


def _checked(kind: str, keys: dict[str, str]) -> Fault:
    rank = int(keys["rank"])
    if rank < 0:
        raise ValueError("rank must be 0 or more")
    if kind == "slow":
        first, dash, last = keys["steps"].partition("-")
        start, end = int(first), int(last if dash else first)
        factor = float(keys["factor"])
        if not 1 <= start <= end:
            raise ValueError("steps must be A-B with 1 <= A <= B")
        if not (factor >= 1 and math.isfinite(factor)):
            raise ValueError("factor must be a finite number of at least 1")
        return Fault(kind, rank, start, end, factor=factor)
    step = int(keys["step"])
    if step < 1:
        raise ValueError("step must be 1 or more (the fault fires once that many steps are done)")
    seconds = float(keys.get("seconds", 0))
    if kind == "stop" and not (seconds > 0 and math.isfinite(seconds)):
        raise ValueError("seconds must be a positive number")
    return Fault(kind, rank, step, seconds=seconds)
