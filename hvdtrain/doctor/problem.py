"""One problem the doctor found: which check, what is wrong, and what to do about it."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Problem:
    check: str  # hosts, versions, devices, network, run_dir, environment, clock
    message: str
    fix: str

    def line(self) -> str:
        return f"doctor: {self.check}: {self.message} -- fix: {self.fix}"

    def to_json(self) -> dict:
        return asdict(self)


def by_host(ranks: list[dict]) -> dict[str, list[dict]]:
    """The ranks' facts grouped by host, hosts in the order of their first rank."""
    hosts: dict[str, list[dict]] = {}
    for facts in sorted(ranks, key=lambda f: f["rank"]):
        hosts.setdefault(facts["host"], []).append(facts)
    return hosts


def odd_hosts(values: dict[str, object]) -> tuple[object, list[str]]:
    """The value most hosts have (rank 0's host's on a tie) and the hosts that differ from it."""
    counts = Counter(repr(v) for v in values.values())
    first = repr(next(iter(values.values())))
    top = max(counts.values())
    common_repr = first if counts[first] == top else counts.most_common(1)[0][0]
    common = next(v for v in values.values() if repr(v) == common_repr)
    return common, [h for h, v in values.items() if repr(v) != common_repr]


def names(hosts: list[str]) -> str:
    return ", ".join(hosts)
