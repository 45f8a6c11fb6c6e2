"""``hvdtrain compare --from-run RUN_DIR``: every mode replayed on the simulator with a finished
run's model, data, train flags and fitted step times (from_run.py), several seeds each; a
predicted time to target per mode with intervals, a recommendation, and the check of the run's
own mode against the run's real time.

The clock: the simulator's virtual seconds are training seconds (evaluations take no virtual
time), so the real run is read on its training clock, ``train_seconds`` of its log's lines
(results.training_seconds). A predicted run's first epoch goes at the speed of the run's own
first epoch, warm-up and all, and its later epochs at the speeds of the run's later ones.
"""

from __future__ import annotations

import contextlib
import json
import os
import math
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from ..errors import ConfigError
from ..rules.registry import DILOCO_OUTER_LR, DILOCO_OUTER_MOMENTUM, FAMILIES, Mode, modes
from .from_run import RunFit, RunLog, fit_epochs, run_speeds, split_warmup
from .results import time_to_target
from .stats import MIN_RUNS, bootstrap_ci, separated
from .target_metric import Target, check_reported

# The train flags a replay takes from the run's config, by section: what it trains, on what,
# how and for how long. The rest (the mode's options, the run folder, checkpoints, logging,
# the straggler, which the fit replaces) is the replay's own.
REPLAYED = {"data": None, "model": None, "optim": None,
            "run": ("epochs", "batch_size", "max_steps_per_epoch", "eval_every",
                    "eval_every_steps", "precision", "threads"),
            "sync": ("reduce_op",)}

# A mode that needs more epochs than the run had can still reach the target: the replay's
# budget is this many times the run's epochs, and every run stops at the target.
BUDGET_EPOCHS = 2


def train_args_from_config(config: dict, epochs: int | None = None) -> list[str]:
    """The hvdtrain train flags of a run's logged config (the header's ``config``), as
    ``--flag=value`` (values may be empty or start with a dash)."""
    args = []
    for section, names in REPLAYED.items():
        for name, value in config.get(section, {}).items():
            if names is not None and name not in names or value is None:
                continue
            if name == "epochs" and epochs is not None:
                value = epochs
            if name == "threads" and not value:
                # The virtual clock does not depend on this process's speed; one thread is the
                # fastest way through small batches (compare's sweep does so too), and a real
                # server and workers sharing a host's cores get about one each.
                value = 1
            flag = "--" + name.replace("_", "-")
            if isinstance(value, bool):
                args.append(flag if value else "--no-" + flag[2:])
            elif isinstance(value, (list, tuple)):
                args.append(f"{flag}={','.join(map(str, value))}")
            else:
                args.append(f"{flag}={value!r}" if isinstance(value, float) else f"{flag}={value}")
    return args


def mode_of_run(config: dict) -> Mode:
    """The comparison's Mode (rules/registry.py) that the run's config is, named as --modes
    names it: the family whose options the config has, the most specific one where several
    match (balanced over sync); a run with options of no family's (a DiLoCo outer rate of its
    own) gets a Mode of its own values."""
    flat = {name: value for section in config.values() if isinstance(section, dict)
            for name, value in section.items()}
    staleness = float(flat.get("staleness", math.inf))
    # a DiLoCo run's own outer step (compare's --outer-lr/--outer-momentum, or the run's flags)
    outer = ((float(flat["outer_lr"]), float(flat.get("outer_momentum", 0.0)))
             if flat.get("outer_lr") else (DILOCO_OUTER_LR, DILOCO_OUTER_MOMENTUM))
    h = int(flat.get("local_steps", 1))
    candidates = modes(list(FAMILIES), [int(staleness) if math.isfinite(staleness) else 0],
                       [int(flat.get("backup_workers", 0))], [h], outer)
    # An async mode's options name its H only where it is not 1, so H is matched here: an async
    # DiLoCo run of options no family has (unweighted rounds) is not plain async; and a DiLoCo
    # family of H = 1 is no run's.
    matching = [m for m in candidates
                if m.local_steps == h and not (h == 1 and m.outer_lr)
                and all(name in flat and flat[name] == value
                        for name, value in m.config_options().items())]
    if matching:
        return max(matching, key=lambda m: len(m.config_options()))  # the first of a tie
    return _mode_of_values(config)


