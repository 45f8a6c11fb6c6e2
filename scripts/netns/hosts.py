"""N "hosts" on one machine: network namespaces joined through a bridge, so that every pair can
talk over a real TCP path, and the faults a first multi-host launch meets, each made on one host
(tests/multiproc/test_doctor_netns.py, the doctor's fault tests).

Each host's namespace has an interface named ``hvd0`` (the same name everywhere, as horovodrun
wants) with an address on 10.213.0.0/24; the other end of its veth pair is a port of a bridge in
a namespace of its own, so nothing is added to this machine's own network. Commands run "on" a
host through ``netns_ssh`` as in two_hosts.py (TwoHosts there is the two hosts' veth pair, which
the slow-link lab and the multi-host tests use).

The faults, each undone by :meth:`Hosts.heal`:
- :meth:`Hosts.throttle`: a token bucket (tc tbf) on both ends of one host's veth, so every
  pair with that host runs at the rate, both ways;
- :meth:`Hosts.mount`: a folder mounted over another in that host's commands (a mount namespace
  of their own), e.g. a run folder that is not the one the other hosts see;
- :meth:`Hosts.login_env`: the environment a command started on that host gets, as from a
  real ssh login, instead of the caller's: variables the launcher does not forward do not reach
  it, and its PATH may find another venv (:func:`other_venv` makes one).

Needs root (or CAP_NET_ADMIN and CAP_SYS_ADMIN) and the ``ip``, ``tc`` and ``unshare`` tools.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import two_hosts
from two_hosts import SSH, SUBNET, TwoHosts

DEVICE = "hvd0"
TIMER_HZ = 250  # a token bucket must hold at least a timer tick's bytes to reach its rate
# What a non-interactive ssh login gives a command: the system's PATH, not the launcher's.
LOGIN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _run(*command: str) -> None:
    proc = subprocess.run(command, capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: {proc.stderr.strip()}")


def tbf(namespace: str, device: str, mbit: float) -> list[str]:
    """The token bucket that throttles ``device``'s egress in ``namespace`` to ``mbit`` Mbit/s:
    a bucket of 4 KB, or a timer tick's bytes where that is more (a faster rate needs the larger
    bucket to reach its rate), and packets queued at most 50 ms (as compare/link_lab.py)."""
    burst = max(4096, int(mbit * 1e6 / 8 / TIMER_HZ))
    return ["ip", "netns", "exec", namespace, "tc", "qdisc", "replace", "dev", device, "root",
            "tbf", "rate", f"{mbit:g}mbit", "burst", str(burst), "latency", "50ms"]


def unavailable_reason() -> str | None:
    """None when these hosts can be made here, else the reason they cannot: two_hosts.py's
    checks, the tc tool (for the throttle), and a bridge in a namespace."""
    reason = two_hosts.unavailable_reason()
    if reason is not None:
        return reason
    if shutil.which("tc") is None:
        return "the tc tool is not installed (iproute2)"
    probe = f"hvdbrprobe{os.getpid()}"
    try:
        _run("ip", "netns", "add", probe)
        _run("ip", "-n", probe, "link", "add", "br0", "type", "bridge")
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
        return f"cannot create a bridge in a network namespace (the kernel's bridge module): {e}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=30)
    return None


class Hosts:
    """``with Hosts(3) as hosts:`` -> hosts.addresses, hosts.on(i, cmd), hosts.env,
    hosts.mpirun_flags(); faults: hosts.throttle(i, mbit), hosts.mount(i, source, target),
    hosts.login_env(i, {...}); hosts.heal() undoes them all."""

    def __init__(self, n: int = 2, tag: str | None = None):
        if n < 2 or n > 200:
            raise ValueError(f"Hosts(n): {n} hosts; give 2 to 200")
        tag = tag or str(os.getpid())
        self.bridge = f"hvdbr{tag}"
        self.namespaces = [f"hvd{i}n{tag}" for i in range(n)]
        self.addresses = [f"{SUBNET}.{i + 1}" for i in range(n)]
        # Each host's hostname is its address: distinct, so Open MPI sees separate nodes, and
        # resolvable without an /etc/hosts entry, which Gloo needs to find its own address.
        self.names = list(self.addresses)
        self.folder: Path | None = None  # netns_ssh's per-host files, and `ssh` for horovodrun
        self.throttled: set[int] = set()

    def __enter__(self) -> Hosts:
        self.folder = Path(tempfile.mkdtemp(prefix="hvdtrain-netns-"))
        (self.folder / "ssh").symlink_to(SSH)
        try:
            for ns in (self.bridge, *self.namespaces):
                _run("ip", "netns", "add", ns)
                _run("ip", "-n", ns, "link", "set", "lo", "up")
            _run("ip", "-n", self.bridge, "link", "add", "br0", "type", "bridge")
            _run("ip", "-n", self.bridge, "link", "set", "br0", "up")
            for i, (ns, address) in enumerate(zip(self.namespaces, self.addresses)):
                port = f"hvdp{i}"
                _run("ip", "-n", self.bridge, "link", "add", port, "type", "veth", "peer",
                     "name", DEVICE, "netns", ns)
                _run("ip", "-n", self.bridge, "link", "set", port, "master", "br0", "up")
                _run("ip", "-n", ns, "addr", "add", f"{address}/24", "dev", DEVICE)
                _run("ip", "-n", ns, "link", "set", DEVICE, "up")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        for ns in (*self.namespaces, self.bridge):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        if self.folder:
            shutil.rmtree(self.folder, ignore_errors=True)

    @property
    def env(self) -> dict[str, str]:
        """Environment for launchers: the host map and per-host files for netns_ssh, and
        netns_ssh as `ssh` on PATH (for horovodrun)."""
        hosts = ",".join(f"{addr}={ns}={name}" for addr, ns, name in
                         zip(self.addresses, self.namespaces, self.names))
        return {"HVDTRAIN_NETNS_HOSTS": hosts, "HVDTRAIN_NETNS_DIR": str(self.folder),
                "PATH": f"{self.folder}{os.pathsep}{os.environ.get('PATH', '')}"}

    def on(self, host: int, command: list[str]) -> list[str]:
        """The command line that runs ``command`` on host ``host`` (its faults apply)."""
        return [str(SSH), self.addresses[host], *command]

    # TCP over the hosts' interfaces, no binding. The hosts share this machine's cores, which
    # Open MPI does not know: ranks that spin while they wait starve the others (the doctor's
    # ranks yield for that reason, hvdtrain/doctor/rank.py).
    mpirun_flags = staticmethod(TwoHosts.mpirun_flags)

    def hostfile(self, path: Path, slots: dict[int, int]) -> Path:
        """An Open MPI hostfile: host index -> slots (a host left out is not in the file)."""
        path.write_text("".join(f"{self.addresses[i]} slots={n}\n" for i, n in slots.items()))
        return path

    # -- faults -----------------------------------------------------------------------------

    def throttle(self, host: int, mbit: float) -> None:
        """Both directions of ``host``'s link at ``mbit`` Mbit/s: its own end's egress (what it
        sends) and the bridge's end's (what it receives)."""
        if not mbit > 0:
            raise ValueError(f"throttle: invalid rate {mbit}; use a positive Mbit/s")
        _run(*tbf(self.namespaces[host], DEVICE, mbit))
        _run(*tbf(self.bridge, f"hvdp{host}", mbit))
        self.throttled.add(host)

    def mount(self, host: int, source: Path, target: Path) -> None:
        """Commands on ``host`` see folder ``source`` at ``target`` (a bind mount in a mount
        namespace of their own; the other hosts and this machine still see ``target``)."""
        with open(self._file(host, "mounts"), "a") as out:
            out.write(f"{Path(source).resolve()}\t{Path(target).resolve()}\n")

    def login_env(self, host: int, env: dict[str, str]) -> None:
        """Commands on ``host`` start with ``env`` alone (plus netns_ssh's own variables), as
        a real ssh login starts them without the caller's environment."""
        self._file(host, "env").write_text("".join(f"{k}={v}\n" for k, v in env.items()))

    def heal(self) -> None:
        """Undo every fault: no throttle, no mounts, every host inherits the caller's
        environment again."""
        for host in sorted(self.throttled):
            for ns, device in ((self.namespaces[host], DEVICE), (self.bridge, f"hvdp{host}")):
                subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", device,
                                "root"], capture_output=True, timeout=30)
        self.throttled.clear()
        for host in range(len(self.names)):
            for kind in ("mounts", "env"):
                self._file(host, kind).unlink(missing_ok=True)

    def _file(self, host: int, kind: str) -> Path:
        assert self.folder is not None, "use Hosts inside `with`"
        return self.folder / f"{self.names[host]}.{kind}"


