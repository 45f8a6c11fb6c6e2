"""The simulator's network: what an exchange costs when a link's bandwidth and latency price
its bytes (``hvdtrain compare --sim-link-mbit``, ``--sim-latency-ms``; compare --from-run fits
them from a run's waits).

    a sync average of G bytes over N workers (the ring: reduce-scatter, then all-gather)
        2 (N - 1) / N x G / bandwidth + 2 (N - 1) x latency
    a push or a pull of G bytes over the server's link, in turn with the transfers queued
    before it (pushes and replies alike)
        G / bandwidth + latency, starting when the link has carried what was queued before,
        or DUPLEX_OVERLAP x G / bandwidth earlier where what it follows goes the other way

The server's pushes and replies share one SharedLink, a queue that carries its transfers in
the order they were sent and is never idle while one waits. The lab (compare/link_lab.py)
throttles each end of its veth pair with its own tbf, so each direction has a bucket of its
own; yet the directions barely overlap (docs/comparison.md, "Slow links"). As far as the lab
showed, the server takes one message at a time (it receives a push, applies it, sends the reply
and waits for the send before the next request), a push beyond Open MPI's 64 KiB eager limit
moves only once the server has posted its receive, and each direction's TCP acknowledgements
and rendezvous messages wait in the same tbf queue as the other direction's data. Measured
there, two workers' rounds of a 77 KB model through the real server took 1.8 to 2.4 times
G / bandwidth each at 10 and 25 Mbit/s, and a bare exchange loop of two workers (the server's
pattern without its engine) took 3.2 to 3.3 G / bandwidth a cycle of both, against 4 in series
and 2 in full duplex. The model overlaps a transfer with the one in flight the other way for a
share of it, DUPLEX_OVERLAP, fitted to that cycle: two of a cycle's four transfers follow one
that goes the other way, so a cycle takes (4 - 2 x DUPLEX_OVERLAP) transfers. Larger messages
overlapped more in the bare loop (2.5 to 2.9 for 307 KB), so for those the model errs slow.
Models before this one took the transfers wholly in series (the lab's async epochs measured
12% to 28% under it) or let a transfer that started while k were in flight take k times its
time (15% to 32% over the lab).

The bytes of an element follow the wire: 4 for float32, 2 for --wire-dtype bf16 or fp16 (the
server's pushes and replies, local SGD's and DiLoCo's rounds), and for sync's gradients
Horovod's --compression fp16. A link's rate counts frames: TCP's payload is PAYLOAD_SHARE of it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...config import ConfigError

# TCP over Ethernet with a 1500-byte MTU: 1448 bytes of payload (with timestamps) in each
# 1514-byte frame.
PAYLOAD_SHARE = 1448 / 1514
# The share of a transfer that crosses beside the one in flight the other way: the bare
# exchange loop's two-worker cycle of 3.2 to 3.3 transfers (module docstring) is 4 - 2 x 0.375.
DUPLEX_OVERLAP = 0.375
WIRE_BYTES = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2}


@dataclass(frozen=True)
class Link:
    """A network link: its bandwidth in megabits per second (10^6 bits) and its one-way latency
    per message in seconds."""

    mbit: float
    latency_seconds: float = 0.0

    @property
    def bytes_per_second(self) -> float:
        """The payload's rate: a link's rate counts whole frames (a tc tbf's, an Ethernet
        port's), of which TCP's payload is a share (PAYLOAD_SHARE)."""
        return self.mbit * 1e6 / 8 * PAYLOAD_SHARE

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
    """The server's link on the virtual clock: one queue, pushes and replies alike, that carries
    its transfers in the order they were sent (module docstring: measured in the lab, a push
    and a reply barely overlap). A transfer that follows one going the other way starts
    DUPLEX_OVERLAP of the shorter one's time before that one ends; one that follows a transfer
    going its own way waits for it to end. Work-conserving: a transfer waits only for the bytes
    queued before it, and its arrival is fixed when it is sent (no later transfer delays it)."""

    def __init__(self, link: Link):
        self.link = link
        self.free_at = 0.0  # when the link has carried every transfer queued so far
        self._last: tuple[bool, float] | None = None  # the last one queued: its way, its time

    def send(self, at: float, nbytes: float, toward_server: bool = True) -> float:
        """A transfer of ``nbytes`` sent at ``at``, a push (``toward_server``) or a reply:
        when it arrives."""
        seconds = nbytes / self.link.bytes_per_second
        start = max(at, self.free_at)
        if at < self.free_at and self._last is not None and self._last[0] != toward_server:
            start = max(at, self.free_at - DUPLEX_OVERLAP * min(seconds, self._last[1]))
        self.free_at, self._last = start + seconds, (toward_server, seconds)
        return self.free_at + self.link.latency_seconds


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
    return Link(moved / spent * 8 / 1e6 / PAYLOAD_SHARE, latency_seconds)


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


def run_link(exchange_seconds: float, nbytes: float, workers: int, ring: bool,
             given: Link | None, latency_seconds: float) -> tuple[Link | None, str]:
    """compare --from-run's link, and what it says of it: ``given`` (--sim-link-mbit) when
    there is one, else the bandwidth fitted from the run's own exchange (``exchange_seconds``
    for ``nbytes``: a ring average when ``ring``, else a push and a pull) at the given latency.
    None where the wait shows no bandwidth: the replay then charges the fixed figures."""
    size = f"{nbytes / 1e6:.3g} MB"
    if given is not None:
        return given, (f"link: {given.mbit:g} Mbit/s and {given.latency_seconds * 1000:g} ms "
                       f"latency, given (--sim-link-mbit, --sim-latency-ms); the run's own "
                       f"exchange of {size} took {exchange_seconds * 1000:.2f} ms (measured)")
    link = fit_link(exchange_seconds, nbytes, workers, ring, latency_seconds)
    if link is None:
        return None, (f"link: not fitted (the run's exchange of {size} took "
                      f"{exchange_seconds * 1000:.2f} ms, no more than its latency); every "
                      "exchange costs the measured figures")
    return link, (f"link: {link.mbit:.4g} Mbit/s fitted from the run's measured exchange of "
                  f"{size} in {exchange_seconds * 1000:.2f} ms, at a latency of "
                  f"{latency_seconds * 1000:g} ms given (--sim-latency-ms; one run's waits "
                  "cannot tell bandwidth from latency); it prices every mode's exchanges by "
                  "their bytes")
