"""The doctor's verdict over the gathered facts: every check, one line per problem with its fix,
a table of the links, ``doctor: fit`` or ``doctor: NOT fit (N problems)``, and doctor.json
(schema version 1, written atomically)."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

from .asked import Asked
from .environment_checks import check_clocks, check_environment
from .folder_checks import check_run_dir
from .host_checks import check_hosts
from .network_checks import check_interfaces, check_links
from .problem import Problem, by_host
from .version_checks import check_devices, check_versions

VERSION = 1


def all_problems(facts: dict, asked: Asked | None, run_dir: str) -> list[Problem]:
    ranks = facts["ranks"]
    return [*facts.get("problems_before", []),
            *check_hosts(ranks, asked, facts.get("resolved")),
            *check_versions(ranks), *check_devices(ranks),
            *check_interfaces(ranks), *check_links(facts.get("links", [])),
            *check_run_dir(ranks, run_dir),
            *check_environment(ranks, facts.get("launcher"), facts.get("launcher_env")),
            *check_clocks(facts.get("clock_offsets", {}), ranks[0]["host"] if ranks else "")]


def host_entry(group: list[dict], offset: float | None) -> dict:
    first = group[0]
    routes = sorted({i for f in group for i in f.get("routes", {}).values() if i})
    route = ",".join(routes) or None
    told = first.get("told", {})
    return {"ranks": [f["rank"] for f in group], "python": first["versions"]["python"],
            "executable": first["executable"], "hvdtrain": first["versions"]["hvdtrain"],
            "torch": first["versions"]["torch"], "mpi4py": first["versions"]["mpi4py"],
            "horovod": first.get("horovod"), "gpus": first["gpus"], "cuda": first["cuda"],
            "nccl": first["nccl"],
            "interfaces": {lib: told.get(lib, route) for lib in ("mpi", "gloo", "nccl")},
            "clock_offset_s": offset}


def report(facts: dict, problems: list[Problem], asked: Asked | None) -> dict:
    offsets = facts.get("clock_offsets", {})
    return {"version": VERSION, "fit": not problems, "ranks": len(facts["ranks"]),
            "asked": asked.to_json() if asked else None,
            "hosts": {h: host_entry(g, offsets.get(h)) for h, g in by_host(facts["ranks"]).items()},
            "links": facts.get("links", []), "allreduce": facts.get("allreduce"),
            "problems": [p.to_json() for p in problems]}


def unfinished_report(asked: Asked | None, problems: list[Problem], ranks: int) -> dict:
    """doctor.json when the ranks never reported: what is known is the problems."""
    return {"version": VERSION, "fit": False, "ranks": ranks,
            "asked": asked.to_json() if asked else None, "hosts": {}, "links": [],
            "allreduce": None, "problems": [p.to_json() for p in problems]}


def write_json(path: str, document: dict) -> None:
    """Atomically: a reader (compare --links, a deploy script) never sees half a file."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=".doctor-", suffix=".json", dir=target.parent)
    with os.fdopen(fd, "w") as f:
        json.dump(document, f, indent=1)
        f.write("\n")
    os.replace(temporary, target)


def link_table(document: dict) -> list[str]:
    lines = []
    for link in document["links"]:
        rate = link.get("bandwidth_mbit")
        lines.append(f"doctor: link {' - '.join(link['hosts'])}: "
                     f"{f'{rate:.1f} Mbit/s' if rate else 'not measured'}, "
                     f"latency {link['latency_ms']:.3f} ms")
    reduce = document.get("allreduce")
    if reduce and reduce["sizes"]:
        top = reduce["sizes"][-1]
        lines.append(f"doctor: allreduce over {reduce['ranks']} ranks: bus bandwidth "
                     f"{top['bus_mbit']:.1f} Mbit/s at {top['bytes']} bytes")
    return lines


def conclude(facts: dict, asked: Asked | None, run_dir: str, json_path: str,
             out=None) -> int:
    """Print the problems, the links and the verdict; write doctor.json; the exit code."""
    from ..exit_codes import EXIT_BAD_INPUT

    out = out or sys.stdout
    problems = all_problems(facts, asked, run_dir)
    document = report(facts, problems, asked)
    for problem in problems:
        print(problem.line(), file=out)
    for line in link_table(document):
        print(line, file=out)
    return 0 if not write_and_judge(json_path, document, len(problems), out) else EXIT_BAD_INPUT


def write_and_judge(json_path: str, document: dict, problems: int, out) -> int:
    """doctor.json, the line that says where it is, then the verdict: the same three ends for
    a finished doctor and for one its deadline stopped. A report that cannot be written (the
    run folder it goes into is not writable, which the problems above may say) is one more
    problem, and the verdict still comes; returns the problems counted."""
    try:
        write_json(json_path, document)
        print(f"doctor: measurements and problems written to {json_path}", file=out)
    except OSError as e:
        problems += 1
        print(Problem("report", f"--json {json_path} cannot be written ({e.strerror or e})",
                      "give --json a file in a writable folder (the problems above may say "
                      "why this one is not)").line(), file=out)
    print("doctor: fit" if not problems else f"doctor: NOT fit ({problems} problem"
          f"{'s' if problems != 1 else ''})", file=out, flush=True)
    return problems
