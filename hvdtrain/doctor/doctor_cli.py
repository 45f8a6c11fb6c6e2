"""``hvdtrain doctor [options] [LAUNCHER ARGS...]``: its flags, and the choice between running a
launcher with the probe appended (launcher.py) and being the probe itself (rank.py), when a
launcher started this process. Imports nothing heavy: `hvdtrain doctor --help` loads no torch."""

from __future__ import annotations

import argparse
import os
import sys

from .asked import DoctorInput
from .doctor_options import add_options, checked

# Set by a launcher in each rank it starts: this process is a rank, not the user's shell.
RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID", "HOROVOD_RANK")


def add_parser(commands) -> None:
    p = commands.add_parser(
        "doctor", help="check a cluster before the first launch: hosts, versions, devices, "
                       "network, run folder, environment",
        description="Check a cluster before the first launch, with the job's launcher and "
                    "hosts: hvdtrain doctor mpirun -np 8 -H a:4,b:4 (or horovodrun, srun), or "
                    "as the job's command (srun ... hvdtrain doctor, mpirun ... hvdtrain doctor "
                    "--expect a:4,b:4, an MPIJob's launcher). Prints one line per problem with "
                    "its fix, the links' bandwidth and latency, and 'doctor: fit' (exit 0) or "
                    "'doctor: NOT fit' (exit 2); writes doctor.json (see docs/doctor.md).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter, allow_abbrev=False)
    add_options(p)
    p.add_argument("launch_command", nargs=argparse.REMAINDER, metavar="LAUNCHER ARGS",
                   help="the job's launcher line without its program (mpirun -np 4 -H a:2,b:2 "
                        "...), after the doctor's own options: everything from the launcher's "
                        "name on is the launcher's; leave it out when a launcher started the "
                        "doctor")


def own_launcher(env, hostfile: str | None = None) -> list[str]:
    """The doctor's launcher on its own: srun over a Slurm allocation, with PMIx for the probe's
    MPI as the job's own srun has it (--mpi=pmix), unless SLURM_MPI_TYPE names the site's;
    else mpirun over the hosts and slots of the job's --hostfile, or one rank here."""
    if "SLURM_JOB_ID" not in env:
        if hostfile:
            from .asked import parse_hostfile
            slots = sum(parse_hostfile(hostfile).values())
            return ["mpirun", "--hostfile", hostfile, "-np", str(slots)]
        return ["mpirun", "-np", "1"]
    return ["srun"] + ([] if env.get("SLURM_MPI_TYPE") else ["--mpi=pmix"])


def under_launcher(env: dict[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    if env.get("HOROVOD_CONTROLLER") == "gloo":  # horovodrun --gloo: no MPI between the ranks
        raise DoctorInput("the doctor's ranks talk over MPI, which horovodrun --gloo does not "
                          "start: run horovodrun --mpi ... hvdtrain doctor, or hvdtrain doctor "
                          "horovodrun -np N -H ...")
    if any(name in env for name in RANK_VARIABLES if name != "SLURM_PROCID"):
        return True  # an MPI or Horovod rank, even where it inherited a batch shell's Slurm
    # SLURM_PROCID without a step: a batch script's own shell, not a task that srun started
    return "SLURM_PROCID" in env and ("SLURM_STEP_ID" in env or "SLURM_STEPID" in env)


def refuse_program(command: list[str]) -> None:
    """The launcher line must end before the program: the doctor appends its own probe, and
    the launcher would have read the job's flags (hvdtrain train --run-dir ...) as the probe's,
    failing with "unrecognized arguments" blamed on a launcher flag."""
    for i, word in enumerate(command):
        if command[i + 1:i + 3] == ["-m", "hvdtrain"] or os.path.basename(word) == "hvdtrain":
            rest = " ".join(command[i:i + 3])
            raise DoctorInput(
                f"the launcher line holds the program ({rest} ...): give the launcher line "
                f"alone, hvdtrain doctor {' '.join(command[:i]) or 'mpirun -np N ...'}, and the "
                "job's --run-dir as the doctor's own --run-dir; the doctor starts its probe in "
                "the program's place")


def main(args: argparse.Namespace) -> int:
    from ..exit_codes import EXIT_BAD_INPUT

    try:
        args = checked(args)
        command = list(args.launch_command or [])
        command = command[1:] if command[:1] == ["--"] else command
        refuse_program(command)
        if command and args.hostfile:  # it was ignored: the launcher places the ranks
            raise DoctorInput(f"--hostfile {args.hostfile}: with a launcher line, give the "
                              f"hostfile to the launcher ({command[0]} --hostfile "
                              f"{args.hostfile} ...), which places the ranks by it, and the "
                              "doctor reads it there")
        if command:
            from .launcher import run_doctor
            return run_doctor(command, args)
        if under_launcher():
            from .rank import probe
            return probe(args, to_stdout=False)
        from .launcher import run_doctor  # on its own: the allocation's tasks, or one rank here
        return run_doctor(own_launcher(os.environ, args.hostfile), args)
    except DoctorInput as e:  # under a launcher every rank has it: rank 0 says it
        from .rank import rank_from_environment

        if rank_from_environment() == 0:
            print(f"hvdtrain doctor: error: {e}", file=sys.stderr, flush=True)
        return EXIT_BAD_INPUT