def _mode_of_values(config: dict) -> Mode:
    run, sync, ps = config["run"], config["sync"], config["ps"]
    if run["mode"] == "sync":
        h, outer = int(sync.get("local_steps", 1)), float(sync.get("outer_lr", 0.0))
        name = "sync" if h == 1 else (f"diloco{h}" if outer else f"local{h}")
        return Mode(name, scheme="sync", local_steps=h, outer_lr=outer,
                    outer_momentum=float(sync.get("outer_momentum", 0.0)) if outer else 0.0)
    if ps.get("bsp"):
        b = int(ps.get("backup_workers", 0))
        return Mode(f"backup{b}", staleness=0.0, bsp=True, backup_workers=b)
    staleness = float(ps.get("staleness", math.inf))
    slr, dc = bool(ps.get("staleness_lr")), float(ps.get("dc_lambda", 0.0))
    h = int(sync.get("local_steps", 1))
    if h != 1:  # asynchronous DiLoCo of its own settings (a run before stop 59: unweighted)
        weighted = bool(ps.get("round_staleness_weight", False))
        return Mode(f"adiloco{h}" + ("-slr" if slr else "" if weighted else "-unweighted"),
                    staleness=staleness, staleness_lr=slr, local_steps=h,
                    outer_lr=float(sync.get("outer_lr", 0.0)) or 1.0,
                    outer_momentum=float(sync.get("outer_momentum", 0.0)),
                    round_staleness_weight=weighted)
    name = ("async-slr" if slr else "dcasgd" if dc else "async" if math.isinf(staleness)
            else f"ssp{int(staleness)}")
    return Mode(name, staleness=staleness, staleness_lr=slr, dc_lambda=dc)


@dataclass
class Prediction:
    """One mode's replays: the expected time to target of each seed (None: not reached), the
    mean with its bootstrap interval, and the range a single run falls in (from ``singles``,
    each seed's time at the machine's speed of single runs drawn from the run's epochs)."""

    mode: str
    own: bool
    times: list[float | None] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    singles: list[float] = field(default_factory=list)

    @property
    def reached(self) -> list[float]:
        return [t for t in self.times if t is not None]

    @property
    def complete(self) -> bool:
        return bool(self.times) and len(self.reached) == len(self.times)

    def ci(self) -> tuple[float, float, float] | None:
        return bootstrap_ci(self.reached)

    def run_range(self) -> tuple[float, float] | None:
        """Where one run lands, 95% of the time: the 2.5th to 97.5th percentile of the single
        runs of every seed that reached the target (a seed's draws, initial weights and data
        order; a single run's speed of the machine)."""
        if not self.singles:
            return None
        low, high = np.percentile(self.singles, [2.5, 97.5])
        return float(low), float(high)

    def row(self) -> dict:
        ci, span = self.ci(), self.run_range()
        return {"mode": self.mode, "own": self.own, "times": self.times, "failed": self.failed,
                "mean": ci and ci[0], "ci_low": ci and ci[1], "ci_high": ci and ci[2],
                "run_low": span and span[0], "run_high": span and span[1]}


def replay(run: RunLog, modes: list[Mode], seeds: list[int], target: Target | str | float,
           apply_seconds: float, link=None,
           server_link=None) -> tuple[list[Prediction], RunFit]:
    """Every mode, every seed, on the fit of the run's epochs (the first left out with its
    warm-up): each seed has its own draws, initial weights and data order; its virtual time
    to the target, at the machine's speed of single runs (from_run.run_speeds), gives its
    expected time and single runs. ``link`` (sim/link.py, e.g. from_run_link's): prices every
    mode's exchanges by their bytes; ``server_link``, where given (compare --links), the
    server's pushes and replies instead. Returns the predictions and the fit."""
    from .sim.sweep import simulate_run

    target = Target.of(target)  # a float: a test accuracy
    own = mode_of_run(run.config)
    first, fitted = split_warmup(run.epochs)
    lock_step = not own.is_async or own.bsp
    fit = fit_epochs(fitted, lock_step, own.local_steps, apply_seconds, first,
                     waits_for_server_alone(own))
    if link is not None:
        fit = replace(fit, timing=replace(fit.timing, link=link, server_link=server_link))
    args = train_args_from_config(run.config, BUDGET_EPOCHS * int(run.config["run"]["epochs"]))
    per_epoch = int(run.header["steps_per_epoch"])
    predictions = [Prediction(m.name, m == own) for m in modes]
    for seed in seeds:
        for mode, prediction in zip(modes, predictions):
            try:
                result = simulate_run(mode, run.num_workers, "", seed, args, target, fit.timing,
                                      stop_at_target=True, delays=fit.delays(mode.is_async))
            except ConfigError as e:
                prediction.failed.append(str(e))
                prediction.times.append(None)
                continue
            if result.status != "ok":
                prediction.failed.append(result.reason)
            at = target.first_reached(result.curve)
            if result.status != "ok" or at is None:
                prediction.times.append(None)
                continue
            speeds = run_speeds(first, fitted, fit.step_period,
                                math.ceil(at["step"] / per_epoch), seed)
            prediction.singles += list(at["wall_seconds"] * speeds)
            prediction.times.append(float(at["wall_seconds"] * speeds.mean()))
    return predictions, fit


