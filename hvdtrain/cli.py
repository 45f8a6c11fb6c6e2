"""``hvdtrain train ...``: flags and config files in, a trained model and a metrics log out.

Flags are generated from the dataclasses in config/ (train_flags.py), so every option is
documented once.
Bad input (a wrong flag, an impossible value, a missing dataset or checkpoint) exits with code 2
and a message that names the fix, before any rank starts communicating.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import TYPE_CHECKING, Sequence

from . import __version__
from .core_binding import local_size_hint, release_default_binding
from .exit_codes import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_PREEMPTED, record_early_stops

if TYPE_CHECKING:
    from .config import Config


def __getattr__(name: str):
    # Imported when asked for (tests, scripts): `hvdtrain run` must install its stop handler
    # before anything heavier than argparse is imported.
    if name == "config_from_args":
        from .train_flags import config_from_args
        return config_from_args
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class CommandParser(argparse.ArgumentParser):
    """A subcommand's parser (train, compare, run, doctor). It refuses an unknown flag itself,
    with its own usage and the nearest flags it takes: argparse hands such a flag up to the
    top-level parser, whose usage (hvdtrain [-h] [--version] COMMAND ...) names no command and
    whose message suggests nothing. Exit code 2, as for every bad flag."""

    # compare's flags whose value is itself flags: argparse takes a lone "--bsp" after them for
    # a flag of its own ("expected one argument"), so the value is joined on as --flag=value.
    VALUES_ARE_FLAGS = ("--train-args", "--launcher-args")

    def parse_known_args(self, args=None, namespace=None):
        args = list(sys.argv[1:] if args is None else args)
        for i in reversed(range(len(args) - 1)):
            if args[i] in self.VALUES_ARE_FLAGS and args[i + 1].startswith("-"):
                args[i:i + 2] = [f"{args[i]}={args[i + 1]}"]
        parsed, unknown = super().parse_known_args(args, namespace)
        if unknown and self.prog.endswith(" run"):  # `hvdtrain run -np 2 ...`: no launcher
            self.error(f"unrecognized arguments: {' '.join(unknown)}; the launcher comes first "
                       f"and {unknown[0]} is its flag, e.g. hvdtrain run mpirun {unknown[0]} ...")
        if unknown:
            from .train_flags import near_flags

            self.error(f"unrecognized arguments: {' '.join(unknown)}{near_flags(self, unknown)}")
        return parsed, unknown


def add_commands(parser: argparse.ArgumentParser, **kwargs) -> argparse._SubParsersAction:
    """``parser``'s subcommands, each parsed by a :class:`CommandParser`."""
    return parser.add_subparsers(dest="command", required=True, parser_class=CommandParser,
                                 **kwargs)


def build_parser(train_flags: bool = True) -> argparse.ArgumentParser:
    """``train_flags=False``: the train command without its flags, for the other commands: the
    flags' help names the built-in models and datasets, whose registries import torch."""
    # allow_abbrev=False on every parser: argparse would otherwise take --epoch for --epochs, and
    # a later flag that shares the prefix would silently change what an old command line means.
    # The train flags come from train_flags.py, which compare parses its --train-args with too.
    from .train_flags import train_parser

    parser = argparse.ArgumentParser(
        prog="hvdtrain", allow_abbrev=False,
        description="Distributed PyTorch training: sync (Horovod) or async (parameter server).")
    parser.add_argument("--version", action="version", version=f"hvdtrain {__version__}")
    commands = add_commands(parser, metavar="COMMAND")
    commands.add_parser(
        "train", help="train a model",
        description="Train a model. Launch with horovodrun -np N, mpirun -np N, or on its own.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter, allow_abbrev=False,
        parents=[train_parser()] if train_flags else [])
    from .compare.command import add_parser as add_compare
    add_compare(commands)
    from .requeue import add_parser as add_run
    add_run(commands)
    from .doctor.doctor_cli import add_parser as add_doctor
    add_doctor(commands)
    return parser


