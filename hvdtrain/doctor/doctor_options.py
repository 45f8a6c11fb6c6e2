"""The doctor's options, shared by `hvdtrain doctor` and the per-rank probe (rank.py), and
their checks: bad input is a DoctorInput that names the option to fix."""

from __future__ import annotations

import argparse
import math

from .asked import DoctorInput, parse_host_slots

DEFAULT_SIZES = "64KiB,1MiB,16MiB"
UNITS = {"": 1, "B": 1, "KIB": 1024, "KB": 1000, "MIB": 1024 ** 2, "MB": 1000 ** 2,
         "GIB": 1024 ** 3, "GB": 1000 ** 3, "K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", default="doctor.json", metavar="PATH",
                   help="where to write what the doctor measured and found (written atomically)")
    p.add_argument("--run-dir", default="runs", metavar="DIR",
                   help="the folder the runs will use: it must be writable from every rank and "
                        "the same folder on every host")
    p.add_argument("--sizes", default=DEFAULT_SIZES, metavar="SIZES",
                   help="message sizes of the link and allreduce tests, e.g. 64KiB,1MiB,16MiB; "
                        "bandwidth is measured at the largest that fits the time")
    p.add_argument("--timeout", type=float, default=60.0, metavar="SECONDS",
                   help="the whole doctor ends within this; the launcher is ended if its ranks "
                        "hang, and the hosts that never answered are named")
    p.add_argument("--env", default="", metavar="NAME,...",
                   help="more environment variables that must be the same on every rank")
    p.add_argument("--expect", default=None, metavar="HOST:SLOTS,...",
                   help="the hosts and slots the job asked for, when the doctor runs under the "
                        "launcher (mpirun ... hvdtrain doctor); else they are read from the "
                        "launcher line, --hostfile, Open MPI's or an MPIJob's hostfile, or Slurm")
    p.add_argument("--hostfile", default=None, metavar="PATH",
                   help="the hostfile the job uses: under the launcher, what was asked for; "
                        "on its own, the doctor runs mpirun over its hosts and slots (beside a "
                        "launcher line, give it to the launcher instead)")


def parse_sizes(text: str) -> list[int]:
    sizes = []
    for entry in (e.strip() for e in text.split(",") if e.strip()):
        number = entry.rstrip("KkMmGgiIBb")
        unit = entry[len(number):].upper()
        if not number.isdigit() or unit not in UNITS or int(number) < 1:
            raise DoctorInput(f"--sizes {text!r}: {entry!r} is not a size; write e.g. "
                              "64KiB,1MiB,16MiB")
        sizes.append(int(number) * UNITS[unit])
    if not sizes:
        raise DoctorInput(f"--sizes {text!r}: give at least one size, e.g. 64KiB,1MiB,16MiB")
    return sorted(set(sizes))


def checked(args: argparse.Namespace) -> argparse.Namespace:
    """The options, checked: DoctorInput names the one to fix."""
    args.size_list = parse_sizes(args.sizes)
    if not (args.timeout > 0 and math.isfinite(args.timeout)):  # inf: the doctor never ends
        raise DoctorInput(f"--timeout {args.timeout:g}: give a positive number of seconds")
    args.env_names = tuple(n.strip() for n in args.env.split(",") if n.strip())
    if args.expect is not None:
        parse_host_slots(args.expect, "--expect")
    if args.hostfile is not None:  # at once: under a launcher, an unreadable one waited out
        from .asked import parse_hostfile  # the whole --timeout
        parse_hostfile(args.hostfile)
    return args
