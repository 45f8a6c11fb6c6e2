"""Confidence intervals for the comparison: the percentile bootstrap over seeds (numpy does the
resampling), of a mode's mean and of its mean's ratio to another's, and the rule that names a
winner only when two intervals do not overlap."""

from __future__ import annotations

import numpy as np

CONFIDENCE = 0.95


# The fewest runs whose interval says something: with two, every resample's mean lies between
# them, so the percentile interval is just the two runs' range, and two runs that differ by
# chance "separate" from two others as often as not.
MIN_RUNS = 3


def bootstrap_ci(values: list[float], confidence: float = CONFIDENCE, resamples: int = 10_000,
                 seed: int = 0) -> tuple[float, float, float] | None:
    """(mean, low, high): the mean of ``values`` and its percentile-bootstrap interval. None for
    no values; with one value the interval is that value (one run says nothing of the spread,
    and the report says how many runs each row has). Seeded, so a report reads the same twice."""
    data = np.asarray(values, dtype=float)
    if data.size == 0:
        return None
    mean = float(data.mean())
    if data.size == 1:
        return mean, mean, mean
    rng = np.random.default_rng(seed)
    means = rng.choice(data, size=(resamples, data.size), replace=True).mean(axis=1)
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return mean, float(low), float(high)


def ratio_ci(numerator: list[float], denominator: list[float], confidence: float = CONFIDENCE,
             resamples: int = 10_000, seed: int = 0) -> tuple[float, float, float] | None:
    """(ratio, low, high): mean(numerator) / mean(denominator), e.g. a mode's time to target over
    sync's, and its percentile-bootstrap interval, the two samples resampled independently (the
    modes' runs are separate jobs: a seed fixes the data order and start, not the machine's
    noise). "At most 1/5 of sync's time, settled" reads its top, which is narrower than setting
    one mode's interval top against the other's bottom. None when either side is empty or the
    denominator's mean is not positive."""
    top, bottom = np.asarray(numerator, dtype=float), np.asarray(denominator, dtype=float)
    if top.size == 0 or bottom.size == 0 or not bottom.mean() > 0:
        return None
    rng = np.random.default_rng(seed)
    ratios = (rng.choice(top, size=(resamples, top.size), replace=True).mean(axis=1)
              / rng.choice(bottom, size=(resamples, bottom.size), replace=True).mean(axis=1))
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(ratios, [tail, 100 - tail])
    return float(top.mean() / bottom.mean()), float(low), float(high)


def separated(a: tuple[float, float, float], b: tuple[float, float, float]) -> bool:
    """Whether two (mean, low, high) intervals do not overlap."""
    return a[2] < b[1] or b[2] < a[1]
