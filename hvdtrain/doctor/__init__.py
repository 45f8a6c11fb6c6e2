"""``hvdtrain doctor``: check a cluster before the first launch (issue 44).

Run with the job's launcher and hosts (``hvdtrain doctor mpirun -H a:4,b:4``), or as the job's
command (``srun ... hvdtrain doctor``, an MPIJob's launcher). Every rank gathers what it can see
of itself (facts.py) and measures with the others (measure.py: the links, an allreduce, the run
folder, the clocks); the checks are pure functions over those facts, one module per group
(host_checks.py, version_checks.py, network_checks.py, folder_checks.py, environment_checks.py),
and verdict.py prints one line per problem with its fix and writes doctor.json.

Modules:
  doctor_cli.py      the command: with a launcher line, or as a probe under one
  doctor_options.py  its flags, shared with the probe
  asked.py           what was asked: hosts and slots from the launcher line, --expect, a
                     hostfile, Slurm
  launcher.py        runs the launcher with the probe appended, within --timeout
  rank.py            the per-rank probe (``python -m hvdtrain.doctor.rank``)
  deadline.py        a probe's deadline when no doctor launched it
  problem.py         a problem and its fix; the grouping the checks share
"""
