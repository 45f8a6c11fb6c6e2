"""compare --links doctor.json: the links that ``hvdtrain doctor`` measured between the hosts,
as the simulator's link model (sim/link.py) takes them.

Two links come out of the doctor's pairs:
- the ring's (sync's gradients, local SGD's and DiLoCo's averages): the slowest pair's
  bandwidth and the highest pair's latency. Every step of a ring waits for its slowest hop, and
  which pairs Horovod's ring puts next to each other is not known here, so the slowest of all
  bounds it (a figure on the safe side where the slowest pair is not in the ring);
- the server's (the async modes' pushes and replies): the slowest and highest of the pairs that
  touch the server's host, the host of the doctor's last rank, where a job launched the same way
  puts its last rank, the parameter server (layout.py Topology). The model's server has one
  link that every worker's transfers share, so a slow pair's figure stands for all of them.
The doctor reports the payload's rate (Mbit/s of bytes that arrive); the link model's rate
counts frames, of which the payload is PAYLOAD_SHARE, so the figures are converted for the
model to carry exactly the measured bytes a second.

Nothing here imports torch: ``hvdtrain compare --help`` and the flags' checks stay light.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from ..config import ConfigError
from .sim.link import PAYLOAD_SHARE, Link

DOCTOR_VERSION = 1  # the doctor.json schema this reader knows


@dataclass(frozen=True)
class Pair:
    """One measured link between two hosts: payload Mbit/s and one-way latency in ms."""

    hosts: tuple[str, str]
    payload_mbit: float
    latency_ms: float

    @property
    def name(self) -> str:
        return "-".join(self.hosts)

    def link(self, latency_ms: float) -> Link:
        return Link(self.payload_mbit / PAYLOAD_SHARE, latency_ms / 1000)


@dataclass(frozen=True)
class MeasuredLinks:
    """What compare takes from a doctor.json: the ring's and the server's links, and what the
    report says of them."""

    path: str
    hosts: tuple[str, ...]
    server_host: str
    ring_pair: Pair        # the slowest pair: the ring's bandwidth
    ring_latency_ms: float
    server_pair: Pair      # the slowest pair that touches the server's host
    server_latency_ms: float
    fit: bool
    problems: int

    @property
    def ring(self) -> Link:
        return self.ring_pair.link(self.ring_latency_ms)

    @property
    def server(self) -> Link:
        return self.server_pair.link(self.server_latency_ms)

    def warning(self) -> str | None:
        """A doctor that judged the cluster unfit still measured its links (a throttled pair
        is a finding, not a broken file): the figures are used, with this said."""
        if self.fit:
            return None
        return (f"hvdtrain compare: --links {self.path}: the doctor judged this cluster NOT "
                f"fit ({self.problems} problem(s)); its measured links are used as they are, "
                "so the predictions are of the cluster as it is, faults included; fix what the "
                "doctor names and run it again for a healthy cluster's figures")

    def describe(self) -> str:
        """The report's account of the figures: file, hosts, bandwidth, latency."""
        return (f"links measured by hvdtrain doctor ({self.path}; hosts "
                f"{', '.join(self.hosts)}{'' if self.fit else '; the doctor judged them NOT fit'}"
                f"): the ring's link is the slowest pair, {self.ring_pair.name}, "
                f"{self.ring_pair.payload_mbit:.4g} Mbit/s, at the highest latency of the "
                f"pairs, {self.ring_latency_ms:.3g} ms; the server's link (host "
                f"{self.server_host}, the last rank's) is its slowest pair, "
                f"{self.server_pair.name}, {self.server_pair.payload_mbit:.4g} Mbit/s, "
                f"{self.server_latency_ms:.3g} ms")


