"""The comparison's summary CSV and Markdown report: one table row per (straggler, mode), and a
finding stated from the measured numbers, whatever they say."""

from __future__ import annotations

import csv
import statistics
from collections import defaultdict
from pathlib import Path

from ..stragglers import parse_straggler
from .results import RunResult, final_value
from .stats import MIN_RUNS, bootstrap_ci, ratio_ci, separated
from .target_metric import Target


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


def _table_row(straggler: str, mode: str, s: dict) -> str:
    """One mode's row of the report's table, under one straggler condition."""
    runs_ok = f"{s['ok']}/{s['runs']}" + (" (failed)" if s["failed"] else "")
    samples = "-" if s["samples_vs_sync"] is None else f"{s['samples_vs_sync']:.2f}x"
    # sync against itself is 1 only where it has a time to target to compare with
    time_vs_sync = ("1" if s["reached"] else "-") if mode == "sync" else \
        interval_text(s["time_vs_sync"])
    return (f"| {straggler} | {mode} | {runs_ok} | {s['reached']}/{s['runs']} | "
            f"{interval_text(s['time_ci'])} | {time_vs_sync} | {samples} | "
            f"{_fmt(*s['final'], digits=4)} | "
            f"{_fmt(*s['rate'], digits=0)} | {_vs_sync(s)} | {_fmt(*s['staleness'])} |")


def interval_text(ci: tuple[float, float, float] | None, digits: int = 2) -> str:
    if ci is None:
        return "-"
    mean, low, high = ci
    return f"{mean:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


def ceiling(straggler: str, workers: int) -> float | None:
    """The most any scheme can gain in throughput over sync under a persistent k-times straggler
    among N workers: sync runs at the straggler's pace, N steps per k step-times, while at best
    the others never wait, N-1+1/k steps per step-time; the ratio is (k(N-1)+1)/N. None where the
    condition has no such closed form (a delay in ms, random slowdowns)."""
    model = parse_straggler(straggler)
    if not model.active:
        return 1.0
    if model.kind == "last" and not model.seconds:
        return (model.factor * (workers - 1) + 1) / workers
    return None


def final(r: RunResult, target: Target) -> float | None:
    """A run's last value of the target's metric (a row made without one: its accuracy)."""
    if r.final_value is not None:
        return r.final_value
    value = final_value(r.curve, target.metric)
    return r.final_test_acc if value is None and target.metric == "test_acc" else value


def summarize(results: list[RunResult], workers: int | None = None,
              target: Target | str | float = 0.95) -> dict[tuple[str, str], dict]:
    """(straggler, mode) -> figures across seeds, in plan order: means with 95% bootstrap
    intervals over the seeds (stats.py), and each mode against sync under the same condition;
    ``final`` is the last value of the ``target``'s metric."""
    target = Target.of(target)
    groups: dict[tuple[str, str], list[RunResult]] = defaultdict(list)
    for r in results:
        groups[(r.straggler, r.mode)].append(r)
    out = {}
    for key, runs in groups.items():
        ok = [r for r in runs if r.status == "ok"]
        reached = [r for r in ok if r.time_to_target is not None]
        times = [r.time_to_target for r in reached]
        out[key] = {
            "runs": len(runs), "ok": len(ok), "reached": len(reached),
            "failed": [r for r in runs if r.status != "ok"],
            "times": times, "time_ci": bootstrap_ci(times),
            # samples every worker trained on until the target: what staleness costs in work
            "samples_to_target": _mean_std([r.time_to_target * r.samples_per_sec for r in reached
                                            if r.samples_per_sec]),
            "final": _mean_std([v for v in (final(r, target) for r in ok) if v is not None]),
            "rate": _mean_std([r.samples_per_sec for r in ok if r.samples_per_sec]),
            "staleness": _mean_std([r.mean_staleness for r in ok if r.mean_staleness is not None]),
        }
    for (straggler, mode), s in out.items():
        sync = out.get((straggler, "sync"))
        both = sync and s["rate"][0] and sync["rate"][0]
        s["rate_vs_sync"] = s["rate"][0] / sync["rate"][0] if both else None
        both = sync and s["samples_to_target"][0] and sync["samples_to_target"][0]
        s["samples_vs_sync"] = (s["samples_to_target"][0] / sync["samples_to_target"][0]
                                if both else None)
        s["ceiling"] = ceiling(straggler, workers) if workers else None
        # time to target over sync's, with its interval: only where every run of both reached
        # it (a mean over the runs that did would flatter a mode that sometimes never gets there)
        s["time_vs_sync"] = (ratio_ci(s["times"], sync["times"]) if sync and mode != "sync"
                             and _complete(s) and _complete(sync) else None)
    return out


