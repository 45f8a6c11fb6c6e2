"""The run log's lines (loop/run_log.py) as a tracker takes them: the header as parameters,
figures as metrics at the run's global step, words (a stop line's reason) as tags.

Metric names are TensorBoard's tags (loop/tensorboard.py): ``train/loss``, ``test/acc``,
``epoch/lr``, ``eval/test_acc``, ``step/loss``; nested figures are flattened with ``/``:
``step_times/compute_p50/worker1``, ``scheme/staleness_histogram/2``. Values that are not
numbers are skipped, and so are positions and clocks (the step is the x axis already).
"""

from __future__ import annotations

import math
from typing import Any

from ..loop.tensorboard import NOT_PLOTTED, line_step, tag

SKIPPED = NOT_PLOTTED
# Lines that are no figures: the header (parameters), and the note of a resume that some epochs'
# lines were lost (their numbers, and why: tags; as metrics they would be points at a step)
WORDS_ONLY = ("header", "missing")
STEP_TIME_COUNTS = ("steps", "samples")  # counts of the step-time table, not times


def metrics_of(kind: str, fields: dict[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    if kind in WORDS_ONLY:
        return out
    for key, value in fields.items():
        if key in SKIPPED:
            continue
        if key == "step_times" and isinstance(value, dict):
            for name, values in value.items():
                if name not in STEP_TIME_COUNTS and isinstance(values, (list, tuple)):
                    _flatten(out, f"step_times/{name}",
                             {f"worker{i}": v for i, v in enumerate(values)})
        else:
            _flatten(out, tag(kind, key), value)
    return out


def _flatten(out: dict[str, float], name: str, value: Any) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(out, f"{name}/{k}", v)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _flatten(out, f"{name}/{i}", v)
    elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        out[name] = float(value)


def tags_of(kind: str, fields: dict[str, Any]) -> dict[str, str]:
    """The words of a stop or scheme line (why the run stopped, its target), and which epochs a
    missing line names."""
    if kind not in ("stop", "scheme", "missing"):
        return {}
    tags = {f"{kind}/{k}": v for k, v in fields.items() if isinstance(v, str)}
    if kind == "missing" and isinstance(fields.get("epochs"), list):
        tags["missing/epochs"] = ",".join(map(str, fields["epochs"]))
    return tags


def params_of(header: dict[str, Any]) -> dict[str, str]:
    """The header flattened to ``config/run/mode``-style names with text values, as MLflow's
    parameters are."""
    out: dict[str, str] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict) and value:
            for k, v in value.items():
                walk(f"{prefix}/{k}" if prefix else str(k), v)
        else:
            out[prefix] = str(value)

    walk("", header)
    return out
