"""--straggler: which worker waits how long after a step, as arithmetic the training loop
(loop/hooks.py) sleeps and a simulator can replay draw for draw, and its text form."""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass


@dataclass(frozen=True)
class StragglerModel:
    """Which worker waits how long after a step: what ``--straggler`` asks for, as arithmetic.

    kind "last": the last worker, every step (the persistent straggler); "random": at each step,
    with ``probability``, one worker drawn at random (a transient one); "exp" and "pareto": every
    worker, every step, a random delay with mean ``seconds``. A slowed step lasts ``factor``
    times its own duration plus ``seconds``. :meth:`delay` is pure, so a simulator that calls it
    gets the very draws a real run sleeps."""

    kind: str = "none"          # none | last | random | exp | pareto
    factor: float = 1.0
    seconds: float = 0.0        # last/random: a fixed delay; exp/pareto: the mean delay
    probability: float = 1.0    # random: the chance, per step, that one worker is slowed

    # Below 2 the variance is infinite (rare delays dwarf the mean, the heavy tail that Dutta et
    # al. 2018 study); above 1 the mean exists, so "pareto:50ms" can mean 50 ms on average.
    PARETO_SHAPE = 1.5

    @property
    def active(self) -> bool:
        return self.kind != "none"

    def describe(self) -> str:
        """The condition in words, for reports."""
        slowed = (f"runs {self.factor:g}x slower" if self.factor != 1 else
                  f"waits {_ms(self.seconds)} more")
        if self.kind == "last":
            return f"the last worker {slowed} at every step"
        if self.kind == "random":
            return (f"at each step, with probability {self.probability:g}, one random worker "
                    f"{slowed}")
        if self.kind == "exp":
            return (f"every worker waits an exponential delay with mean {_ms(self.seconds)} at "
                    "each step")
        if self.kind == "pareto":
            return (f"every worker waits a heavy-tailed (Pareto, shape {self.PARETO_SHAPE:g}) "
                    f"delay with mean {_ms(self.seconds)} at each step")
        return "no worker is slowed"

    def slowed_worker(self, num_workers: int, global_step: int, seed: int) -> int | None:
        """The worker slowed at this step ("last" and "random"), or None. A random one is drawn
        from (seed, step) alone, so every rank gets the same answer without a message."""
        if self.kind == "last":
            return num_workers - 1
        if self.kind != "random" or _uniform("pick", seed, global_step) >= self.probability:
            return None
        return min(int(_uniform("who", seed, global_step) * num_workers), num_workers - 1)

    def delay(self, worker: int, num_workers: int, global_step: int, step_seconds: float,
              seed: int, work: float = 1.0) -> float:
        """Seconds ``worker`` waits after ``global_step`` (counted from 0), a step of ``work``
        times --batch-size samples, where a step of --batch-size samples computes for
        ``step_seconds``. The same arguments give the same answer, in any process.

        A factor is a device that is slower per sample: its extra time is
        ``(factor - 1) * step_seconds * work``, in proportion to the samples it computes, so a
        worker given a smaller share of the global batch (--balance) waits less, and at most
        ``factor`` times fewer samples per second than the others' is what it can do. A fixed
        delay (``50ms``) is a cost per step, such as a slow link, that no share removes."""
        if self.kind in ("last", "random"):
            if self.slowed_worker(num_workers, global_step, seed) != worker:
                return 0.0
            return (self.factor - 1) * step_seconds * work + self.seconds
        if self.kind in ("exp", "pareto"):
            u = _uniform(self.kind, seed, worker, global_step)
            if self.kind == "exp":
                return -self.seconds * math.log1p(-u)
            shape = self.PARETO_SHAPE
            return self.seconds * (shape - 1) / shape * (1 - u) ** (-1 / shape)  # Pareto type I
        return 0.0


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:g} ms"


def _uniform(*key: object) -> float:
    """A uniform number in (0, 1) that depends on ``key`` alone: no generator state to keep in
    step across ranks, a resume or a simulator that visits the steps in another order."""
    digest = hashlib.blake2b(":".join(map(str, key)).encode(), digest_size=8).digest()
    return ((int.from_bytes(digest, "big") >> 11) + 0.5) / 2 ** 53  # 53 bits: exact, never 0 or 1


STRAGGLER_FORMS = ("none, or a form such as 3x (the last worker takes 3 times as long per step), "
                   "50ms (it waits 50 ms per step), 3x@0.1 or 50ms@0.1 (at each step, with "
                   "probability 0.1, one random worker is slowed so), exp:50ms or pareto:50ms "
                   "(every worker waits a random delay with mean 50 ms at each step, exponential "
                   "or heavy-tailed); factors are at least 1, probabilities in (0, 1]")


def parse_straggler(text: str) -> StragglerModel:
    """``"3x"``: the last worker's steps take 3 times as long; ``"50ms"``: it waits 50 ms more
    per step; ``"3x@0.1"``: at each step, with probability 0.1, one random worker is slowed 3x;
    ``"exp:50ms"`` / ``"pareto:50ms"`` (or ``"heavy:50ms"``): every worker waits a random delay
    with mean 50 ms; ``""`` or ``"none"``: nothing. No commas: compare's --stragglers lists
    conditions with them."""
    text = (text or "").strip().lower()
    if text in ("", "none"):
        return StragglerModel()
    try:
        if ":" in text:
            kind, _, mean = text.partition(":")
            kind = {"exp": "exp", "pareto": "pareto", "heavy": "pareto"}[kind.strip()]
            seconds = _milliseconds(mean)
            if seconds > 0:
                return StragglerModel(kind, seconds=seconds)
        else:
            slow, at, probability = text.partition("@")
            p = float(probability) if at else 1.0
            if slow.strip().endswith("ms"):
                factor, seconds = 1.0, _milliseconds(slow)
            else:
                factor, seconds = _factor(slow), 0.0
            if 0 < p <= 1 and math.isfinite(factor) and seconds >= 0:
                if (factor, seconds) == (1.0, 0.0):
                    return StragglerModel()  # "1x", "0ms": nobody is slowed
                return StragglerModel("random" if at else "last", factor, seconds, p)
    except (KeyError, ValueError):
        pass
    raise ValueError(f"use {STRAGGLER_FORMS}")


def _milliseconds(text: str) -> float:
    text = text.strip()
    if not text.endswith("ms") or not math.isfinite(float(text[:-2])):
        raise ValueError(text)
    return float(text[:-2]) / 1000


def _factor(text: str) -> float:
    text = text.strip()
    if not text.endswith("x") or not float(text[:-1]) >= 1:
        raise ValueError(text)
    return float(text[:-1])
