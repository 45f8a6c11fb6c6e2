"""network: the interfaces MPI and Gloo/NCCL were told to use exist on every host, each host
reaches the others through a real interface, and no link is far below the others."""

from __future__ import annotations

from statistics import median

from .problem import Problem, by_host

FAR_BELOW = 0.5  # a link under half the median of the other links is flagged


def told_interfaces(setting: str) -> list[str]:
    """Interface names in a setting "NAME=value" (addresses/CIDRs and exclusions left out)."""
    value = setting.split("=", 1)[1]
    found = []
    for entry in (e.strip() for e in value.split(",")):
        if not entry or entry.startswith("^") or "/" in entry or entry[:1].isdigit():
            continue
        found.append(entry.lstrip("="))
    return found


def _exists(name: str, setting: str, interfaces: set[str]) -> bool:
    if setting.startswith("NCCL_SOCKET_IFNAME=") and not setting.split("=", 1)[1].startswith("="):
        return any(i.startswith(name) for i in interfaces)  # NCCL takes prefixes
    return name in interfaces


def check_interfaces(ranks: list[dict]) -> list[Problem]:
    problems = []
    for host, group in by_host(ranks).items():
        facts = group[0]
        interfaces = set(facts.get("addresses", {}))
        for library, setting in sorted(facts.get("told", {}).items()):
            if "if_exclude" in setting:
                continue
            missing = [n for n in told_interfaces(setting) if not _exists(n, setting, interfaces)]
            if missing:
                problems.append(Problem(
                    "network", f"{host} has no interface {', '.join(missing)} ({setting}); it "
                    f"has {', '.join(sorted(interfaces))}",
                    f"set {setting.split('=')[0]} to an interface every host has"))
        for other, interface in sorted(facts.get("routes", {}).items()):
            if interface is None:
                problems.append(Problem("network", f"{host} has no route to {other}",
                                        f"check {host}'s network and {other}'s address"))
            elif interface == "lo":
                problems.append(Problem(
                    "network", f"{host} reaches {other} through the loopback: {other}'s name "
                    f"resolves to a local address on {host}",
                    f"fix /etc/hosts on {host} so that {other} resolves to its own address"))
    return problems


def check_links(links: list[dict]) -> list[Problem]:
    rates = [link["bandwidth_mbit"] for link in links if link.get("bandwidth_mbit")]
    problems = [Problem("network", f"link {'-'.join(link['hosts'])}: no bandwidth measured "
                        "within the time", "raise --timeout, or give smaller --sizes")
                for link in links if not link.get("bandwidth_mbit")]
    if len(rates) < 2:
        return problems
    for i, link in enumerate(links):
        rate = link.get("bandwidth_mbit")
        # Against the *other* links: one slow host among three makes two of the three links
        # slow, and their median with them is a slow one, which would hide the fault.
        others = [r.get("bandwidth_mbit") for j, r in enumerate(links) if j != i]
        middle = median([r for r in others if r] or [0.0])
        if rate and rate < FAR_BELOW * middle:
            problems.append(Problem(
                "network", f"link {'-'.join(link['hosts'])}: {rate:.1f} Mbit/s, far below the "
                f"other links' median {middle:.1f} Mbit/s",
                "check that pair's interfaces and path (ethtool, tc qdisc, the switch port), "
                "or keep the job off it"))
    return problems
