"""The runs of a comparison: every (straggler condition, mode, seed), as mpirun command lines."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

# The modes' names, flags, options and rules have one table: rules/registry.py.
from ..config.cross_checks import UNREAD_TUNING
from ..ps.membership import RECOVERY_FLAGS
from ..rules.registry import DC_LAMBDA, MODE_NAMES, Mode, modes  # noqa: F401


# Elastic sync (--modes elastic, under --faults): sync training under horovodrun --gloo
# elastic, which takes a killed worker's host out of the job and trains on with the others.
# Horovod blacklists the host of a failed worker, so each worker needs a host of its own: these
# names both resolve to this machine, and Horovod starts a local process for either.
ELASTIC = Mode("elastic", scheme="sync")
ELASTIC_HOSTS = ("localhost", "127.0.0.1")


def unread_tuning(mode: Mode) -> tuple[str, ...]:
    """The transports' tuning options (field names) that a run of ``mode`` does not read, and
    would refuse: a plan's --train-args give them to the modes that read them alone."""
    return UNREAD_TUNING["async" if mode.is_async else "sync"]


def for_mode(train_args: list[str] | tuple[str, ...], mode: Mode) -> list[str]:
    """``train_args`` without the tuning flags (and their values) that ``mode`` does not read."""
    unread = {"--" + name.replace("_", "-") for name in unread_tuning(mode)}
    switches = {"--shared-memory", "--no-shared-memory"}  # flags without a value
    kept, skip_value = [], False
    for word in train_args:
        flag = word.split("=", 1)[0]
        if skip_value:
            skip_value = False
        elif flag in unread or flag in switches and "--" + flag[5:] in unread:
            skip_value = "=" not in word and flag not in switches
        else:
            kept.append(word)
    return kept


@dataclass(frozen=True)
class PlannedRun:
    name: str
    mode: Mode
    seed: int
    straggler: str      # "" for none
    processes: int      # workers, plus the server for async modes
    train_args: tuple[str, ...] = field(default=())
    launcher_args: tuple[str, ...] = field(default=())  # --hostfile and the user's mpirun flags
    faults: str = ""    # --faults: the --inject-faults schedule of every run ("" for none)

    @property
    def restartable(self) -> bool:
        """Under --faults, a failed run is launched again with --auto-resume (sync and its
        variants: the job restarts from its checkpoint); async runs ride out a worker's loss
        in the job itself, under the launcher's recovery settings (recovery_launcher_args)."""
        return bool(self.faults) and not self.mode.is_async and self.mode != ELASTIC

    def command(self, python: str, run_dir: str, cores: int | None = None) -> list[str]:
        cores = cores or os.cpu_count() or 1
        if self.mode == ELASTIC:
            return self._elastic_command(python, run_dir, cores)
        launch = ["mpirun", "-np", str(self.processes), *self.launcher_args]
        # One host with more processes than cores: mpirun refuses without this. Across hosts
        # the hostfile's slots decide.
        if "--hostfile" not in self.launcher_args:
            if self.processes > cores:
                launch.append("--oversubscribe")
            if self.processes >= cores:
                # Every core is taken: a process waiting for a message must yield its core to
                # one that computes, not spin on it. Open MPI does so by itself only when
                # oversubscribed, so a sync run on exactly the cores would spin while an async
                # run on more processes yields: the modes would be timed under different rules.
                launch += ["--mca", "mpi_yield_when_idle", "1"]
        if self.faults and self.mode.is_async:
            launch += recovery_launcher_args()
        return [*launch, python, "-m", "hvdtrain", "train", *self.mode.train_flags(),
                "--seed", str(self.seed), "--run-dir", run_dir, "--no-progress",
                *(["--straggler", self.straggler] if self.straggler else []),
                *(["--inject-faults", self.faults] if self.faults else []),
                *(["--auto-resume"] if self.restartable else []), *self.train_args]

    def _elastic_command(self, python: str, run_dir: str, cores: int) -> list[str]:
        """horovodrun --gloo elastic on this machine's host names, one worker each; Horovod
        runs the discovery script through the shell, so it is an echo, not a file. Each
        worker sees a host of its own and would take every core (runtime.default_threads): it
        gets its share of them, as the workers of an mpirun run on this machine do."""
        hosts = "; ".join(f"echo {host}:1" for host in ELASTIC_HOSTS[:self.processes])
        threads = [] if "--threads" in self.train_args else \
            ["--threads", str(max(1, cores // self.processes))]
        beside = os.path.join(os.path.dirname(python), "horovodrun")  # the venv's
        return [beside if os.path.exists(beside) else "horovodrun", "-np", str(self.processes),
                "--min-np", "1", "--max-np", str(self.processes), "--host-discovery-script",
                hosts, "--gloo", python, "-m", "hvdtrain", "train", "--mode", "sync",
                "--elastic", "--seed", str(self.seed), "--run-dir", run_dir, "--no-progress",
                *(["--straggler", self.straggler] if self.straggler else []),
                *(["--inject-faults", self.faults] if self.faults else []), *threads,
                *self.train_args]


def recovery_launcher_args() -> list[str]:
    """mpirun's settings that keep the other ranks running when one dies (Open MPI 4.1), for
    an async run under --faults: the async scheme then trains on without the lost worker
    (ps/membership.py), and ends a failed job non-zero itself, since mpirun under these
    settings exits 0 whatever the ranks do."""
    return RECOVERY_FLAGS.split()


def plan(mode_list: list[Mode], seeds: list[int], stragglers: list[str], workers: int,
         train_args: list[str], launcher_args: list[str] = (), faults: str = "") -> list[PlannedRun]:
    runs = []
    for straggler in stragglers:
        straggler = straggler.strip()
        straggler = "" if straggler.lower() in ("", "none") else straggler
        # A run's name is its folder: "exp:50ms" becomes "exp-50ms" (a colon upsets Windows
        # copies, scp and rsync, which read "host:path").
        slug = re.sub(r"[^\w.@-]", "-", straggler)
        for mode in mode_list:
            for seed in seeds:
                name = f"{mode.name}-seed{seed}" + (f"-straggler{slug}" if straggler else "")
                processes = workers + (1 if mode.is_async else 0)
                runs.append(PlannedRun(name, mode, seed, straggler, processes,
                                       tuple(for_mode(train_args, mode)),
                                       tuple(launcher_args), faults))
    return runs
