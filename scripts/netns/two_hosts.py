"""Two "hosts" on one machine: network namespaces joined by a veth pair, for multi-host runs of
mpirun and horovodrun over a real TCP path (tests/multiproc/test_multihost.py,
scripts/bench_multihost.py).

Each namespace gets an interface named ``hvd0`` (the same name on both sides, because horovodrun
looks for interfaces common to all hosts) with an address on 10.213.0.0/24, and loopback. A
command runs "on" a host through ``netns_ssh`` (beside this file), which also gives it the host's
own hostname (its address), so Open MPI does not mistake the two for one node and use shared
memory.

Needs root (or CAP_NET_ADMIN and CAP_SYS_ADMIN) and the ``ip`` and ``unshare`` tools;
:func:`unavailable_reason` says why not when they are missing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SSH = HERE / "netns_ssh"
SUBNET = "10.213.0"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


def unavailable_reason() -> str | None:
    """None when namespaces can be made here, else the reason they cannot."""
    for tool in ("ip", "unshare"):
        if shutil.which(tool) is None:
            return f"the {tool} tool is not installed (iproute2 / util-linux)"
    probe = f"hvdprobe{os.getpid()}"
    steps = [(["ip", "netns", "add", probe], "create a network namespace"),
             (["ip", "-n", probe, "link", "add", "hvdpa", "type", "veth", "peer", "name", "hvdpb"],
              "create a veth pair"),
             (["unshare", "--uts", "true"], "give a process its own hostname (unshare --uts)")]
    try:
        for command, what in steps:
            proc = subprocess.run(command, capture_output=True, text=True, timeout=30)
            if proc.returncode != 0:
                return (f"cannot {what} (needs root, or CAP_NET_ADMIN and CAP_SYS_ADMIN): "
                        f"{proc.stderr.strip()}")
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=30)
    return None


class TwoHosts:
    """``with TwoHosts() as hosts:`` -> hosts.addresses, hosts.run_on(0, cmd), hosts.env."""

    def __init__(self, tag: str | None = None):
        tag = tag or str(os.getpid())
        self.namespaces = [f"hvda{tag}", f"hvdb{tag}"]
        self.addresses = [f"{SUBNET}.1", f"{SUBNET}.2"]
        # Each host's hostname is its address: distinct, so Open MPI sees two nodes, and
        # resolvable without an /etc/hosts entry, which Gloo needs to find its own address.
        self.names = list(self.addresses)
        self.shim: Path | None = None  # a folder whose `ssh` is netns_ssh, for horovodrun

    def __enter__(self) -> "TwoHosts":
        a = self.namespaces[0]
        self.shim = Path(tempfile.mkdtemp(prefix="hvdtrain-netns-"))
        (self.shim / "ssh").symlink_to(SSH)
        try:
            for ns in self.namespaces:
                _ip("netns", "add", ns)
                _ip("-n", ns, "link", "set", "lo", "up")
            _ip("link", "add", "hvdva" + a[-6:], "type", "veth", "peer", "name", "hvdvb" + a[-6:])
            for ns, end, address in zip(self.namespaces, ("hvdva", "hvdvb"), self.addresses):
                _ip("link", "set", end + a[-6:], "netns", ns)
                _ip("-n", ns, "link", "set", end + a[-6:], "name", "hvd0")
                _ip("-n", ns, "addr", "add", f"{address}/24", "dev", "hvd0")
                _ip("-n", ns, "link", "set", "hvd0", "up")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        for ns in self.namespaces:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        if self.shim:
            shutil.rmtree(self.shim, ignore_errors=True)

    @property
    def env(self) -> dict[str, str]:
        """Environment for launchers: the host map for netns_ssh, and netns_ssh as `ssh`."""
        hosts = ",".join(f"{addr}={ns}={name}" for addr, ns, name in
                         zip(self.addresses, self.namespaces, self.names))
        return {"HVDTRAIN_NETNS_HOSTS": hosts,
                "PATH": f"{self.shim}{os.pathsep}{os.environ.get('PATH', '')}"}

    def on(self, host: int, command: list[str]) -> list[str]:
        """The command line that runs ``command`` on host 0 or 1."""
        return [str(SSH), self.addresses[host], *command]

    @staticmethod
    def mpirun_flags() -> list[str]:
        """Open MPI over the veth pair only: TCP between the hosts, no shared memory. No
        binding: each "host" would bind its first rank to core 0, the same core of this one
        machine."""
        return ["--bind-to", "none", "--mca", "plm_rsh_agent", str(SSH), "--mca", "btl", "tcp,self",
                "--mca", "btl_tcp_if_include", f"{SUBNET}.0/24",
                "--mca", "oob_tcp_if_include", f"{SUBNET}.0/24"]