def _complete(s: dict) -> bool:
    return bool(s["runs"]) and s["reached"] == s["runs"]


def _vs_sync(s: dict) -> str:
    """Throughput against sync's, with the ceiling and the share of the possible gain kept."""
    ratio, top = s["rate_vs_sync"], s["ceiling"]
    if ratio is None:
        return "-"
    text = f"{ratio:.2f}x"
    if top is not None and top > 1:
        text += f" of {top:.2f}x ({(ratio - 1) / (top - 1):.0%} of the gain)"
    return text


def finding(summary: dict[tuple[str, str], dict], straggler: str,
            target: Target | str | float) -> str:
    """Which mode reached the target first under this straggler condition, against sync. A
    winner is named only when its 95% interval and the next one's do not overlap."""
    target = Target.of(target)
    rows = {mode: s for (st, mode), s in summary.items() if st == straggler}
    label = ("without a straggler" if straggler == "none" else
             f"with straggler {straggler} ({parse_straggler(straggler).describe()})")
    complete = {m: s for m, s in rows.items() if _complete(s)}
    missing = [m for m in rows if m not in complete]
    note = (f" Not every run of {', '.join(missing)} reached {target.short()} (see the table), so "
            "those modes are not ranked." if missing else "")
    if not complete:
        return f"- {_capitalized(label)}: no mode reached {target.short()} in every run.{note}"
    ranked = sorted(complete, key=lambda m: complete[m]["time_ci"][0])
    best = ranked[0]
    parts = [f"{m} {interval_text(complete[m]['time_ci'])} s" for m in ranked]
    text = (f"- {_capitalized(label)}: time to {target.describe()} (mean [95% interval]), "
            f"fastest first: {', '.join(parts)}.")
    if len(ranked) == 1:
        return text + note
    runner_up = ranked[1]
    first, second = complete[best], complete[runner_up]
    settled = _apart(first, second)
    if "sync" in complete and best != "sync":
        share = interval_text(complete[best]["time_vs_sync"])
        beats = _apart(first, complete["sync"])
        text += (f" **{best} beats sync**: it needs {share} of sync's time, and the "
                 "intervals separate." if beats else
                 f" {best} needs {share} of sync's time on average, but "
                 f"{_unsettled(first, complete['sync'])}, so **whether it beats sync is not "
                 "settled** by these runs.")
    elif best == "sync":  # (a target reached at 0 s has no ratio: "inf"x)
        ratio = complete[runner_up]["time_ci"][0] / max(complete["sync"]["time_ci"][0], 1e-12)
        text += (f" **sync is fastest**; {runner_up} took {ratio:.2f}x as long." if settled else
                 f" sync is fastest on average ({runner_up} took {ratio:.2f}x as long), but "
                 f"{_unsettled(first, second)}, so **the ranking is not settled** by these runs.")
    if best != "sync" and runner_up != "sync" and settled:
        share = interval_text(ratio_ci(complete[best]["times"], complete[runner_up]["times"]))
        text += (f" **{best} beats {runner_up}** too: it needs {share} of its time, and the "
                 "intervals separate.")
    elif best != "sync" and runner_up != "sync":
        text += (f" {best} and {runner_up} are not told apart ({_unsettled(first, second)})"
                 f"{_why_close(first, second, runner_up)}.")
    return text + note


def _single(a: dict, b: dict) -> bool:
    """Whether either mode has too few runs that reached the target for an interval."""
    return min(a["reached"], b["reached"]) < MIN_RUNS


