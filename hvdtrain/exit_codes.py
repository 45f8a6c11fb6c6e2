"""The exit codes of hvdtrain's commands, defined once: launchers, deploy/'s Slurm and Kubernetes
files and the tests read them."""

import signal

EXIT_FAILED = 1     # training failed (a NaN loss, a stuck peer, Horovod gave up) or a run failed
EXIT_BAD_INPUT = 2  # a wrong flag or value, a missing dataset or checkpoint: argparse's code too
# A process of an async job that lost a worker, ending without MPI_Finalize under mpirun's
# recovery settings: mpirun exits 0 regardless, but a host's Open MPI daemon reports every such
# exit to mpirun only if it is non-zero (ps/membership.py exit_code_without_finalize).
EXIT_NO_FINALIZE = 3
# EX_TEMPFAIL of sysexits.h, "try again later": stopped by SIGTERM/SIGUSR1/SIGINT after a
# checkpoint (loop/preemption.py); the Slurm script and the Kubernetes Job's podFailurePolicy in
# deploy/ requeue the job on it.
EXIT_PREEMPTED = 75
# The signals that stop a job after a checkpoint, with EXIT_PREEMPTED. Here rather than in
# loop/preemption.py, whose package imports torch: `hvdtrain run` (requeue.py) needs them at once.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)

# A stop signal that comes while a rank starts (its imports take seconds), before the trainer
# installs its handlers (loop/preemption.py): recorded here, so that the rank stops after its
# first step with a checkpoint and exits 75, rather than dying of it (143, or 138 for SIGUSR1:
# a job that is not requeued).
early_stops: list[str] = []


def record_early_stops() -> None:
    """The command line's first handlers, installed before anything heavy is imported."""
    def record(signum, frame):
        early_stops.append(signal.Signals(signum).name)
    for sig in STOP_SIGNALS:
        signal.signal(sig, record)