def real_time_to_target(run: RunLog, target: Target | str | float) -> float | None:
    """The run's training seconds at its first evaluation that reaches ``target``."""
    return time_to_target(run.curve, target)


def recommend(predictions: list[Prediction], checked: bool = True) -> str:
    """The fastest mode when its interval is clear of every other mode's (each seed reaching
    the target), else "no clear winner" and the modes that tie. ``checked`` False: the replay
    of the run's own mode missed its real time, so no interval settles anything."""
    complete = sorted((p for p in predictions if p.complete), key=lambda p: p.ci()[0])
    if not complete:
        return "no clear winner: no mode reached the target with every seed"
    best = complete[0]
    ties = [p.mode for p in complete[1:] if not separated(best.ci(), p.ci())]
    if len(best.times) < MIN_RUNS:
        return (f"no clear winner: {len(best.times)} seed(s) give no interval ({best.mode} was "
                f"fastest; pass --seeds 5 or more)")
    if ties:
        return (f"no clear winner: {best.mode} was fastest, but its interval overlaps "
                f"{', '.join(ties)}'s")
    if not checked:
        return (f"not settled: {best.mode} was fastest in the replay, its interval clear of "
                "every other mode's, but the replay missed the run's own time (the check "
                "above), so the intervals cannot be trusted; run the plan for real "
                "(hvdtrain compare) to settle it")
    return f"{best.mode}: its interval is clear of every other mode's"


def overlaps(prediction: Prediction, real: float | None) -> bool:
    """The validation: the run's real time falls in the range of the replayed single runs, or
    in the mean's interval."""
    if real is None or not prediction.reached:
        return False
    ci, span = prediction.ci(), prediction.run_range()
    return ci[1] <= real <= ci[2] or span[0] <= real <= span[1]


def check_out(base: str | Path, run: RunLog) -> Path:
    """``base``/from-run, unless it lies in the run's own folder (ConfigError)."""
    root = Path(base) / "from-run"
    inside = root.resolve()
    if inside == run.folder.resolve() or run.folder.resolve() in inside.parents:
        raise ConfigError(f"--out {base}: the answer would go inside the run's folder "
                          f"{run.folder}; give another --out")
    return root


def output_folder(base: str | Path, run: RunLog) -> Path:
    """A new folder for this answer, under ``base``/from-run: named after the run, numbered so
    that no earlier answer is overwritten; never inside the run's own folder."""
    root = check_out(base, run)
    root.mkdir(parents=True, exist_ok=True)
    for n in range(1, 10_000):
        folder = root / (run.folder.resolve().name + ("" if n == 1 else f"-{n}"))
        try:
            folder.mkdir()
            return folder
        except FileExistsError:
            continue
    raise ConfigError(f"--out {base}: {root} is full of earlier answers; clean it up")