def _apart(a: dict, b: dict) -> bool:
    """Whether two modes' times to target are told apart: their intervals separate."""
    return not _single(a, b) and separated(a["time_ci"], b["time_ci"])


def _unsettled(a: dict, b: dict) -> str:
    """Why two modes are not told apart, in words."""
    return (f"fewer than {MIN_RUNS} runs of a mode reached the target, too few for an interval "
            "(pass --seeds 5 or more)" if _single(a, b) else "their intervals overlap")


def _why_close(a: dict, b: dict, b_name: str) -> str:
    """What sets two modes' times to target close: a time is the samples to the target over
    the samples per second, so a faster mode that needs more samples gains less than its
    speed. Empty where a figure is missing."""
    rates, samples = (a["rate"][0], b["rate"][0]), (a["samples_to_target"][0],
                                                     b["samples_to_target"][0])
    if not all(rates) or not all(samples):
        return ""
    return (f": it trained {rates[0] / rates[1]:.2f}x {b_name}'s samples per second and needed "
            f"{samples[0] / samples[1]:.2f}x its samples to reach the target")


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


def write_report(results: list[RunResult], path: Path, target: Target | str | float,
                 workers: int, description: str, plots: list[str], extra: list[str] = ()) -> str:
    """The Markdown report; ``extra``: more sections (the simulated sweep), before the plots."""
    target = Target.of(target)
    summary = summarize(results, workers, target)
    conditions = list(dict.fromkeys(r.straggler for r in results))
    lines = [
        f"# Sync vs async: which reaches the target {target.title_word} sooner, here?", "",
        description, "",
        *conditions_in_words(conditions), "",
        f"Target: {target.describe()}. Time to target: seconds of training (from the first "
        "step; start-up and the evaluations' own time excluded) until the first evaluation "
        f"{target.side} the target; the mean over the seeds that reached it, with its 95% "
        "bootstrap interval over the seeds in brackets; against sync's, the ratio of the means "
        "with its bootstrap interval (where every run of both reached the target). Samples to "
        "target: every worker's "
        "training samples until then (samples/s times the time), against sync's: what "
        "staleness costs in work. "
        "Samples/s: every worker's training samples over the run's training time. Throughput "
        "vs sync: samples/s against sync's under the same condition; under a persistent k-times "
        "straggler no scheme whose steps cost what sync's cost can exceed the ceiling "
        "(k(N-1)+1)/N, and the share of the gain between 1x and the ceiling that the mode kept "
        "is given (over 100%: its steps cost less than sync's per sample, e.g. a push to a "
        "server on the same host against an allreduce, or balanced's larger shares on the fast "
        "workers, which spread a step's fixed part over more samples). Mean staleness: over "
        f"every gradient the server applied (sync is 0 by definition). Every mode has {workers} "
        "workers; async modes add parameter-server processes.", "",
        "| straggler | mode | runs ok | reached target | time to target (s) | time to target vs "
        f"sync | samples to target vs sync | final {target.metric.replace('_', ' ')} | "
        "samples/s | throughput vs sync | mean staleness |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [_table_row(straggler, mode, s) for (straggler, mode), s in summary.items()]
    lines += ["", "## Finding", ""] + [finding(summary, c, target) for c in conditions]
    failed = [r for r in results if r.status != "ok"]
    if failed:
        lines += ["", "## Failed runs", ""] + [f"- {r.name}: {r.reason}" for r in failed]
    lines += [*faults_table(results), *extra]
    lines += ["", "## Plots", ""] + [f"![{p}]({p})" for p in plots]
    text = "\n".join(lines) + "\n"
    path.write_text(text)
    return text


def faults_table(results: list[RunResult]) -> list[str]:
    """The report's section on runs under --faults: restarts and goodput per mode."""
    faulted = [r for r in results if r.restarts is not None]
    if not faulted:
        return []
    lines = ["", "## Under faults", "",
             "Goodput: the final model's samples (its global steps times the global batch; an "
             "elastic job's epochs' own counts once its world shrank) per "
             "second of the whole job: every attempt's wall time from launch to exit, start-up, "
             "the failed attempts and the work they lost included. A job that never finished "
             "has a goodput of 0. Restarts: launches after the first (sync runs resume their "
             "last checkpoint with --auto-resume; async and elastic runs stay in one launch).",
             "",
             "| mode | runs ok | restarts | goodput (samples/s) | samples/s while training | "
             "final test acc |", "|---|---|---|---|---|---|"]
    groups: dict[str, list[RunResult]] = defaultdict(list)
    for r in faulted:
        groups[r.mode].append(r)
    for mode, runs in groups.items():
        ok = [r for r in runs if r.status == "ok"]
        lines.append(
            f"| {mode} | {len(ok)}/{len(runs)} | "
            f"{_fmt(*_mean_std([float(r.restarts) for r in runs]), digits=1)} | "
            f"{_fmt(*_mean_std([r.goodput for r in runs if r.goodput is not None]), digits=0)}"
            f" | {_fmt(*_mean_std([r.samples_per_sec for r in ok if r.samples_per_sec]), 0)} | "
            f"{_fmt(*_mean_std([r.final_test_acc for r in ok if r.final_test_acc]), 4)} |")
    return lines


def sweep_table(results: list[RunResult], target: Target | str | float, timings: dict,
                global_batch: int, epochs: int, threads: int) -> list[str]:
    """The report's section on the simulated sweep: time to target per (straggler, workers,
    mode), on the virtual clock. ``timings``: the Timing of each number of workers; the workers
    share ``global_batch`` (strong scaling); ``epochs``: the runs' budget; ``threads``: each
    virtual worker's, with which its step was timed."""
    steps = "; ".join(f"{n} workers: {global_batch // n} per worker, {t.step_seconds * 1000:.1f} "
                      "ms" for n, t in sorted(timings.items()))
    first = timings[min(timings)] if timings else None  # the network's figures are constants
    network = ("" if first is None else
               f" The server applies a gradient in {first.apply_seconds * 1000:.2f} ms "
               f"(measured here); {first.describe_network()}.")
    lines = ["", "## Simulated sweep over workers", "",
             f"Simulated (compare/sim/): one process computes every virtual worker's real "
             f"gradients on a virtual clock. Strong scaling: the global batch stays "
             f"{global_batch} samples per step and the steps per epoch stay the same at every "
             f"number of workers N, each worker computing {global_batch}/N samples per step, "
             f"and each worker's learning rate is scaled with its batch so that sync's rate "
             f"(--lr x N, after warmup) is the plan's at every N. A step's compute, measured "
             f"here with each N's batch on {threads} thread(s): {steps or '-'}.{network} Every "
             f"run stops at the target (budget: {epochs} epochs). Times are virtual seconds to "
             f"{Target.of(target).short()}, mean [95% interval] over the seeds that reached it.",
             "",
             "| straggler | workers | batch per worker | mode | reached target | time to target "
             "(virtual s) | samples/s (virtual) |", "|---|---|---|---|---|---|---|"]
    groups: dict[tuple, list[RunResult]] = defaultdict(list)
    for r in results:
        groups[(r.straggler, r.workers, r.mode)].append(r)
    for (straggler, workers, mode), runs in groups.items():
        reached = [r.time_to_target for r in runs if r.time_to_target is not None]
        rates = [r.samples_per_sec for r in runs if r.samples_per_sec]
        failed = [r for r in runs if r.status != "ok"]
        note = f" ({failed[0].reason[:100]})" if failed else ""
        batch = global_batch // workers if global_batch % workers == 0 else "-"
        lines.append(f"| {straggler} | {workers} | {batch} | {mode} | "
                     f"{len(reached)}/{len(runs)}{note} | {interval_text(bootstrap_ci(reached))} | "
                     f"{_fmt(*_mean_std(rates), digits=0)} |")
    return lines


def parse_table(text: str) -> list[dict[str, str]]:
    """The report's table back as dicts (used by the tests, and handy for scripts)."""
    rows = [line for line in text.splitlines() if line.startswith("|")]
    header = [c.strip() for c in rows[0].strip("|").split("|")]
    return [dict(zip(header, (c.strip() for c in row.strip("|").split("|")))) for row in rows[2:]]
