"""The comparison's summary CSV and Markdown report: one table row per (straggler, mode), and a
finding stated from the measured numbers, whatever they say."""

from __future__ import annotations

import csv
import statistics
from collections import defaultdict
from pathlib import Path

from ..stragglers import parse_straggler
from .results import RunResult


def write_csv(results: list[RunResult], path: Path) -> None:
    rows = [r.row() for r in results]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def _mean_std(values: list[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else None)


def _fmt(mean: float | None, std: float | None, digits: int = 2) -> str:
    if mean is None:
        return "-"
    return f"{mean:.{digits}f}" + (f" ± {std:.{digits}f}" if std is not None else "")


def summarize(results: list[RunResult]) -> dict[tuple[str, str], dict]:
    """(straggler, mode) -> figures across seeds, in plan order."""
    groups: dict[tuple[str, str], list[RunResult]] = defaultdict(list)
    for r in results:
        groups[(r.straggler, r.mode)].append(r)
    out = {}
    for key, runs in groups.items():
        ok = [r for r in runs if r.status == "ok"]
        reached = [r.time_to_target for r in ok if r.time_to_target is not None]
        out[key] = {
            "runs": len(runs), "ok": len(ok), "reached": len(reached),
            "failed": [r for r in runs if r.status != "ok"],
            "time": _mean_std(reached),
            "acc": _mean_std([r.final_test_acc for r in ok if r.final_test_acc is not None]),
            "rate": _mean_std([r.samples_per_sec for r in ok if r.samples_per_sec]),
            "staleness": _mean_std([r.mean_staleness for r in ok if r.mean_staleness is not None]),
        }
    return out


def finding(summary: dict[tuple[str, str], dict], straggler: str, target: float) -> str:
    """Which mode reached the target first under this straggler condition, against sync."""
    rows = {mode: s for (st, mode), s in summary.items() if st == straggler}
    label = ("without a straggler" if straggler == "none" else
             f"with straggler {straggler} ({parse_straggler(straggler).describe()})")
    complete = {m: s for m, s in rows.items() if s["runs"] and s["reached"] == s["runs"]}
    missing = [m for m in rows if m not in complete]
    note = (f" Not every run of {', '.join(missing)} reached {target:.0%} (see the table), so "
            "those modes are not ranked." if missing else "")
    if not complete:
        return f"- {_capitalized(label)}: no mode reached {target:.0%} in every run.{note}"
    ranked = sorted(complete, key=lambda m: complete[m]["time"][0])
    best = ranked[0]
    parts = [f"{m} {complete[m]['time'][0]:.2f} s" for m in ranked]
    text = f"- {_capitalized(label)}: time to {target:.0%} test accuracy, fastest first: " \
           f"{', '.join(parts)}."
    if "sync" in complete and best != "sync":
        ratio = complete["sync"]["time"][0] / complete[best]["time"][0]
        text += f" **{best} beats sync** ({ratio:.2f}x sooner)."
    elif best == "sync" and len(ranked) > 1:
        runner_up = ranked[1]
        ratio = complete[runner_up]["time"][0] / complete["sync"]["time"][0]
        text += f" **sync is fastest**; {runner_up} took {ratio:.2f}x as long."
    spread = [complete[m]["time"][1] for m in ranked[:2] if complete[m]["time"][1] is not None]
    if len(ranked) > 1 and spread:
        gap = complete[ranked[1]]["time"][0] - complete[best]["time"][0]
        if gap < max(spread):
            text += (f" The gap between the first two ({gap:.2f} s) is within one standard "
                     "deviation across seeds, so this ranking is not settled by these runs.")
    return text + note


def _capitalized(text: str) -> str:
    return text[:1].upper() + text[1:]  # str.capitalize would lower "Pareto"


def conditions_in_words(conditions: list[str]) -> list[str]:
    """One Markdown line per straggler condition of the table, saying what it does."""
    models = {c: parse_straggler(c) for c in conditions}
    lines = ["Straggler conditions (the table's first column):", ""]
    lines += [f"- `{c}`: {m.describe()}." for c, m in models.items()]
    if any(m.kind not in ("none", "last") for m in models.values()):
        lines += ["", ("The random conditions draw from each run's seed, so the seeds differ "
                       "also in which steps and workers are slowed, and every mode sees the same "
                       "draws for a seed.")]
    return lines


def write_report(results: list[RunResult], path: Path, target: float, workers: int,
                 description: str, plots: list[str]) -> str:
    summary = summarize(results)
    conditions = list(dict.fromkeys(r.straggler for r in results))
    lines = [
        "# Sync vs async: which reaches the target accuracy sooner, here?", "",
        description, "",
        *conditions_in_words(conditions), "",
        f"Target: {target:.0%} test accuracy. Time to target: seconds of training (from the first "
        "step, start-up excluded) until the first epoch-end evaluation at or above the target; "
        "mean ± standard deviation over the seeds that reached it. Samples/s: every worker's "
        "training samples over the run's training wall time, evaluations included. Mean "
        f"staleness: over every gradient the server applied (sync is 0 by definition). Every mode "
        f"has {workers} workers; async and SSP runs add one parameter-server process.", "",
        "| straggler | mode | runs ok | reached target | time to target (s) | final test acc "
        "| samples/s | mean staleness |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (straggler, mode), s in summary.items():
        runs_ok = f"{s['ok']}/{s['runs']}" + (" (failed)" if s["failed"] else "")
        lines.append(
            f"| {straggler} | {mode} | {runs_ok} | {s['reached']}/{s['runs']} | "
            f"{_fmt(*s['time'])} | {_fmt(*s['acc'], digits=4)} | {_fmt(*s['rate'], digits=0)} | "
            f"{_fmt(*s['staleness'])} |")
    lines += ["", "## Finding", ""] + [finding(summary, c, target) for c in conditions]
    failed = [r for r in results if r.status != "ok"]
    if failed:
        lines += ["", "## Failed runs", ""] + [f"- {r.name}: {r.reason}" for r in failed]
    lines += ["", "## Plots", ""] + [f"![{p}]({p})" for p in plots]
    text = "\n".join(lines) + "\n"
    path.write_text(text)
    return text


def parse_table(text: str) -> list[dict[str, str]]:
    """The report's table back as dicts (used by the tests, and handy for scripts)."""
    rows = [line for line in text.splitlines() if line.startswith("|")]
    header = [c.strip() for c in rows[0].strip("|").split("|")]
    return [dict(zip(header, (c.strip() for c in row.strip("|").split("|")))) for row in rows[2:]]
