"""The comparison's figures (matplotlib, written as PNG files without a display)."""

from __future__ import annotations

from pathlib import Path

from .report import summarize
from .results import RunResult
from .target_metric import Target


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")  # files only: no display on cluster nodes and CI
    import matplotlib.pyplot as plt
    return plt


def _colors(modes: list[str]) -> dict[str, str]:
    palette = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf"]
    return {m: palette[i % len(palette)] for i, m in enumerate(modes)}


def _curves(results, conditions, colors, x_key, y_key, xlabel, ylabel, title, path, target=None):
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(conditions), figsize=(6 * len(conditions), 4.2),
                             squeeze=False, sharey=True)
    for ax, condition in zip(axes[0], conditions):
        labelled = set()
        for r in results:
            if r.straggler != condition or not r.curve:
                continue
            xs = [p[x_key] for p in r.curve if p.get(y_key) is not None]
            ys = [p[y_key] for p in r.curve if p.get(y_key) is not None]
            ax.plot(xs, ys, marker="o", markersize=3, color=colors[r.mode], alpha=0.8,
                    label=None if r.mode in labelled else r.mode)
            labelled.add(r.mode)
        if target is not None:
            ax.axhline(target, color="grey", linestyle="--", linewidth=1, label="target")
        ax.set_title(f"straggler: {condition}")
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:  # every run failed: no curve, no legend
            ax.legend()
    axes[0][0].set_ylabel(ylabel)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _throughput(results, conditions, modes, colors, path):
    plt = _pyplot()
    summary = summarize(results)
    fig, ax = plt.subplots(figsize=(max(6, 2.2 * len(conditions) * len(modes) / 2), 4.2))
    width = 0.8 / len(modes)
    for i, mode in enumerate(modes):
        means, errs, xs = [], [], []
        for j, condition in enumerate(conditions):
            s = summary.get((condition, mode))
            if s and s["rate"][0] is not None:
                xs.append(j + i * width)
                means.append(s["rate"][0])
                errs.append(s["rate"][1] or 0.0)
        ax.bar(xs, means, width, yerr=errs, capsize=3, color=colors[mode], label=mode)
    ax.set_xticks([j + width * (len(modes) - 1) / 2 for j in range(len(conditions))])
    ax.set_xticklabels([f"straggler: {c}" for c in conditions])
    ax.set_ylabel("samples / s (all workers)")
    ax.set_title("Training throughput (mean ± std over seeds)")
    ax.grid(axis="y", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _staleness(results, conditions, modes, colors, path):
    plt = _pyplot()
    async_modes = [m for m in modes if m != "sync"]
    fig, axes = plt.subplots(1, len(conditions), figsize=(6 * len(conditions), 4.2), squeeze=False)
    for ax, condition in zip(axes[0], conditions):
        width = 0.8 / max(1, len(async_modes))
        for i, mode in enumerate(async_modes):
            total: dict[int, int] = {}
            for r in results:
                if r.straggler == condition and r.mode == mode:
                    for k, v in r.staleness_histogram.items():
                        total[k] = total.get(k, 0) + v
            count = sum(total.values())
            if not count:
                continue
            keys = sorted(total)
            ax.bar([k + i * width for k in keys], [total[k] / count for k in keys], width,
                   color=colors[mode], label=mode)
        ax.set_title(f"straggler: {condition}")
        ax.set_xlabel("staleness of an applied gradient (updates it missed)")
        ax.grid(axis="y", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    axes[0][0].set_ylabel("share of applied gradients")
    fig.suptitle("Staleness histogram of the parameter server (all seeds)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_sweep_plot(results: list[RunResult], path: Path, target: Target | str | float) -> None:
    """Simulated time to target against the number of workers, one line per mode, one panel per
    straggler condition (a missing point: that mode did not reach the target there)."""
    plt = _pyplot()
    conditions = list(dict.fromkeys(r.straggler for r in results))
    modes = list(dict.fromkeys(r.mode for r in results))
    colors = _colors(modes)
    fig, axes = plt.subplots(1, len(conditions), figsize=(6 * len(conditions), 4.2),
                             squeeze=False)
    for ax, condition in zip(axes[0], conditions):
        for mode in modes:
            points = {}
            for r in results:
                if r.straggler == condition and r.mode == mode and r.time_to_target is not None:
                    points.setdefault(r.workers, []).append(r.time_to_target)
            xs = sorted(points)
            ax.plot(xs, [sum(points[x]) / len(points[x]) for x in xs], marker="o",
                    color=colors[mode], label=mode)
        ax.set_xscale("log", base=2)
        ax.set_title(f"straggler: {condition}")
        ax.set_xlabel("workers (simulated)")
        ax.grid(alpha=0.3)
        ax.legend()
    axes[0][0].set_ylabel(f"virtual seconds to {Target.of(target).short()}")
    fig.suptitle("Simulated cluster: time to target against workers")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def target_plot_name(target: Target | str | float) -> str:
    """The file of the target's metric against time: accuracy_vs_time.png as it always was,
    else named after the metric (test_loss_vs_time.png)."""
    target = Target.of(target)
    return "accuracy_vs_time.png" if target.metric == "test_acc" else \
        f"{target.metric}_vs_time.png"


def write_plots(results: list[RunResult], out: Path, target: Target | str | float) -> list[str]:
    """Write the figures; returns their file names (relative to ``out``). The first plots the
    target's metric (a loss target: falling curves down to its line)."""
    target = Target.of(target)
    conditions = list(dict.fromkeys(r.straggler for r in results))
    modes = list(dict.fromkeys(r.mode for r in results))
    colors = _colors(modes)
    # the simulator's clock is virtual, and a real run's is its training time (no evaluations)
    clock = "virtual training time" if any(r.simulated for r in results) else "training time"
    files = {
        target_plot_name(target): lambda p: _curves(
            results, conditions, colors, "wall_seconds", target.metric, f"{clock} (s)",
            target.label, f"{target.label[:1].upper()}{target.label[1:]} against {clock}", p,
            target.value),
        "loss_vs_steps.png": lambda p: _curves(
            results, conditions, colors, "step", "train_loss", "steps of the job",
            "training loss (epoch mean)", "Training loss against steps", p),
        "loss_vs_time.png": lambda p: _curves(
            results, conditions, colors, "wall_seconds", "train_loss", f"{clock} (s)",
            "training loss (epoch mean)", f"Training loss against {clock}", p),
        "throughput.png": lambda p: _throughput(results, conditions, modes, colors, p),
    }
    if any(m != "sync" for m in modes):
        files["staleness.png"] = lambda p: _staleness(results, conditions, modes, colors, p)
    # An earlier plan's figures in this --out (another target's curve, the staleness of modes
    # this plan has not) would sit beside this report's as if they were its own.
    for stale in [*out.glob("*_vs_time.png"), out / "staleness.png"]:
        if stale.name not in files:
            stale.unlink(missing_ok=True)
    for name, draw in files.items():
        draw(out / name)
    return list(files)
