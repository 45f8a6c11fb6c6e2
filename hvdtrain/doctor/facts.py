"""What one rank sees of itself, before it talks to the others: its host and addresses, the
versions it runs, its devices, the variables that must reach every rank, the interfaces MPI and
Gloo/NCCL were told to use. Plain JSON-able dicts: the checks read them (and unit tests fake them).
"""

from __future__ import annotations

import fcntl
import os
import platform
import socket
import struct
import sys
from importlib import metadata

# Variables a launcher sets per rank or per host (they differ by design): never compared.
PER_RANK = {
    "HOROVOD_RANK", "HOROVOD_LOCAL_RANK", "HOROVOD_CROSS_RANK", "HOROVOD_SIZE",
    "HOROVOD_LOCAL_SIZE", "HOROVOD_CROSS_SIZE", "HOROVOD_HOSTNAME",
    "HVDTRAIN_RANKS_FILE", "HVDTRAIN_PREEMPTED_FILE",  # `hvdtrain run`'s files, on its host
    "OMPI_MCA_ess", "OMPI_MCA_pmix", "OMPI_MCA_initial_wdir", "OMPI_MCA_shmem_RUNTIME_QUERY_hint",
    "OMPI_MCA_mpi_oversubscribe", "OMPI_MCA_rmaps_base_oversubscribe",
    # set by mpirun for ranks on its own host only, or by a remote host's daemon only
    "OMPI_MCA_orte_node_regex", "OMPI_MCA_orte_parent_uri", "OMPI_MCA_plm", "OMPI_MCA_routed",
}
PER_RANK_PREFIXES = ("OMPI_MCA_ess_", "OMPI_MCA_orte_ess_", "OMPI_MCA_orte_hnp",
                     "OMPI_MCA_orte_local", "OMPI_MCA_orte_jobfam", "OMPI_MCA_orte_top_session",
                     "OMPI_MCA_orte_launch", "OMPI_MCA_orte_app_num", "OMPI_MCA_orte_bound",
                     "OMPI_MCA_orte_num_nodes", "OMPI_MCA_orte_precondition",
                     "HOROVOD_GLOO_RENDEZVOUS", "HOROVOD_CONTROLLER",
                     "HOROVOD_CPU_OPERATIONS_RANK")
WATCHED_PREFIXES = ("HOROVOD_", "NCCL_", "HVDTRAIN_", "OMPI_MCA_", "GLOO_")
WATCHED = ("CUDA_VISIBLE_DEVICES", "VIRTUAL_ENV", "PYTHONPATH")
# What each library is told to use for its traffic (empty: it picks the route's interface).
INTERFACE_SETTINGS = {
    "mpi": ("OMPI_MCA_btl_tcp_if_include", "OMPI_MCA_btl_tcp_if_exclude"),
    "gloo": ("HOROVOD_GLOO_IFACE", "GLOO_SOCKET_IFNAME"),
    "nccl": ("NCCL_SOCKET_IFNAME",),
}
DISTRIBUTIONS = ("hvdtrain", "torch", "mpi4py", "horovod")


def watched(name: str, extra: tuple[str, ...] = ()) -> bool:
    if name in PER_RANK or name.startswith(PER_RANK_PREFIXES):
        return False
    return name.startswith(WATCHED_PREFIXES) or name in WATCHED or name in extra


def environment(env: dict[str, str], extra: tuple[str, ...] = ()) -> dict[str, str]:
    """The variables that must agree on every rank, and "PATH_VENV": the folder of the first
    python on PATH (the venv a job's `python` or `hvdtrain` comes from)."""
    found = {k: v for k, v in env.items() if watched(k, extra)}
    found["PATH_VENV"] = path_venv(env.get("PATH", ""))
    return dict(sorted(found.items()))


def path_venv(path: str) -> str:
    for folder in path.split(os.pathsep):
        if folder and any(os.access(os.path.join(folder, name), os.X_OK)
                          for name in ("python", "python3")):
            return os.path.dirname(folder.rstrip("/")) if folder.rstrip("/").endswith("/bin") \
                else folder
    return ""


def versions() -> dict[str, str | None]:
    """The installed distributions' versions (importlib.metadata: no slow imports), and Python."""
    found: dict[str, str | None] = {"python": platform.python_version()}
    for name in DISTRIBUTIONS:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def horovod_build() -> dict | None:
    """Horovod's build (MPI, Gloo, NCCL), None without Horovod. Imports horovod.torch, hence
    torch: the one slow import of the probe."""
    try:
        import horovod.torch as hvd
    except Exception:  # not installed, or built against another torch: the versions say
        return None
    nccl = hvd.nccl_built()
    return {"version": metadata.version("horovod"), "mpi": bool(hvd.mpi_built()),
            "gloo": bool(hvd.gloo_built()), "nccl": bool(nccl)}


def devices() -> dict:
    """GPUs this rank sees, and the CUDA and NCCL versions torch was built with."""
    try:
        import torch
    except Exception:
        return {"gpus": 0, "cuda": None, "nccl": None}
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    nccl = None
    if gpus:
        try:
            nccl = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:
            nccl = None
    return {"gpus": gpus, "cuda": torch.version.cuda, "nccl": nccl}


def addresses() -> dict[str, str]:
    """Interface name -> IPv4 address, for every interface that has one (SIOCGIFADDR)."""
    found: dict[str, str] = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))
            except OSError:
                continue
            found[name] = socket.inet_ntoa(packed[20:24])
    return found


def route_interface(target: str, table: dict[str, str]) -> str | None:
    """The interface of the route to ``target`` (a UDP connect sends nothing), None if none."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((target, 9))
            source = s.getsockname()[0]
    except OSError:
        return None
    return next((name for name, address in table.items() if address == source), None)


def interface_settings(env: dict[str, str]) -> dict[str, str]:
    """What each library was told to use: "NAME=value" of the first setting found, per library."""
    told = {}
    for library, names in INTERFACE_SETTINGS.items():
        name = next((n for n in names if env.get(n)), None)
        if name:
            told[library] = f"{name}={env[name]}"
    return told


def local_facts(rank: int, extra_env: tuple[str, ...] = (), lead: bool = True) -> dict:
    """This rank's facts, without its measurements (measure.py adds those). Horovod's build and
    the devices need torch (two seconds a rank): only a host's lead rank imports it, and a rank
    given devices of its own (CUDA_VISIBLE_DEVICES); the others take their lead's (fill_in)."""
    env = dict(os.environ)
    facts = {"rank": rank, "host": socket.gethostname(), "pid": os.getpid(),
             "executable": sys.executable, "versions": versions(),
             "addresses": addresses(), "told": interface_settings(env),
             "env": environment(env, extra_env)}
    if lead or "CUDA_VISIBLE_DEVICES" in env:
        facts.update(horovod=horovod_build(), **devices())
    return facts


def fill_in(everyone: list[dict]) -> None:
    """Horovod's build and the devices of the ranks that left them to their host's lead."""
    leads: dict[str, dict] = {}
    for facts in everyone:
        leads.setdefault(facts["host"], facts)
        for key in ("horovod", "gpus", "cuda", "nccl"):
            facts.setdefault(key, leads[facts["host"]].get(key))
