"""The simulator's network: what an exchange costs when a link's bandwidth and latency price
its bytes (``hvdtrain compare --sim-link-mbit``, ``--sim-latency-ms``; compare --from-run fits
them from a run's waits).

    a sync average of G bytes over N workers (the ring: reduce-scatter, then all-gather)
        2 (N - 1) / N x G / bandwidth + 2 (N - 1) x latency
    a push or a pull of G bytes over the server's link, shared by the k transfers in flight
        k x G / bandwidth + latency

A link is full duplex, as a veth or an Ethernet port is: pushes share the way in, pulls the way
out (SharedLink, one per direction). The bytes of an element follow the wire: 4 for float32, 2
for --wire-dtype bf16 or fp16, and for sync's gradients Horovod's --compression fp16.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...config import ConfigError

WIRE_BYTES = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2}


@dataclass(frozen=True)
class Link:
    """A network link: its bandwidth in megabits per second (10^6 bits) and its one-way latency
    per message in seconds."""

    mbit: float
    latency_seconds: float = 0.0

    @property
    def bytes_per_second(self) -> float:
        return self.mbit * 1e6 / 8

    def check(self) -> None:
        if not (math.isfinite(self.mbit) and self.mbit > 0):
            raise ConfigError(f"link bandwidth: invalid value {self.mbit} Mbit/s; use a "
                              "positive number, e.g. 100")
        if not (math.isfinite(self.latency_seconds) and self.latency_seconds >= 0):
            raise ConfigError(f"link latency: invalid value {self.latency_seconds} s; use 0 or "
                              "more")

    def ring_seconds(self, nbytes: float, workers: int) -> float:
        """A ring allreduce of ``nbytes`` over ``workers``: each sends and receives
        2 (N - 1) / N of the bytes, in 2 (N - 1) hops that each pay the latency."""
        if workers < 2:
            return 0.0
        hops = 2 * (workers - 1)
        return hops / workers * nbytes / self.bytes_per_second + hops * self.latency_seconds

    def transfer_seconds(self, nbytes: float, sharing: int = 1) -> float:
        """One message of ``nbytes`` while ``sharing`` transfers (this one included) divide the
        link's bandwidth."""
        return max(1, sharing) * nbytes / self.bytes_per_second + self.latency_seconds


class SharedLink:
    """One direction of the server's link on the virtual clock: a transfer that starts while
    others are in flight gets its share of the bandwidth (the ones in flight are not slowed
    after the fact: an approximation of fair sharing that keeps each transfer's time fixed when
    it starts)."""

    def __init__(self, link: Link):
        self.link = link
        self.ends: list[float] = []  # when the transfers in flight end

    def send(self, at: float, nbytes: float) -> float:
        """A transfer of ``nbytes`` starting at ``at``: when it arrives."""
        self.ends = [end for end in self.ends if end > at]
        arrives = at + self.link.transfer_seconds(nbytes, len(self.ends) + 1)
        self.ends.append(arrives)
        return arrives


def wire_bytes(cfg) -> int:
    """The bytes of one element on the wire of the server and of local SGD's and DiLoCo's
    averages: the run's --wire-dtype where the config has one (float32 otherwise)."""
    for section in ("ps", "sync", "run"):
        dtype = getattr(getattr(cfg, section, None), "wire_dtype", None)
        if dtype:
            return WIRE_BYTES.get(str(dtype).lower(), 4)
    return 4


def gradient_bytes(cfg) -> int:
    """The bytes of one element of sync's gradient allreduce: Horovod's --compression fp16
    halves it; the --wire-dtype of the server and of model averages does not apply."""
    return 2 if getattr(getattr(cfg, "sync", None), "compression", "none") == "fp16" else 4


def fit_link(exchange_seconds: float, nbytes: float, workers: int, ring: bool,
             latency_seconds: float = 0.0) -> Link | None:
    """The bandwidth that makes one exchange of ``nbytes`` last ``exchange_seconds`` with this
    latency: a ring average over ``workers`` (``ring``), or a push and a pull (two transfers).
    One figure cannot give both bandwidth and latency, so the latency is given (0: all of the
    wait is bandwidth, which overstates the time of smaller messages). None when the wait is
    no longer than the latency alone: the link's bandwidth cannot be seen in it."""
    if ring:
        hops = 2 * (workers - 1)
        moved, latency = hops / max(1, workers) * nbytes, hops * latency_seconds
    else:
        moved, latency = 2 * nbytes, 2 * latency_seconds
    spent = exchange_seconds - latency
    if moved <= 0 or spent <= 0:
        return None
    return Link(moved / spent * 8 / 1e6, latency_seconds)


def check_link_flags(mbit: float | None, latency_ms: float, from_run: bool,
                     simulated: bool) -> None:
    """compare's --sim-link-mbit and --sim-latency-ms, before anything runs."""
    if mbit is not None and not (math.isfinite(mbit) and mbit > 0):
        raise ConfigError(f"--sim-link-mbit: invalid value {mbit}; use a positive number of "
                          "Mbit/s, e.g. 100")
    if not (math.isfinite(latency_ms) and latency_ms >= 0):
        raise ConfigError(f"--sim-latency-ms: invalid value {latency_ms}; use 0 or more")
    if (mbit is not None or latency_ms) and not (simulated or from_run):
        raise ConfigError("--sim-link-mbit and --sim-latency-ms price the simulated runs' "
                          "exchanges; add --simulate (or --sweep-workers, --from-run), or drop "
                          "them (a real run's link is the network's)")
    if latency_ms and mbit is None and not from_run:
        raise ConfigError("--sim-latency-ms is the latency of --sim-link-mbit's link: give "
                          "--sim-link-mbit too")