def login_env(path: str = LOGIN_PATH, **more: str) -> dict[str, str]:
    """A plain login's environment (HOME, the system PATH), ``path`` and ``more`` on top."""
    return {"HOME": os.environ.get("HOME", "/root"), "PATH": path, "LANG": "C.UTF-8", **more}


def other_venv(folder: Path, version: str) -> Path:
    """A second venv at ``folder`` whose hvdtrain is a copy of this one reporting ``version``
    (its package and its metadata), with this venv's torch, Horovod and mpi4py: what a host finds
    when an older hvdtrain is installed there. Returns its bin folder (put it first on PATH)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True,
                   capture_output=True, timeout=120)
    purelib = Path(sysconfig.get_paths()["purelib"])
    site = next((folder / "lib").glob("python3*/site-packages"))
    # This venv's packages after its own (a path from a .pth file: its own .pth files, such as
    # the editable hvdtrain's finder, are not run, so hvdtrain comes from the copy).
    (site / "base.pth").write_text(f"{purelib}\n")
    package = Path(__file__).resolve().parents[2] / "hvdtrain"
    shutil.copytree(package, site / "hvdtrain", ignore=shutil.ignore_patterns("__pycache__"))
    init = site / "hvdtrain" / "__init__.py"
    text = init.read_text()
    old = next(line for line in text.splitlines() if line.startswith("__version__ ="))
    init.write_text(text.replace(old, f'__version__ = "{version}"'))
    info = site / f"hvdtrain-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: hvdtrain\nVersion: {version}\n")
    (info / "entry_points.txt").write_text("[console_scripts]\nhvdtrain = hvdtrain.cli:main\n")
    script = folder / "bin" / "hvdtrain"
    script.write_text(f"#!{folder / 'bin' / 'python'}\nimport sys\nfrom hvdtrain.cli import main\n"
                      "sys.exit(main())\n")
    script.chmod(0o755)
    return folder / "bin"