def rank_from_environment() -> int:
    """The launcher's rank before any library starts, so only one rank prints start-up errors."""
    for name in ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "RANK"):  # RANK: torchrun
        if name in os.environ:
            return int(os.environ[name])
    return 0


def fail(message: str, code: int, user_traceback: str | None = None) -> int:
    """Report an error that every rank hits alike (bad input): rank 0 prints it, after the
    traceback of the user's own code when that is what raised. The other ranks wait a moment
    before exiting, because a launcher stops the whole job at the first non-zero exit, which
    could kill rank 0 before it has printed."""
    if rank_from_environment() == 0:
        if user_traceback:
            print(user_traceback, file=sys.stderr, end="", flush=True)
        print(f"hvdtrain: error: {message}", file=sys.stderr, flush=True)
    else:
        import time
        time.sleep(3)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    exiting = argv is None  # the command line, not a test
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["run"]:  # the wrapper: its stop handler first, and no torch (requeue.py)
        from .requeue import StopRelay, add_parser, main as run_launcher

        relay = StopRelay()
        # `run` alone: compare's flags import torch (its update rules), train's too
        parser = argparse.ArgumentParser(prog="hvdtrain", allow_abbrev=False)
        add_parser(add_commands(parser))
        return run_launcher(parser.parse_args(argv), relay)
    if argv[:1] == ["doctor"]:  # no torch for its --help and its launcher (doctor/doctor_cli.py)
        from .doctor.doctor_cli import add_parser as add_doctor, main as doctor

        parser = argparse.ArgumentParser(prog="hvdtrain", allow_abbrev=False)
        add_doctor(add_commands(parser))
        return doctor(parser.parse_args(argv))
    # Before anything imports torch: OpenMP counts its cores when torch loads it (core_binding)
    release_default_binding(local_size_hint())
    if argv[:1] != ["train"]:
        return _other_command(build_parser(train_flags=False).parse_args(argv))
    if exiting:
        record_early_stops()  # a stop while it starts: the trainer's handlers take it over
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # argparse: a wrong flag (2) on every rank alike, or --help (0)
        ended(e.code if isinstance(e.code, int) else EXIT_BAD_INPUT, exiting)
        raise
    try:
        code = _train_command(args, exiting)
    except Exception:  # a bug: its traceback, printed before ended() may stop mpirun
        if not exiting:
            raise
        import traceback

        traceback.print_exc()
        code = EXIT_FAILED  # what Python exits with after an uncaught exception
    return ended(code, exiting)


def _other_command(args) -> int:
    from .errors import ConfigError

    from .compare.command import main as compare
    try:
        return compare(args)
    except ConfigError as e:
        return fail(str(e), EXIT_BAD_INPUT)


def _train_command(args, exiting: bool) -> int:
    from .errors import ConfigError
    from .data import DataError
    from .train_flags import config_from_args
    from .workload import workload_from_config

    try:
        cfg = config_from_args(args)
        workload = workload_from_config(cfg)  # bad input fails here, on every rank alike
    except (ConfigError, DataError) as e:
        return fail(str(e), EXIT_BAD_INPUT, getattr(e, "user_traceback", None))
    return train(cfg, workload, exiting)


def ended(code: int, exiting: bool = True) -> int:
    """A rank's exit code, told to `hvdtrain run` (requeue.py), and to mpirun under its
    recovery settings, where it exits 0 whatever its ranks return: a job that every rank
    refused, or one that failed, must not look like a success (ps/membership.py
    fail_launcher). Only on the command line (``exiting``): a test's process goes on."""
    if not exiting:
        return code
    from .requeue import tell_wrapper

    tell_wrapper("exit", code)
    if code not in (0, EXIT_PREEMPTED):  # under recovery a stop ends with mpirun's 0
        from .ps.membership import fail_launcher

        fail_launcher(code)
    return code