def write_answer(folder: Path, summary: dict, table: str) -> None:
    (folder / "from_run.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    (folder / "from_run.md").write_text(table + "\n")


# --- the command ------------------------------------------------------------------------------
def main(cfg) -> int:
    """``hvdtrain compare --from-run``: read, fit, replay, print, write. ``cfg``: CompareConfig
    (its --modes, --local-steps, --staleness-bounds, --backup-workers, --seeds, --target,
    --out)."""
    from .from_run import read_run
    from .measured_links import server_link
    from .sim.timing import measure_timing

    run = read_run(cfg.from_run)
    target, capped = run_target(cfg.goal, run)
    modes = list(cfg.planned_modes())
    own = mode_of_run(run.config)
    if own not in modes:
        modes.append(own)
    check_out(cfg.out, run)  # before the replay's minute, not after
    out, run.folder = Path(cfg.out).absolute(), run.folder.absolute()
    with in_launch_folder(run):
        args = train_args_from_config(run.config)
        apply_seconds = measure_timing(args, step_seconds=1.0).apply_seconds
        print(f"hvdtrain compare --from-run {cfg.from_run}: {run.header['model']} on "
              f"{run.num_workers} workers in mode {own.name}; replaying {len(modes)} modes x "
              f"{cfg.seeds} seeds up to {target.metric} {target.op} {target.value:.4g}"
              f"{capped} ...", flush=True)
        if run.cut_short:
            print(f"hvdtrain compare: note: {run.cut_short}; the fit reads the epochs it logged",
                  file=sys.stderr, flush=True)
        seeds = [int(run.config["run"]["seed"]) + i for i in range(cfg.seeds)]
        link, network = from_run_link(run, own, args, apply_seconds, cfg)
        predictions, fit = replay(run, modes, seeds, target, apply_seconds, link,
                                  server_link(cfg))
    real = real_time_to_target(run, target)
    own_prediction = next(p for p in predictions if p.own)
    ok = overlaps(own_prediction, real)
    # a replay that misses the run's own time cannot settle a ranking by its intervals
    advice = recommend(predictions, checked=ok or real is None)
    table = describe_fit(fit) + "\n" + network + "\n\n" + \
        prediction_table(predictions, target) + "\n\n" + _verdict(own_prediction, real, ok) + \
        (f"\n\nnote: {run.cut_short}" if run.cut_short else "") + \
        "\n\nrecommendation: " + advice
    print("\n" + table, flush=True)
    folder = output_folder(out, run)
    write_answer(folder, {"run": str(run.folder), "target": target.value,
                          "target_metric": target.metric, "target_op": target.op,
                          "own_mode": own.name,
                          "real_time_to_target": real, "own_mode_overlaps": ok,
                          "recommendation": advice, "cut_short": run.cut_short or None,
                          "fit": _fit_record(fit),
                          "predictions": [p.row() for p in predictions]}, table)
    print(f"\nanswer: {folder / 'from_run.md'}, {folder / 'from_run.json'}", flush=True)
    return 0


@contextlib.contextmanager
def in_launch_folder(run: RunLog):
    """In the folder the run started in (its header's ``folder``), where it still exists: the
    run's relative paths (a --model file, --data-path, a --dataset-args root, a dotted module
    beside them) are relative to it, wherever compare is run from. A log from before the header
    named it stays in the current folder."""
    folder = run.header.get("folder")
    if not folder or not os.path.isdir(folder):
        yield
        return
    with contextlib.chdir(folder):
        yield


def run_target(goal: Target, run: RunLog) -> tuple[Target, str]:
    """(the target to replay to, a note when it is not --target's): --target's metric must be
    one the run evaluated (a language model's run has test_loss, no test_acc), and a value
    beyond the best the run reached is capped there, so that the run's own time can be
    checked."""
    check_reported(goal, run.metrics(), f"the run {run.folder}")
    best = run.best(goal)
    if best is None:
        raise ConfigError(f"--from-run: every evaluation of {run.folder} gave {goal.metric} as "
                          "NaN or infinite; train it again until its evaluations are numbers")
    target = goal.capped(best)
    if target == goal:
        return target, ""
    return target, (f" (the best the run reached; --target {goal.stop_at()} lies beyond it)")


def from_run_link(run: RunLog, own: Mode, args: list[str], apply_seconds: float, cfg):
    """(the link that prices the replay's exchanges, what the report says of it): --links' ring
    or --sim-link-mbit when given, else fitted from the run's measured exchange and its model's
    bytes (sim/link.py run_link)."""
    from .sim.flat_model import _Setup
    from .sim.link import gradient_bytes, run_link, wire_bytes

    first, fitted = split_warmup(run.epochs)
    fit = fit_epochs(fitted, not own.is_async or own.bsp, own.local_steps, apply_seconds, first)
    ring = not own.is_async
    setup = _Setup.build(args, 0, "", own)
    try:
        plain_sync = ring and own.local_steps == 1
        nbytes = setup.model.flat.numel() * (gradient_bytes(setup.cfg) if plain_sync
                                             else wire_bytes(setup.cfg))
    finally:
        setup.workload.close()
    exchange = fit.timing.allreduce_seconds if ring else fit.timing.push_seconds
    if cfg.measured is not None:
        return cfg.sim_link(), (f"link: the {cfg.measured.describe()}; the run's own exchange "
                                f"of {nbytes / 1e6:.3g} MB took {exchange * 1000:.2f} ms "
                                "(measured)")
    link, said = run_link(exchange, nbytes, run.num_workers, ring, cfg.sim_link(),
                          cfg.sim_latency_ms / 1000)
    if cfg.sim_link() is None and waits_for_server_alone(own):
        said += uneven_paths(fit, own.local_steps)
    return link, said


def waits_for_server_alone(mode: Mode) -> bool:
    """Whether a run of ``mode`` waits for the server alone: async with no staleness bound
    and no lock-step rounds, so that a worker's longer wait is its own (fit_epochs' own_waits)."""
    return mode.is_async and not mode.bsp and math.isinf(mode.staleness)


UNEVEN_PATHS = 5.0  # an async worker's exchange this many times another's is not noise


def uneven_paths(fit: RunFit, local_steps: int) -> str:
    """What the report says where an async run's workers reached the server at very different
    speeds (``fit``: its fit): the link fitted is the fastest path, which a worker beside the
    server may have had alone, and a sync ring crosses the slowest one. Empty otherwise."""
    exchanges = [w.wait_seconds * local_steps for w in fit.workers]
    fast, slow = min(exchanges), max(exchanges)
    if slow <= UNEVEN_PATHS * fast:
        return ""
    return (f"\nnote: worker {exchanges.index(slow)} waited {slow * 1000:.2f} ms an exchange, "
            f"worker {exchanges.index(fast)} {fast * 1000:.2f} ms: their paths to the server "
            "differ (a worker beside the server, or a slower link). The link above is the "
            "fastest path, and the sync modes' ring would cross the slowest, so their times "
            "here are too short. Given the link between the hosts (--sim-link-mbit, or --links "
            "with hvdtrain doctor's file), every exchange crosses it, the server's too, as with "
            "the server alone on its host")


def describe_fit(fit: RunFit) -> str:
    t = fit.timing
    lines = [f"fit of epochs {','.join(map(str, fit.epochs_used))} (training clock: "
             f"{fit.step_period * 1000:.2f} ms a global step; the first epoch's extra "
             f"{fit.warmup_seconds:.2f} s):",
             "| worker | compute ms (persistent) | factor | random delay ms (mean, exponential) "
             "| wait ms |", "|---|---|---|---|---|"]
    for i, w in enumerate(fit.workers):
        lines.append(f"| {i} | {w.base_seconds * 1000:.2f} | {w.factor:.2f}x | "
                     f"{w.random_mean * 1000:.2f} | {w.wait_seconds * 1000:.2f} |")
    lines.append(f"virtual clock: step {t.step_seconds * 1000:.2f} ms, allreduce "
                 f"{t.allreduce_seconds * 1000:.2f} ms, push {t.push_seconds * 1000:.2f} ms, "
                 f"apply {t.apply_seconds * 1000:.2f} ms (measured here), loop "
                 f"{t.loop_seconds * 1000:.2f} ms; " + (
                     "every exchange priced by the link below" if t.link else
                     "the other family's exchange is assumed to cost what the run's did"))
    return "\n".join(lines)


def prediction_table(predictions: list[Prediction], target: Target | str | float) -> str:
    target = Target.of(target)
    reached = (f"{target.value:.4g}" if target.is_accuracy else
               f"{target.metric} {target.op} {target.value:.4g}")
    lines = [f"| mode | reached {reached} | predicted s to target (95% CI) | one run, 95% of "
             "the time, s |", "|---|---|---|---|"]
    for p in predictions:
        ci, span = p.ci(), p.run_range()
        mean = f"{ci[0]:.2f} ({ci[1]:.2f}-{ci[2]:.2f})" if ci else "-"
        spread = f"{span[0]:.2f}-{span[1]:.2f}" if span else "-"
        note = " (the run's own)" if p.own else ""
        failed = f"; failed: {p.failed[0]}" if p.failed else ""
        lines.append(f"| {p.mode}{note} | {len(p.reached)}/{len(p.times)}{failed} | {mean} | "
                     f"{spread} |")
    return "\n".join(lines)


def _verdict(own: Prediction, real: float | None, ok: bool) -> str:
    if real is None:
        return f"check: the run itself did not reach the target, so {own.mode} cannot be checked"
    if ok:
        return (f"check: the run ({own.mode}) reached the target at {real:.2f} s of training; "
                "inside the prediction")
    # to four figures: at two, a time just outside read as inside the table's rounded bounds
    ci, span = own.ci(), own.run_range()
    parts = ([f"the interval {ci[1]:.4g}-{ci[2]:.4g} s"] if ci else []) + (
        [f"one run's range {span[0]:.4g}-{span[1]:.4g} s"] if span else [])
    bounds = f" ({', '.join(parts)})" if parts else ""
    return (f"check: the run ({own.mode}) reached the target at {real:.4g} s of training; "
            f"OUTSIDE the prediction{bounds}: read the figures above with care (a loaded host, "
            "too few epochs to fit)")


def _fit_record(fit: RunFit) -> dict:
    return {"epochs": list(fit.epochs_used), "step_period": fit.step_period,
            "warmup_seconds": fit.warmup_seconds, "timing": asdict(fit.timing),
            "workers": [asdict(w) for w in fit.workers]}