def read_links(path: str) -> MeasuredLinks:
    """doctor.json's links for compare (ConfigError when the file cannot give them)."""
    doctor = _load(path)
    pairs = [_pair(path, i, entry) for i, entry in enumerate(doctor.get("links") or [])]
    hosts = doctor.get("hosts")
    if not isinstance(hosts, dict) or not hosts:
        problems = doctor.get("problems") or [{}]
        said = problems[0].get("message") if isinstance(problems[0], dict) else None
        raise ConfigError(f"--links {path}: the doctor's ranks never reported, so it measured "
                          f"nothing{f' ({said})' if said else ''}; fix that and run "
                          "`hvdtrain doctor` again")
    if not pairs:
        raise ConfigError(f"--links {path}: the doctor measured no link between hosts (its "
                          f"ranks ran on {len(hosts)} host(s): {', '.join(hosts)}); run "
                          "`hvdtrain doctor` across the hosts the job will use, or give "
                          "--sim-link-mbit and --sim-latency-ms")
    server_host = _last_rank_host(hosts)
    touching = [p for p in pairs if server_host in p.hosts] or pairs
    return MeasuredLinks(
        path=str(path), hosts=tuple(hosts), server_host=server_host,
        ring_pair=min(pairs, key=lambda p: p.payload_mbit),
        ring_latency_ms=max(p.latency_ms for p in pairs),
        server_pair=min(touching, key=lambda p: p.payload_mbit),
        server_latency_ms=max(p.latency_ms for p in touching),
        fit=doctor.get("fit") is True, problems=len(doctor.get("problems") or []))


def _load(path: str) -> dict:
    where = f"--links {path}"
    if not Path(path).is_file():
        raise ConfigError(f"{where}: no such file; run `hvdtrain doctor` with the job's launcher "
                          "and hosts first (it writes doctor.json), and give its path")
    try:
        doctor = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{where}: not readable as JSON ({e}); run `hvdtrain doctor` again "
                          "to write it afresh") from None
    if not isinstance(doctor, dict) or "version" not in doctor:
        raise ConfigError(f"{where}: not a doctor.json (no \"version\"); give the file that "
                          "`hvdtrain doctor --json` wrote")
    if doctor["version"] != DOCTOR_VERSION:
        raise ConfigError(f"{where}: doctor.json version {doctor['version']!r}, but this hvdtrain "
                          f"reads version {DOCTOR_VERSION}; run this hvdtrain's doctor again")
    return doctor


def _pair(path: str, index: int, entry) -> Pair:
    """One of doctor.json's "links", checked: a pair the doctor could not measure cannot price
    an exchange, and leaving it out could leave out the slowest."""
    try:
        a, b = entry["hosts"]
        unmeasured = entry["bandwidth_mbit"] is None  # the doctor's mark of an untimed pair
        if not unmeasured:
            mbit, latency = float(entry["bandwidth_mbit"]), float(entry["latency_ms"])
    except (KeyError, TypeError, ValueError):
        raise ConfigError(f"--links {path}: links[{index}] is not a measured pair (it needs "
                          f"\"hosts\": [A, B], \"bandwidth_mbit\" and \"latency_ms\"; got "
                          f"{json.dumps(entry)[:120]}); run `hvdtrain doctor` again") from None
    if unmeasured:
        raise ConfigError(f"--links {path}: the doctor could not measure the link {a}-{b}; fix "
                          "what it says of that pair and run it again")
    if not (math.isfinite(mbit) and mbit > 0 and math.isfinite(latency) and latency >= 0):
        raise ConfigError(f"--links {path}: the link {a}-{b} has no usable measurement "
                          f"({mbit:g} Mbit/s, {latency:g} ms); fix what the doctor says of it "
                          "and run the doctor again")
    return Pair((str(a), str(b)), mbit, latency)


def _last_rank_host(hosts: dict) -> str:
    """The host of the doctor's highest rank (the job's server, launched alike); the last host
    listed where the file gives no ranks."""
    ranked = [(max(info["ranks"]), name) for name, info in hosts.items()
              if isinstance(info, dict) and info.get("ranks")]
    return max(ranked)[1] if ranked else list(hosts)[-1]


def links_flag(cfg) -> MeasuredLinks | None:
    """compare's --links (``cfg``: CompareConfig), read and checked before anything runs. One
    source of a link's figures: with --sim-link-mbit too, which should win would be our guess,
    not the user's."""
    if cfg.links is None:
        return None
    if cfg.sim_link_mbit is not None or cfg.sim_latency_ms:
        raise ConfigError("--links takes the link's bandwidth and latency from doctor.json; "
                          "drop --sim-link-mbit and --sim-latency-ms, or drop --links")
    if not (cfg.simulate or cfg.sweep_workers.strip() or cfg.from_run is not None):
        raise ConfigError("--links prices the simulated runs' exchanges; add --simulate (or "
                          "--sweep-workers, --from-run), or drop it (a real run's link is the "
                          "network's)")
    return read_links(cfg.links)


def server_link(cfg) -> Link | None:
    """The server's link where --links gives it one of its own, else None (the ring's)."""
    return None if cfg.measured is None else cfg.measured.server