def train(cfg: Config, workload, exiting: bool = False) -> int:
    """Run this process's part of the job; the launch layer's failures become exit codes.
    ``exiting``: the process ends when this returns (the command line, not a test)."""
    from . import launch

    try:
        finished = launch.run(cfg, workload)
    except BaseException as e:
        code = launch.failure_code(e)
        if code is None and getattr(e, "run_dir", None) is not None:
            # The user's forward() or dataset (a loader process) raised while training: its
            # traceback says where, and this line what is left to continue from.
            import traceback

            from .checkpoint import intact_note

            traceback.print_exc()
            print(f"hvdtrain: error: training stopped by {type(e).__name__} (traceback above); "
                  f"{intact_note(e.run_dir, 'fix the cause')}", file=sys.stderr, flush=True)
            return EXIT_FAILED
        if code is None:
            raise  # a bug: its traceback says where
        if code == EXIT_BAD_INPUT:
            return fail(launch.describe_failure(e), code, getattr(e, "user_traceback", None))
        print(f"hvdtrain: error: {launch.describe_failure(e)}", file=sys.stderr, flush=True)
        return code
    if exiting:  # training is over: a late signal must not turn a finished run into a kill
        for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)
    if finished.verdict.requeue:  # the trainer printed where it stopped and how to continue
        return 0 if _record_preemption() else EXIT_PREEMPTED
    report(finished.trainer)
    return 0


def _record_preemption() -> bool:
    """Under `hvdtrain run` (requeue.py): record that this rank stopped after the checkpoint, in
    the file it names; True if recorded. Such a rank exits 0, and `hvdtrain run` exits 75 for
    the job: mpirun answers a rank's 75 with an abort (a wait of twice its sigkill timeout, then
    1 if it got a SIGTERM), horovodrun with a traceback and 1. A rank that cannot write the file
    (on another host) exits 75 as before, so a stop is never lost. Every rank returns only after
    rank 0 has written the checkpoint (the result is broadcast)."""
    from .requeue import PREEMPTED_FILE_ENV

    path = os.environ.get(PREEMPTED_FILE_ENV)
    if not path:
        return False
    try:
        with open(path, "a") as f:
            f.write(f"{os.getpid()}\n")
    except OSError:
        return False
    return True


def report(trainer) -> None:
    if trainer is None or not trainer.is_main:
        return
    if trainer.stopping.verdict.target:  # the last complete epoch line may be far behind (async)
        print(f"done: reached the target ({trainer.stopping.verdict.target}); log "
              f"{trainer.run_dir / 'metrics.jsonl'}, checkpoint {trainer.checkpointer.path}",
              flush=True)
        return
    if not trainer.history:
        return
    final = trainer.history[-1]
    score = (f"test accuracy {final.test_acc:.4f}" if final.test_acc is not None else
             f"test loss {final.test_loss:.4f}" if final.test_loss is not None else
             f"train loss {final.train_loss:.4f}" if final.train_loss is not None else
             "no evaluation")
    epochs = f"{final.epoch} epoch{'' if final.epoch == 1 else 's'}"
    print(f"done: {score} after {epochs}{throughput_summary(trainer.history)}; "
          f"log {trainer.run_dir / 'metrics.jsonl'}, checkpoint {trainer.checkpointer.path}",
          flush=True)


def throughput_summary(history) -> str:
    """", 1.23 TFLOP/s (MFU 4.5%) on average over the epochs" (or "over the epoch", for one),
    or "" where FLOPs are unknown."""
    figures = [epoch.throughput for epoch in history if "tflops" in epoch.throughput]
    if not figures:
        return ""
    mean = {k: sum(f[k] for f in figures) / len(figures) for k in ("tflops", "mfu")
            if all(k in f for f in figures)}
    mfu = f" (MFU {mean['mfu']:.1%})" if "mfu" in mean else ""
    over = "over the epoch" if len(figures) == 1 else "on average over the epochs"
    return f", {mean['tflops']:.4g} TFLOP/s{mfu} {over}"
