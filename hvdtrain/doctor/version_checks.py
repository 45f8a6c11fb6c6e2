"""versions: the same hvdtrain, torch, Horovod (and its build), mpi4py and Python on every host;
devices: GPUs per host against ranks per host, and the same CUDA and NCCL."""

from __future__ import annotations

from .problem import Problem, by_host, names, odd_hosts

PACKAGES = ("hvdtrain", "torch", "horovod", "mpi4py", "python")


def _shown(value) -> str:
    return "not installed" if value is None else str(value)


def _build(horovod: dict | None) -> str:
    if horovod is None:
        return "no Horovod"
    built = [k.upper() if k != "gloo" else "Gloo" for k in ("mpi", "gloo", "nccl") if horovod[k]]
    return "+".join(built) or "no controller"


def check_versions(ranks: list[dict]) -> list[Problem]:
    hosts = by_host(ranks)
    problems = []
    for host, group in hosts.items():  # ranks of one host that run different Pythons
        executables = sorted({f["executable"] for f in group})
        if len(executables) > 1:
            problems.append(Problem("versions", f"{host}: its ranks run different Pythons "
                                    f"({', '.join(executables)})", "launch every rank with "
                                    "the same venv's python"))
    if len(hosts) < 2:
        return problems
    for package in PACKAGES:
        values = {h: g[0]["versions"].get(package) for h, g in hosts.items()}
        common, odd = odd_hosts(values)
        for host in odd:
            problems.append(Problem(
                "versions", f"{package} {_shown(values[host])} on {host} "
                f"({hosts[host][0]['executable']}), {_shown(common)} on the others",
                f"install the same {package} on every host, or put the same venv first on PATH "
                f"on {host} (mpirun -x PATH, or the same image)"))
    builds = {h: _build(g[0].get("horovod")) for h, g in hosts.items()}
    common, odd = odd_hosts(builds)
    for host in odd:
        problems.append(Problem("versions", f"Horovod on {host} is built with {builds[host]}, "
                                f"on the others with {common}",
                                "build Horovod the same way on every host (HOROVOD_WITH_MPI=1 "
                                "HOROVOD_WITH_GLOO=1, and HOROVOD_GPU_OPERATIONS=NCCL on GPUs)"))
    return problems


def host_gpus(group: list[dict]) -> int:
    """GPUs a host offers its ranks: what one rank sees, or the sum when each rank is given GPUs
    of its own (a different CUDA_VISIBLE_DEVICES per rank, as Slurm's --gpus-per-task does)."""
    visible = {f["env"].get("CUDA_VISIBLE_DEVICES") for f in group}
    if len(visible) == len(group) > 1 and None not in visible:
        return sum(f["gpus"] for f in group)
    return max(f["gpus"] for f in group)


def check_devices(ranks: list[dict]) -> list[Problem]:
    hosts = by_host(ranks)
    gpus = {h: host_gpus(g) for h, g in hosts.items()}
    problems = []
    if any(gpus.values()):
        for host, group in hosts.items():
            if gpus[host] < len(group):
                problems.append(Problem(
                    "devices", f"{host}: {len(group)} ranks and {gpus[host]} GPU(s)",
                    f"run at most {gpus[host]} rank(s) on {host} (-H {host}:{gpus[host]}), or "
                    "check its driver and CUDA_VISIBLE_DEVICES" if gpus[host] else
                    f"leave {host} out of a GPU job, or check its driver (nvidia-smi) and "
                    "CUDA_VISIBLE_DEVICES"))
    for key in ("cuda", "nccl"):
        values = {h: g[0].get(key) for h, g in hosts.items() if gpus[h]}
        if len(values) < 2:
            continue
        common, odd = odd_hosts(values)
        if odd:
            problems.append(Problem("devices", f"{key.upper()} {_shown(values[odd[0]])} on "
                                    f"{names(odd)}, {_shown(common)} on the others",
                                    f"install the same torch build (its {key.upper()}) on "
                                    "every host"))
    return problems
