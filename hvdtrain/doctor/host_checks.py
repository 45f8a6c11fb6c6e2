"""hosts: every rank started, on the hosts and slots asked for. Catches Open MPI's single-node
fallback (every rank on one host when several were asked), a hostfile whose slots differ from
what ran, a host that never answered, and ranks on a host nobody asked for."""

from __future__ import annotations

from .asked import Asked
from .problem import Problem, by_host, names


def short(name: str) -> str:
    """"a" for "a.cluster.local"; an IPv4 address stays whole."""
    if name.replace(".", "").isdigit():
        return name
    return name.split(".", 1)[0]


def matches(asked_name: str, facts: dict, resolved: dict[str, str]) -> bool:
    """Whether a host named in the launcher line is the host a rank reports: the same name, the
    same short name (a vs a.cluster.local), or an address of it."""
    host = facts["host"]
    addresses = set(facts.get("addresses", {}).values())
    return (asked_name == host or short(asked_name) == short(host) or asked_name in addresses
            or resolved.get(asked_name) in addresses)


def ran_on(asked: Asked, ranks: list[dict], resolved: dict[str, str]) -> dict[str, str | None]:
    """Asked host name -> the host (as ranks report it) it names, None if no rank ran there."""
    hosts = by_host(ranks)
    return {name: hosts.get(name) and name or
            next((h for h, group in hosts.items() if matches(name, group[0], resolved)), None)
            for name in asked.hosts}


def check_hosts(ranks: list[dict], asked: Asked | None,
                resolved: dict[str, str] | None = None) -> list[Problem]:
    resolved = resolved or {}
    problems: list[Problem] = []
    if asked is not None and asked.np is not None and len(ranks) != asked.np:
        problems.append(Problem("hosts", f"{len(ranks)} ranks answered, {asked.np} were asked "
                                f"for (-np {asked.np})", "give the launcher as many ranks as "
                                "the job asks for (-np, srun -n) and the hosts slots for them"))
    if asked is None or not asked.hosts:
        return problems
    hosts = by_host(ranks)
    where = ran_on(asked, ranks, resolved)
    placed = asked.placement()
    if sum(1 for n in placed.values() if n) > 1 and len(hosts) == 1:
        only = next(iter(hosts))
        return problems + [Problem(
            "hosts", f"all {len(ranks)} ranks ran on {only}, though {asked.source} asked for "
            f"{names(list(asked.hosts))}",
            "the launcher ran everything on one node (Open MPI's fallback when it was given no "
            "other hosts): pass the hosts with -H a:N,b:N or --hostfile, with the names the "
            "hosts answer to, and check that ssh reaches each of them")]
    for name, slots in asked.hosts.items():
        problems += _host_problems(name, slots, placed[name], where[name], hosts, asked)
    for host, group in hosts.items():
        if host not in where.values():
            problems.append(Problem("hosts", f"{len(group)} rank(s) ran on {host}, which "
                                    f"{asked.source} does not name",
                                    f"name {host} in {asked.source}, or check the launcher's "
                                    "hostfile and -H"))
    return problems


def _host_problems(name: str, slots: int, placed: int, host: str | None,
                   hosts: dict[str, list[dict]], asked: Asked) -> list[Problem]:
    ran = len(hosts[host]) if host else 0
    if placed == 0:
        return [Problem("hosts", f"{name}: -np {asked.np} fills the first hosts' slots, so "
                        f"{name} gets no rank", f"-np {asked.slots} for every slot, or fewer "
                        "slots per host so that the ranks spread")]
    if ran == 0:
        return [Problem("hosts", f"{name}: no rank ran there ({slots} slot(s) asked for in "
                        f"{asked.source})", f"check that {name} is reachable (ssh {name}), "
                        "named as it resolves, and listed with its slots")]
    if ran != placed:
        fix = (f"write '{name} slots={ran}' in {asked.hostfile} (or run {placed} ranks there)"
               if asked.hostfile else f"launch {placed} rank(s) on {name} (-H {name}:{placed}), "
               f"or ask for {name}:{ran} in {asked.source}")
        return [Problem("hosts", f"{name}: {ran} rank(s) ran there, {asked.source} asked for "
                        f"{placed}", fix)]
    return []


def never_started(asked: Asked | None, started: dict[int, dict], total: int | None,
                  timeout_s: float, resolved: dict[str, str] | None = None,
                  unreachable: dict[str, str] | None = None) -> list[Problem]:
    """The launcher did not finish within the timeout: which hosts never answered, or how many
    ranks never started. ``started``: rank -> {"host", "addresses"} of the ranks that did;
    ``unreachable``: host -> why ssh from here could not reach it."""
    answered = sorted({f["host"] for f in started.values()})
    if unreachable:  # Open MPI starts no rank until it reaches every host: none answers
        why = "; ".join(f"{host}: {reason}" for host, reason in unreachable.items())
        return [Problem("hosts", f"no rank started within {timeout_s:g} s, and ssh from here "
                        f"cannot reach {names(list(unreachable))} ({why})",
                        f"make {names(list(unreachable))} reachable by ssh from this host "
                        "(ssh HOST true), or correct the host names in the launcher line")]
    if asked is not None and asked.hosts:
        silent = [name for name in asked.hosts if not any(
            matches(name, f, resolved or {}) for f in started.values())]
        if silent and answered:
            return [Problem("hosts", f"no rank on {names(silent)} answered within {timeout_s:g} s "
                            f"({len(started)} rank(s) on {names(answered)} did)",
                            f"check that {names(silent)} can be reached (ssh, the launcher's "
                            "network) and have hvdtrain's venv; or raise --timeout")]
        if silent and len(asked.hosts) > 1:
            return [Problem("hosts", f"no rank started within {timeout_s:g} s on any of "
                            f"{names(silent)} (the launcher starts its ranks once it reaches "
                            "every host, so one that cannot be reached holds them all)",
                            f"check that each of {names(silent)} can be reached by ssh from "
                            "here (ssh HOST true) and has hvdtrain's venv; or raise --timeout")]
    count = f"{len(started)} of {total}" if total else f"only {len(started)}"
    return [Problem("hosts", f"{count} rank(s) started within {timeout_s:g} s (answered: "
                    f"{names(answered) or 'none'}); the launcher was ended",
                    "look at the launcher's output above: a host it cannot reach, or ranks "
                    "waiting for the others; or raise --timeout")]
