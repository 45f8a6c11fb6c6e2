"""The run's two clocks: wall seconds since training started, and training seconds, which leave
out the time spent evaluating, so that frequent evaluations do not slow the clock that a
time-to-accuracy figure is read on."""

from __future__ import annotations

import time
from typing import Callable, TypeVar

T = TypeVar("T")


class TrainingClock:
    def __init__(self) -> None:
        self.started = 0.0
        self.eval_seconds = 0.0  # spent evaluating since `started`: not training time

    def start(self) -> None:
        self.started = time.perf_counter()

    def now(self) -> tuple[float, float]:
        """(wall seconds since training started, training seconds: the evaluations' left out)."""
        wall = time.perf_counter() - self.started
        return wall, wall - self.eval_seconds

    def timed(self, evaluate: Callable[[], T]) -> tuple[T, float, float]:
        """(evaluate(), wall seconds when it started, training seconds by then): the time of an
        evaluation is the moment its weights were taken, and its own duration is kept out of the
        training time."""
        before, evaluated = self.eval_seconds, time.perf_counter()
        result = evaluate()
        self.eval_seconds += time.perf_counter() - evaluated
        wall = evaluated - self.started
        return result, wall, wall - before
