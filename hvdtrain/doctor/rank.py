"""The per-rank probe: ``python -m hvdtrain.doctor.rank [doctor options]``, which the doctor
appends to a launcher line, and what `hvdtrain doctor` runs when a launcher started it.

Every rank says at once that it started (a line the doctor reads, so that on a timeout it can
name the hosts that never answered), then gathers its facts, measures with the others, and
rank 0 either prints the facts as one line for the doctor (``--facts-to-stdout``) or judges them
itself (verdict.py). Every rank exits with the verdict's code."""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time

# The kinds of line the ranks print for the doctor that launched them.
STARTED = "hvdtrain-doctor-started"
FACTS = "hvdtrain-doctor-facts"
STEP = "hvdtrain-doctor-step"
MARGIN_S = 3.0  # for the verdict, the file and MPI's finalize


def rank_from_environment() -> int:
    for name in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID", "HOROVOD_RANK"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return 0


def _routes(comm, everyone: list[dict]) -> dict[str, str | None]:
    """At a host's leader: the interface of the route to each other host."""
    from .facts import route_interface
    from .measure import leaders

    hosts = [f["host"] for f in everyone]
    me = comm.Get_rank()
    if leaders(hosts).get(hosts[me]) != me:
        return {}
    table = everyone[me]["addresses"]
    routes = {}
    for host, leader in leaders(hosts).items():
        target = _target(host, everyone[leader]["addresses"], set(table.values())) \
            if host != hosts[me] else None
        if target:  # none: no IPv4 address known for it (IPv6 only), nothing to judge
            routes[host] = route_interface(target, table)
    return routes


def _target(host: str, theirs: dict[str, str], ours: set[str]) -> str | None:
    """The address to reach ``host`` by: what its name resolves to here (a loopback one is the
    fault the network check names), else an address of its own that this host lacks (every
    host may have docker0's 172.17.0.1)."""
    resolved = resolve([host]).get(host)
    if resolved and (resolved.startswith("127.") or resolved not in ours):
        return resolved
    own = [a for a in theirs.values() if a not in ours and not a.startswith("127.")]
    return own[0] if own else None


def yield_while_waiting(env=os.environ) -> None:
    """Ranks that wait give up their core (Open MPI's mpi_yield_when_idle), unless the user
    said otherwise; read at MPI's start. Most ranks wait while one pair measures its link, and
    ranks spinning in a receive on a host with fewer cores than ranks (a pod's CPU limit,
    hosts sharing a machine) starve that pair: three links on two cores measured ~20 Mbit/s,
    not Gbit/s, and a 100 Mbit/s link the same."""
    env.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")


def time_left(args, started: float) -> float:
    """Seconds left for the measurements: --timeout from this rank's start, and no later than
    the launching doctor's --deadline (its clock's time), which counts the ranks' start-up."""
    left = args.timeout - (time.monotonic() - started)
    if getattr(args, "deadline", None):
        left = min(left, args.deadline - time.time())
    return left - MARGIN_S


def gather(args, started: float, say) -> dict | None:
    """Every rank's facts and the measurements; the whole at rank 0, None elsewhere. ``say``
    tells the doctor what the ranks do now, and the facts so far, so that a hang is named."""
    yield_while_waiting()
    from mpi4py import MPI

    from . import measure
    from .facts import fill_in, local_facts

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    hosts = comm.allgather(socket.gethostname())
    lead = measure.leaders(hosts)[hosts[rank]] == rank
    everyone = comm.allgather(local_facts(rank, args.env_names, lead))
    fill_in(everyone)
    if rank == 0:
        say(FACTS, json.dumps({"ranks": everyone, "partial": True}))
        say(STEP, "the clocks' and the run folder's tests")
    mine = {"routes": _routes(comm, everyone)}
    offsets = measure.clock_offsets(comm, hosts)
    mine["run_dir"] = measure.run_dir_test(comm, args.run_dir)
    left = comm.bcast(time_left(args, started), root=0)  # rank 0's clock decides
    links = measure.links(comm, hosts, args.size_list, max(0.5, left * 0.6),
                          lambda x, y: say(STEP, f"the link test between {x} and {y}"))
    left = comm.bcast(time_left(args, started), root=0)
    if rank == 0:
        say(STEP, f"the allreduce over {len(hosts)} ranks")
    reduce = measure.allreduce(comm, args.size_list, max(0.2, left * 0.8), min(0.3, left / 10))
    parts = comm.gather(mine, root=0)
    if rank != 0:
        return None
    for facts, part in zip(everyone, parts):
        facts.update(part)
    return {"ranks": everyone, "links": links, "allreduce": reduce, "clock_offsets": offsets}


def probe(args: argparse.Namespace, to_stdout: bool) -> int:
    """With ``to_stdout`` (the doctor launched this), rank 0 prints the facts for the doctor to
    judge; else rank 0 judges them here. Every rank returns the verdict's exit code."""
    started = time.monotonic()

    def say(kind: str, text: str) -> None:
        if to_stdout:
            print(f"{kind} {text}", flush=True)

    from .facts import addresses

    say(STARTED, f"{rank_from_environment()} {socket.gethostname()} "
        f"{','.join(addresses().values())}")
    watchdog = None if to_stdout else start_watchdog(args)
    facts = gather(args, started, say)
    from mpi4py import MPI

    code = 0
    if facts is not None and to_stdout:
        say(FACTS, json.dumps(facts))
    elif facts is not None:
        from .asked import from_probe_options
        from .verdict import conclude

        asked = from_probe_options(args.expect, args.hostfile)
        facts["resolved"] = resolve(list(asked.hosts) if asked else [])
        code = conclude(facts, asked, args.run_dir, args.json)
    code = MPI.COMM_WORLD.bcast(code, root=0)
    if watchdog is not None:
        watchdog.stop()
    return code


def start_watchdog(args):
    """The deadline of a rank no doctor launched (deadline.py)."""
    from .deadline import Guards

    return Guards(max(1.0, args.timeout - 1.0), rank_from_environment(), args.json)


def resolve(names: list[str]) -> dict[str, str]:
    """Host name -> IPv4 address, for the names that resolve."""
    found = {}
    for name in names:
        try:
            found[name] = socket.gethostbyname(name)
        except OSError:
            continue
    return found


def main(argv: list[str] | None = None) -> int:
    from .asked import DoctorInput
    from .doctor_options import add_options, checked

    parser = argparse.ArgumentParser(prog="python -m hvdtrain.doctor.rank", allow_abbrev=False)
    add_options(parser)
    parser.add_argument("--facts-to-stdout", action="store_true",
                        help="rank 0 prints the facts as one line for the doctor that launched it")
    parser.add_argument("--deadline", type=float, default=None, metavar="EPOCH_S",
                        help="the launching doctor's deadline (time.time()): the ranks' start-up "
                             "counts against its --timeout")
    args = parser.parse_args(argv)
    try:
        args = checked(args)
    except DoctorInput as e:
        print(f"hvdtrain doctor: error: {e}", file=sys.stderr, flush=True)
        return 2
    return probe(args, args.facts_to_stdout)


if __name__ == "__main__":
    sys.exit(main())
