"""What the user asked for: hosts and their slots, and how many ranks, from a launcher line
(mpirun, horovodrun, srun), ``--expect HOST:SLOTS,...``, a hostfile, or Slurm's variables.

Pure parsing (no process is started), so every form is a unit test. Bad input raises DoctorInput
with the fix in its message."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

LAUNCHERS = ("mpirun", "mpiexec", "orterun", "horovodrun", "srun")
# The hostfile an MPIJob's launcher is given (the MPI Operator mounts it there).
MPIJOB_HOSTFILE = "/etc/mpi/hostfile"


class DoctorInput(ValueError):
    """Bad input to the doctor: the message says what to fix."""


@dataclass
class Asked:
    """Hosts and slots asked for (in the launcher's order), and the number of ranks (-np)."""

    hosts: dict[str, int] = field(default_factory=dict)
    np: int | None = None
    source: str = ""  # where the hosts came from, for the messages: "-H", "hostfile h", ...
    hostfile: str | None = None
    by_node: bool = False  # mpirun --map-by node: ranks dealt round the hosts, not slot by slot

    @property
    def slots(self) -> int:
        return sum(self.hosts.values())

    def placement(self) -> dict[str, int]:
        """Ranks per host as the launcher places them: by slot, filling each host's slots in
        order (Open MPI's and horovodrun's default), -np ranks in all."""
        if self.np is None or self.np >= self.slots:
            return dict(self.hosts)
        placed = dict.fromkeys(self.hosts, 0)
        if self.by_node:  # one rank to each host in turn, as long as it has a slot free
            left = self.np
            while left:
                for host, slots in self.hosts.items():
                    if left and placed[host] < slots:
                        placed[host] += 1
                        left -= 1
            return placed
        left = self.np
        for host, slots in self.hosts.items():
            placed[host] = min(slots, left)
            left -= placed[host]
        return placed

    def to_json(self) -> dict | None:
        return {"hosts": dict(self.hosts)} if self.hosts else None


def launcher_kind(command: list[str]) -> str:
    """"mpirun", "horovodrun" or "srun" for a launcher line; DoctorInput for anything else."""
    name = Path(command[0]).name if command else ""
    if name in ("mpirun", "mpiexec", "orterun"):
        return "mpirun"
    if name in ("horovodrun", "srun"):
        return name
    raise DoctorInput(f"unknown launcher {command[0]!r}: give mpirun, horovodrun or srun with "
                      "the job's hosts (hvdtrain doctor mpirun -np 4 -H a:2,b:2), or run "
                      "hvdtrain doctor under the launcher (mpirun -np 4 -H a:2,b:2 hvdtrain "
                      "doctor)")


def parse_host_slots(text: str, what: str) -> dict[str, int]:
    """"a:2,b:2" (a host without a count has 1 slot) -> {"a": 2, "b": 2}."""
    hosts: dict[str, int] = {}
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        name, _, count = entry.rpartition(":") if ":" in entry else (entry, "", "1")
        if not name or not count.isdigit() or int(count) < 1:
            raise DoctorInput(f"{what} {text!r}: {entry!r} is not HOST or HOST:SLOTS with SLOTS "
                              "at least 1; write it as a:2,b:2")
        hosts[name] = hosts.get(name, 0) + int(count)
    if not hosts:
        raise DoctorInput(f"{what} {text!r}: no host in it; write it as a:2,b:2")
    return hosts


def parse_hostfile(path: str) -> dict[str, int]:
    """Open MPI's ("a slots=2"), horovodrun's ("a slots=2"), MPICH's ("a:2") hostfile lines."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as e:
        raise DoctorInput(f"hostfile {path}: cannot read it ({e.strerror or e}); give the "
                          "hostfile the job uses") from None
    hosts: dict[str, int] = {}
    for line in lines:
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        slots = next((w.split("=", 1)[1] for w in words[1:] if w.startswith(("slots=", "slots:"))),
                     None)
        name, count = (words[0], slots) if slots is not None else \
            (words[0].rpartition(":")[0] or words[0], words[0].rpartition(":")[2]
             if ":" in words[0] else "1")
        if not count.isdigit() or int(count) < 1:
            raise DoctorInput(f"hostfile {path}: line {line.strip()!r} has no valid slot count; "
                              "write HOST slots=N")
        hosts[name] = hosts.get(name, 0) + int(count)
    return hosts


def expand_nodelist(text: str) -> list[str]:
    """Slurm's compressed node list: "n[01-03,07],gpu1" -> n01 n02 n03 n07 gpu1; text after a
    bracket, and more brackets, as Slurm writes them: "rack1-n[01-02]-ib" -> rack1-n01-ib
    rack1-n02-ib."""
    names: list[str] = []
    for item in re.findall(r"(?:[^,\[]|\[[^\]]*\])+", text):  # commas outside brackets
        names += _expand_brackets(item)
    return names


def _expand_brackets(item: str) -> list[str]:
    found = re.search(r"\[([^\]]*)\]", item)
    if not found:
        return [item]
    head, tails = item[:found.start()], _expand_brackets(item[found.end():])
    names = []
    for part in found.group(1).split(","):
        low, _, high = part.partition("-")
        for i in range(int(low), int(high or low) + 1):
            names += [f"{head}{i:0{len(low)}d}{tail}" for tail in tails]
    return names


def expand_tasks_per_node(text: str, count: int) -> list[int]:
    """SLURM_TASKS_PER_NODE: "2(x3),1" -> [2, 2, 2, 1]."""
    tasks: list[int] = []
    for part in text.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not m:
            raise DoctorInput(f"SLURM_TASKS_PER_NODE={text!r}: cannot read it; run the doctor "
                              "under srun or sbatch, or give --expect HOST:SLOTS,...")
        tasks += [int(m.group(1))] * int(m.group(2) or 1)
    return (tasks + [tasks[-1]] * count)[:count] if tasks else [1] * count


def from_slurm(env: dict[str, str]) -> Asked | None:
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not nodelist:
        return None
    names = expand_nodelist(nodelist)
    tasks = expand_tasks_per_node(env.get("SLURM_TASKS_PER_NODE", "1"), len(names))
    np = env.get("SLURM_NTASKS") or env.get("SLURM_NPROCS")
    return Asked(dict(zip(names, tasks)), int(np) if np and np.isdigit() else None,
                 "SLURM_JOB_NODELIST")


def from_probe_options(expect: str | None, hostfile: str | None,
                       env: dict[str, str] | None = None) -> Asked | None:
    """Inside a launcher: --expect, --hostfile, Open MPI's default hostfile, an MPIJob's
    hostfile, or Slurm's variables, the first found; None when nothing says what was asked."""
    env = dict(os.environ) if env is None else env
    if expect:
        return Asked(parse_host_slots(expect, "--expect"), None, "--expect")
    for path, source in ((hostfile, "--hostfile"),
                         (env.get("OMPI_MCA_orte_default_hostfile"), "the default hostfile"),
                         (MPIJOB_HOSTFILE if Path(MPIJOB_HOSTFILE).is_file() else None,
                          "the MPIJob's hostfile")):
        if path:
            return Asked(parse_hostfile(path), None, f"{source} {path}", path)
    return from_slurm(env)


_NP = ("-np", "-n", "-c", "--np", "--n")  # srun's are read by _from_srun
_HOSTS = ("-H", "--host", "-host", "--hosts")
_HOSTFILES = ("--hostfile", "-hostfile", "--machinefile", "-machinefile", "--default-hostfile",
              "-default-hostfile")


def _option_values(args: list[str]) -> dict[str, str]:
    """The last value of each option in a launcher's argument list ("-np 4", "--np=4")."""
    values: dict[str, str] = {}
    for i, word in enumerate(args):
        if "=" in word and word.startswith("-"):
            name, value = word.split("=", 1)
            values[name] = value
        elif word.startswith("-") and i + 1 < len(args):
            values[word] = args[i + 1]
    return values


def from_launcher(command: list[str], env: dict[str, str] | None = None) -> Asked:
    """What a launcher line asks for: -np, -H, --hostfile (mpirun, horovodrun), or srun's -n,
    -N, --ntasks-per-node, -w with Slurm's allocation."""
    kind = launcher_kind(command)
    values = _option_values(command[1:])
    if kind == "srun":
        return _from_srun(values, dict(os.environ) if env is None else env)
    np_text = next((values[k] for k in _NP if k in values), None)
    if np_text is not None and not np_text.isdigit():
        raise DoctorInput(f"{command[0]} -np {np_text!r}: give a number of ranks")
    np = int(np_text) if np_text else None
    by_node = values.get("--map-by", values.get("-map-by", "")).lower().startswith("node")
    hosts_text = next((values[k] for k in _HOSTS if k in values), None)
    if hosts_text:
        return Asked(parse_host_slots(hosts_text, "-H"), np, "-H", by_node=by_node)
    hostfile = next((values[k] for k in _HOSTFILES if k in values), None)
    if hostfile:
        return Asked(parse_hostfile(hostfile), np, f"hostfile {hostfile}", hostfile, by_node)
    asked = from_probe_options(None, None, env)
    if asked is not None:
        asked.np = np if np is not None else asked.np
        return asked
    return Asked({}, np, "-np")  # one host, this one: no host names to check against


def _from_srun(values: dict[str, str], env: dict[str, str]) -> Asked:
    asked = from_slurm(env) or Asked({}, None, "srun")
    nodelist = values.get("-w") or values.get("--nodelist")
    if nodelist:
        asked.hosts = {name: asked.hosts.get(name, 1) for name in expand_nodelist(nodelist)}
    per_node = values.get("--ntasks-per-node")
    if per_node and per_node.isdigit():
        asked.hosts = {name: int(per_node) for name in asked.hosts}
    np = values.get("-n") or values.get("--ntasks")
    if np is not None:
        if not np.isdigit():
            raise DoctorInput(f"srun -n {np!r}: give a number of tasks")
        asked.np = int(np)
    return asked
