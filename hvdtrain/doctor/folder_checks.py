"""run_dir: the run folder is writable from every rank and is the same folder on every host
(rank 0's probe file is read back everywhere), since checkpoints and the run's lock need it."""

from __future__ import annotations

from .problem import Problem, by_host, names


def check_run_dir(ranks: list[dict], run_dir: str) -> list[Problem]:
    if any("run_dir" not in f for f in ranks):  # the ranks hung before the test (launcher.py)
        return []
    hosts = by_host(ranks)
    problems = []
    for host, group in hosts.items():
        failed = [f for f in group if not f["run_dir"]["writable"]]
        if failed:
            problems.append(Problem(
                "run_dir", f"{run_dir} is not writable on {host} ({failed[0]['run_dir']['error']})",
                f"give --run-dir a folder every rank can write, or fix its permissions on {host}"))
    first = next(iter(hosts))
    if any(not f["run_dir"]["writable"] for f in hosts[first] if f["rank"] == 0):
        return problems  # rank 0 wrote no probe file: whether the folder is shared is unknown
    apart = [h for h, group in hosts.items() if any(f["run_dir"]["writable"] and
                                                    not f["run_dir"]["sees_rank0"] for f in group)]
    if apart:
        problems.append(Problem(
            "run_dir", f"{names(apart)} see(s) a different {run_dir} than {first} (rank 0's "
            "file is not there)",
            f"put {run_dir} on a file system every host mounts at the same path (NFS, a "
            "Kubernetes ReadWriteMany volume), or give --run-dir such a folder"))
    return problems
