"""The slow-link lab (``hvdtrain compare --plan links``): two hosts on this machine, network
namespaces joined by a veth pair (scripts/netns/two_hosts.py), whose link is throttled with a
token bucket (``tc qdisc ... tbf``; netem, which would add a delay, is not in this kernel), and
the plan's modes run across them at each rate of ``--link-mbit``.

Where the processes go: every mode puts one worker on each host, so that the modes compare on
the same hardware. Sync and local SGD/DiLoCo average across the link (a ring of two); the async
modes put the server, an extra process, on host A beside worker 1, which reaches it through
shared memory, while worker 0's pushes and replies cross the link, as on a cluster with no
spare host for the server. The simulator's link model prices both placements: the server alone
on host A with both workers on host B sharing its link (lab_runs' server_beside=False, what
tests/multiproc/test_link_lab.py checks it against), and the server beside worker 1
(predicted_step_seconds' ``beside_server``: worker 1 off the link, and nobody held while
worker 0's push crosses: the server takes it in the background, ps/arrivals.py). Beside a
worker the step time swings from epoch to epoch with how many of the job's batches worker 0,
across the link, gets, so the model is set against a run's epochs together there (each of
worker 0's epoch ends costs it a transfer, and its evaluation waits for it: sim/server_run.py
_end_epochs), over repeated runs (scripts/bench_link_model.py; docs/comparison.md, stop 58).
Each rate's runs are an ordinary comparison in a folder of their own (OUT/link-100mbit/:
report, plots, runs); links.md sets the rates side by side.

Needs root (or CAP_NET_ADMIN and CAP_SYS_ADMIN), iproute2's ip and tc, util-linux's unshare,
and the source tree's scripts/netns (an installed hvdtrain without it cannot run the lab).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from ..config import ConfigError
from .plan import PlannedRun

NETNS = Path(__file__).resolve().parents[2] / "scripts" / "netns"
DEVICE = "hvd0"  # the link's end in each namespace (two_hosts.py)
TIMER_HZ = 250   # a token bucket must hold at least a timer tick's bytes to reach its rate
SIMULATED_EPOCHS = 3  # predicted_step_seconds reads the middle one


def _two_hosts_module():
    spec = importlib.util.spec_from_file_location("two_hosts", NETNS / "two_hosts.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def unavailable_reason() -> str | None:
    """None when the lab can run here, else why not (what is missing)."""
    if not (NETNS / "two_hosts.py").is_file():
        return (f"the lab needs the source tree's scripts/netns ({NETNS} is missing): run it "
                "from a checkout of hvdtrain")
    if shutil.which("tc") is None:
        return "the tc tool is not installed (iproute2)"
    return _two_hosts_module().unavailable_reason()


def tbf_command(namespace: str, mbit: float) -> list[str]:
    """The token bucket that throttles ``namespace``'s end of the link to ``mbit`` Mbit/s: a
    bucket of 32 kbit (4 KB) as a slow link has, or a timer tick's bytes where that is more
    (a faster rate needs the larger bucket to reach its rate), and packets queued at most 50 ms."""
    burst = max(4096, int(mbit * 1e6 / 8 / TIMER_HZ))
    return ["ip", "netns", "exec", namespace, "tc", "qdisc", "replace", "dev", DEVICE, "root",
            "tbf", "rate", f"{mbit:g}mbit", "burst", str(burst), "latency", "50ms"]


class SlowLinks:
    """``with SlowLinks() as lab:`` two namespace hosts (lab.hosts, two_hosts.TwoHosts);
    lab.throttle(100) sets both directions of their link to 100 Mbit/s. The bucket and the
    namespaces are removed on the way out, whatever happened."""

    def __init__(self, tag: str | None = None):
        self.hosts = _two_hosts_module().TwoHosts(tag)
        self.mbit: float | None = None

    def __enter__(self) -> SlowLinks:
        self.hosts.__enter__()
        return self

    def throttle(self, mbit: float) -> None:
        if not mbit > 0:
            raise ConfigError(f"link rate: invalid value {mbit}; use a positive Mbit/s")
        for ns in self.hosts.namespaces:
            subprocess.run(tbf_command(ns, mbit), check=True, capture_output=True, timeout=30)
        self.mbit = mbit

    def __exit__(self, *exc) -> None:
        try:
            for ns in self.hosts.namespaces:
                subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", DEVICE,
                                "root"], capture_output=True, timeout=30)
        finally:
            self.hosts.__exit__(*exc)

    def hostfile(self, folder: Path, server: bool, beside: bool = True) -> Path:
        """A hostfile for a run of two workers, one on each host, and (``server``: an async
        run) the server, the last rank, on host A beside worker 1; or (not ``beside``) alone on
        host A, both workers on host B, so that every push and reply crosses the link and the
        workers share it. mpirun puts its own node's slots first whatever the file's order,
        and fills them in rank order, so the runs start on host B with worker 0."""
        a, b = self.hosts.addresses
        if not server:
            path, text = folder / "hostfile-sync", f"{a} slots=1\n{b} slots=1\n"
        elif beside:
            path, text = folder / "hostfile-async", f"{b} slots=1\n{a} slots=2\n"
        else:
            path, text = folder / "hostfile-async-alone", f"{b} slots=2\n{a} slots=1\n"
        path.write_text(text)
        return path

    def env(self) -> dict[str, str]:
        """What a launch across the hosts needs in its environment (netns_ssh's host map, and
        the venv's bin on PATH for the ranks on host B)."""
        env = self.hosts.env
        env["PATH"] = f"{env['PATH']}{os.pathsep}{Path(sys.executable).parent}"
        return env

    def mpirun_flags(self, hostfile: Path) -> list[str]:
        """The launch across the hosts. Its ranks yield their core while they wait: the two
        hosts share this machine's cores, where an async run's three spinning ranks (on two
        cores in CI) timed the cores' turns more than the link (measured: two workers' push
        and reply of 77 KB at 25 Mbit/s took 110 ms a cycle spinning, 83 ms yielding, on a
        busy machine), as plan.py's rule for a run that takes every core says; a hostfile
        bypasses that rule, so the lab sets it."""
        return ["--hostfile", str(hostfile), *self.hosts.mpirun_flags(), "-x", "PATH",
                "-x", "PYTHONUNBUFFERED", "-x", "OMPI_ALLOW_RUN_AS_ROOT",
                "-x", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "--mca", "mpi_yield_when_idle", "1"]

@dataclass(frozen=True)
class LabRun(PlannedRun):
    """A planned run launched on host B of the lab (its launcher_args place the ranks)."""

    host: tuple[str, ...] = ()  # netns_ssh and host B's address: netns_ssh runs the command
                                # through a shell, so it goes as one quoted word

    def command(self, python: str, run_dir: str, cores: int | None = None) -> list[str]:
        return [*self.host, shlex.join(super().command(python, run_dir, cores))]


def lab_runs(lab: SlowLinks, runs: list[PlannedRun], folder: Path,
             server_beside: bool = True) -> list[LabRun]:
    """The plan's runs, placed on the lab's hosts (hostfiles written into ``folder``); an
    async run's server beside worker 1, or alone on its host (SlowLinks.hostfile)."""
    folder.mkdir(parents=True, exist_ok=True)
    host = tuple(lab.hosts.on(1, []))
    return [LabRun(run.name, run.mode, run.seed, run.straggler, run.processes, run.train_args,
                   (*lab.mpirun_flags(lab.hostfile(folder, run.mode.is_async, server_beside)),
                    *run.launcher_args), run.faults, host=host)
            for run in runs]


def predicted_step_seconds(mode, train_args: list[str], epochs, link, apply_seconds: float = 0.0,
                           seed: int = 0, beside_server: tuple[int, ...] = ()) -> float:
    """The simulator's step time for measured epochs of a lab run (``epochs``: one of
    from_run's EpochTimes, or a list of a run's consecutive ones up to its last): the workers'
    compute and random delays and the loop's own time as those epochs measured them
    (from_run.fit_epochs: the loop's is the step period less the mean compute and the mean
    wait, of the worker that took the most steps), the server's update ``apply_seconds``, and
    every exchange priced by ``link`` (sim/link.py), not by the waits the epochs measured.
    ``train_args``: the run's train flags, which the simulator trains on. For one epoch it runs
    SIMULATED_EPOCHS and the step time is its middle epoch's, as the lab's is an epoch in
    mid-run (a whole simulated run's would add the first round's start and the last rounds'
    tail, where an async run's workers finish one by one). For a run's epochs it runs as many
    as the run did and the step time is theirs together: where the server is beside a worker,
    the epochs alternate between ones where worker 0, across the link, takes a round and ones
    it only ends, so no single epoch is typical. An async run's is the server alone on its
    host (lab_runs' server_beside=False) unless ``beside_server`` names the workers on the
    server's host (the lab's default: (1,); Timing.beside_server)."""
    from dataclasses import replace

    from .from_run import fit_epochs
    from .sim.sweep import simulate_run

    measured = list(epochs) if isinstance(epochs, (list, tuple)) else [epochs]
    if len(measured) == 1:
        run_epochs, first, last = SIMULATED_EPOCHS, 2, 2
    else:
        first, last = measured[0].epoch, measured[-1].epoch
        run_epochs = last
    fit = fit_epochs(measured, lock_step=not mode.is_async or mode.bsp,
                     local_steps=mode.local_steps, apply_seconds=apply_seconds)
    timing = replace(fit.timing, allreduce_seconds=0.0, push_seconds=0.0, link=link,
                     beside_server=beside_server)
    result = simulate_run(mode, measured[0].times.num_workers, "", seed,
                          [*train_args, "--epochs", str(run_epochs)], 1.0, timing,
                          delays=fit.delays())
    if result.status != "ok":
        raise ConfigError(f"the simulated {mode.name} run failed: {result.reason}")
    at = {point["step"]: point["wall_seconds"] for point in result.curve}  # evaluations
    per_epoch = result.curve[-1]["step"] // run_epochs
    start, end = (first - 1) * per_epoch, last * per_epoch  # the measured epochs' ends
    if start in at and end in at and end > start:
        return (at[end] - at[start]) / (end - start)
    return result.wall_seconds / result.curve[-1]["step"]  # no evaluation at its ends


def check_lab(cfg) -> None:
    """Before anything starts: the lab's own rules (``cfg``: a CompareConfig of --plan links)."""
    from .options import ints

    if cfg.simulate or cfg.hostfile or cfg.sweep_workers.strip():
        raise ConfigError("--plan links runs on the lab's two namespace hosts: drop --simulate, "
                          "--hostfile and --sweep-workers (to simulate a slow link, use "
                          "another plan with --simulate --sim-link-mbit)")
    if cfg.workers != 2:
        raise ConfigError(f"--plan links: the lab has two hosts and places two workers; use "
                          f"--workers 2, not {cfg.workers}")
    if not ints(cfg.link_mbit, "--link-mbit") or any(r < 1 for r in ints(cfg.link_mbit,
                                                                          "--link-mbit")):
        raise ConfigError(f"--link-mbit: invalid value {cfg.link_mbit!r}; give rates of 1 Mbit/s "
                          "or more, e.g. 1000,100")
    reason = unavailable_reason()
    if reason is not None:
        raise ConfigError(f"--plan links needs network namespaces and tc on this machine, as "
                          f"root: {reason}. Run it as root on Linux with iproute2, or estimate "
                          "slow links with --simulate --sim-link-mbit RATE")


@contextlib.contextmanager
def launching_into(lab: SlowLinks):
    """Inside it, the runner's launches (runner.run_one: launch_env copies this process's
    environment) reach the lab's hosts; the environment is restored after."""
    saved = dict(os.environ)
    os.environ.update(lab.env())
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def run_lab(cfg, out: Path, runs: list[PlannedRun], modes, run_plan) -> int:
    """``hvdtrain compare --plan links``: the plan's runs across the lab's hosts at each rate of
    --link-mbit, each rate an ordinary comparison in OUT/link-RATEmbit (``run_plan``: command.
    _run_plan), then links.md with every rate's times to target. Returns the worst exit code."""
    import copy

    from .options import ints

    codes, sections = [], []
    with SlowLinks() as lab, launching_into(lab):
        for mbit in ints(cfg.link_mbit, "--link-mbit"):
            lab.throttle(mbit)
            folder = out / f"link-{mbit}mbit"
            at_rate = copy.copy(cfg)
            at_rate.link_mbit = str(mbit)  # what the rate's report says of its link
            codes.append(run_plan(at_rate, folder, lab_runs(lab, runs, folder), modes))
            sections.append(_rate_section(mbit, folder))
    (out / "links.md").write_text(_links_table(cfg, sections))
    print(f"\nslow-link lab: {out / 'links.md'}", flush=True)
    return max(codes)


def _rate_section(mbit: int, folder: Path) -> list[str]:
    """Rows of links.md for one rate: time to target per (straggler, mode), from the rate's
    summary.csv, with the usual bootstrap interval over the seeds (stats.bootstrap_ci), and
    against sync's under the same straggler (stats.ratio_ci) where every run of both reached
    the target."""
    import csv

    from .report import interval_text
    from .stats import bootstrap_ci, ratio_ci

    groups: dict[tuple[str, str], list[str]] = {}
    with open(folder / "summary.csv", newline="") as f:
        for row in csv.DictReader(f):
            groups.setdefault((row["straggler"], row["mode"]), []).append(row["time_to_target"])
    times = {key: [float(t) for t in runs if t not in ("", "None")]
             for key, runs in groups.items()}
    complete = {key for key, runs in groups.items() if len(times[key]) == len(runs)}
    rows = []
    for (straggler, mode), runs in groups.items():
        key, sync = (straggler, mode), (straggler, "sync")
        mean = (interval_text(bootstrap_ci(times[key])) if key in complete else
                f"{len(times[key])}/{len(runs)} reached")
        ratio = (ratio_ci(times[key], times[sync]) if key in complete and sync in complete
                 else None)
        against = "1" if mode == "sync" else interval_text(ratio)
        rows.append(f"| {mbit} | {straggler} | {mode} | {mean} | {against} |")
    return rows


def _links_table(cfg, sections: list[list[str]]) -> str:
    return "\n".join([
        "# Slow-link lab", "",
        f"Two namespace hosts joined by a veth link throttled with tc tbf at each rate; "
        f"{cfg.workers} workers (one on each host; async: the server on host A beside "
        f"worker 1, whose pushes and replies skip the link); target {cfg.goal.stop_at()}; {cfg.seeds} seeds. Each rate's "
        "report, runs and plots: link-RATEmbit/.", "",
        "| link Mbit/s | straggler | mode | time to target, s (mean [95% interval]) | "
        "against sync's time (ratio of the means [95% interval]) |",
        "|---|---|---|---|---|", *[row for rows in sections for row in rows], ""])
