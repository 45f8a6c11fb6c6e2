"""environment: the variables that must reach every rank (facts.watched) are the same on every
host, and those set where the launcher runs reached them; clock: every host's clock within a
second of rank 0's."""

from __future__ import annotations

from .problem import Problem, by_host, names, odd_hosts

CLOCK_LIMIT_S = 1.0
# Variables that may differ by design: each rank or host given its own devices.
MAY_DIFFER = {"CUDA_VISIBLE_DEVICES"}


def forward_fix(name: str, launcher: str | None) -> str:
    if launcher == "srun":
        return f"srun --export=ALL,{name} (or set it in the batch script before srun)"
    if launcher == "horovodrun":
        return f"export {name} before horovodrun, which passes it on (or set it in each host's " \
               "shell profile)"
    return f"mpirun -x {name} (or set it in each host's shell profile)"


def check_environment(ranks: list[dict], launcher: str | None = None,
                      launcher_env: dict[str, str] | None = None) -> list[Problem]:
    hosts = by_host(ranks)
    problems = []
    every = sorted({name for f in ranks for name in f["env"]})
    for name in every:
        values = {h: [f["env"].get(name) for f in g] for h, g in hosts.items()}
        lacking = [h for h, v in values.items() if None in v]
        having = [h for h, v in values.items() if any(x is not None for x in v)]
        if lacking and having:
            problems.append(Problem("environment", f"{name} is set on {names(having)} but not on "
                                    f"{names(lacking)}", forward_fix(name, launcher)))
        elif not lacking and name not in MAY_DIFFER and len(hosts) > 1:
            common, odd = odd_hosts({h: v[0] for h, v in values.items()})
            for host in odd:
                problems.append(_differs(name, host, values[host][0], common, launcher))
    for name, value in sorted((launcher_env or {}).items()):
        if name != "PATH_VENV" and name not in every:
            problems.append(Problem("environment", f"{name} is set where the launcher runs "
                                    f"but reached no rank", forward_fix(name, launcher)))
    return problems


def _differs(name: str, host: str, value: str, common: str, launcher: str | None) -> Problem:
    if name == "PATH_VENV":  # not a variable: the folder of the first python on PATH
        return Problem("environment", f"PATH finds python in {value!r} on {host}, in "
                       f"{common!r} on the others",
                       "put the same venv first on PATH on every host: "
                       f"{forward_fix('PATH', launcher)}")
    return Problem("environment", f"{name} is {value!r} on {host}, {common!r} on the others",
                   f"set the same {name} on every host")


def check_clocks(offsets: dict[str, float], rank0_host: str) -> list[Problem]:
    return [Problem("clock", f"{host}'s clock is {abs(offset):.2f} s "
                    f"{'ahead of' if offset > 0 else 'behind'} {rank0_host}'s (rank 0)",
                    f"run NTP (chrony, systemd-timesyncd) on every host")
            for host, offset in offsets.items() if abs(offset) > CLOCK_LIMIT_S]
