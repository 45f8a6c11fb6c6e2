"""``hvdtrain train ...``: flags and config files in, a trained model and a metrics log out.

Flags are generated from the dataclasses in config.py, so every option is documented once.
Bad input (a wrong flag, an impossible value, a missing dataset or checkpoint) exits with code 2
and a message that names the fix, before any rank starts communicating.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from typing import Any, Sequence

from . import __version__
from .checkpoint import CheckpointError
from .config import SECTIONS, Config, ConfigError, load_config_file
from .data import DataError

EXIT_BAD_INPUT = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hvdtrain",
        description="Distributed PyTorch training: sync (Horovod) or async (parameter server).")
    parser.add_argument("--version", action="version", version=f"hvdtrain {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    train = commands.add_parser(
        "train", help="train a model",
        description="Train a model. Launch with horovodrun -np N, mpirun -np N, or on its own.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    train.add_argument("--config", default=argparse.SUPPRESS,
                       help="TOML or YAML file of options; flags given here override it")
    for section, klass in SECTIONS.items():
        group = train.add_argument_group(section, klass.__doc__)
        for f in dataclasses.fields(klass):
            add_flag(group, f)
    from .compare.command import add_parser as add_compare
    add_compare(commands)
    return parser


def add_flag(group: argparse._ArgumentGroup, f: dataclasses.Field) -> None:
    default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
    flag = "--" + f.name.replace("_", "-")
    # SUPPRESS keeps unset flags out of the namespace, so a config file's values are not
    # overwritten by defaults; the dataclass holds the defaults.
    kwargs: dict[str, Any] = {"dest": f.name, "default": argparse.SUPPRESS,
                              "help": f"{f.metadata['help']} (default: {_show_default(default)})"}
    if isinstance(default, bool):
        kwargs["action"] = argparse.BooleanOptionalAction
    else:
        kwargs["metavar"] = f.name.upper()
        if f.metadata.get("choices"):
            kwargs["choices"] = f.metadata["choices"]
            kwargs["metavar"] = "{" + ",".join(f.metadata["choices"]) + "}"
    group.add_argument(flag, **kwargs)


def _show_default(value: Any) -> str:
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return str(value)


def config_from_args(args: argparse.Namespace) -> Config:
    values = load_config_file(args.config) if getattr(args, "config", None) else {}
    values.update({k: v for k, v in vars(args).items() if k not in ("command", "config")})
    return Config.from_overrides(values).validate()


def rank_from_environment() -> int:
    """The launcher's rank before any library starts, so only one rank prints start-up errors."""
    for name in ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        if name in os.environ:
            return int(os.environ[name])
    return 0


def fail(message: str, code: int) -> int:
    """Report an error that every rank hits alike (bad input): rank 0 prints it. The other ranks
    wait a moment before exiting, because a launcher stops the whole job at the first non-zero
    exit, which could kill rank 0 before it has printed."""
    if rank_from_environment() == 0:
        print(f"hvdtrain: error: {message}", file=sys.stderr, flush=True)
    else:
        import time
        time.sleep(3)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)  # argparse exits with 2 on an unknown flag
    if args.command == "compare":
        from .compare.command import main as compare
        try:
            return compare(args)
        except ConfigError as e:
            return fail(str(e), EXIT_BAD_INPUT)
    try:
        cfg = config_from_args(args)
    except ConfigError as e:
        return fail(str(e), EXIT_BAD_INPUT)
    if args.command == "train":
        return train(cfg)
    raise AssertionError(args.command)


def train(cfg: Config) -> int:
    from .trainer import TrainingError

    try:
        dataset, model = load_inputs(cfg)  # bad input fails here, on every rank alike
    except (ConfigError, DataError) as e:
        return fail(str(e), EXIT_BAD_INPUT)
    if cfg.run.mode == "async":
        return train_async(cfg, dataset, model)
    try:
        trainer = prepare_sync(cfg, dataset, model)
        history = trainer.fit()
    except (ConfigError, DataError, CheckpointError) as e:
        return fail(str(e), EXIT_BAD_INPUT)
    except TrainingError as e:
        print(f"hvdtrain: error: {e}", file=sys.stderr, flush=True)
        return 1
    except Exception as e:
        if type(e).__name__ != "HorovodInternalError":
            raise
        print(f"hvdtrain: error: Horovod shut down: another rank failed, or a collective waited "
              f"longer than --stall-timeout-s for ranks that never joined it ({e})",
              file=sys.stderr, flush=True)
        return 1
    report(trainer, history)
    return 0


def report(trainer, history) -> None:
    if trainer.is_main and history:
        final = history[-1]
        print(f"done: test accuracy {final.test_acc:.4f} after {final.epoch} epochs; "
              f"log {trainer.run_dir / 'metrics.jsonl'}, checkpoint "
              f"{trainer.run_dir / 'checkpoint.pt'}", flush=True)


def load_inputs(cfg: Config):
    """Dataset and model, before any process starts communicating."""
    import torch

    from .data import load_dataset
    from .models import build_model

    dataset = load_dataset(cfg.data)
    torch.manual_seed(cfg.run.seed)
    model = build_model(cfg.model.model, dataset.input_shape, dataset.num_classes, cfg.model)
    return dataset, model


def prepare_sync(cfg: Config, dataset=None, model=None):
    from .pipeline import build_replica
    from .runtime import start_horovod
    from .sync import ElasticHorovodSync, HorovodSync
    from .trainer import Trainer

    if dataset is None:
        dataset, model = load_inputs(cfg)
    runtime = start_horovod(cfg.run, cfg.sync)
    scheme = (ElasticHorovodSync if cfg.sync.elastic else HorovodSync)(cfg, runtime)
    replica = build_replica(model, cfg, runtime)
    return Trainer(cfg, runtime, scheme, dataset, replica)


def train_async(cfg: Config, dataset, model) -> int:
    """Async mode: the last --num-servers ranks serve parameters, the others train.

    An MPI job whose rank stops with an error would leave the others blocked in a receive, so
    every error after MPI starts ends the whole job with MPI_Abort, after printing its message.
    """
    from .ps.protocol import Topology
    from .runtime import start_mpi

    try:
        runtime = start_mpi(cfg.run)
        topology = Topology(runtime.size, cfg.ps.num_servers)
    except ConfigError as e:
        return fail(str(e), EXIT_BAD_INPUT)  # the same on every rank: all exit cleanly
    from mpi4py import MPI

    from .ps.client import ParameterServerClient
    from .pipeline import build_replica
    from .ps.server import ParameterServer
    from .ps.waiting import StuckError
    from .trainer import Trainer, TrainingError

    world = MPI.COMM_WORLD
    is_server = topology.is_server(runtime.rank)
    comm = world.Dup()  # the parameter server's private channel
    worker_comm = world.Split(1 if is_server else 0, runtime.rank)
    try:
        if is_server:
            ParameterServer(comm, cfg, topology).serve()
            return 0
        scheme = ParameterServerClient(cfg, runtime, comm, worker_comm, topology)
        replica = build_replica(model, cfg, runtime)
        trainer = Trainer(cfg, runtime, scheme, dataset, replica)
        history = trainer.fit()
    except (ConfigError, DataError, CheckpointError) as e:
        abort(world, f"hvdtrain: error: {e}", EXIT_BAD_INPUT, collective=True)
    except (TrainingError, StuckError) as e:
        abort(world, f"hvdtrain: error (rank {runtime.rank}): {e}", 1)
    except BaseException as e:  # anything else: never leave the other ranks hanging
        import traceback
        traceback.print_exc()
        abort(world, f"hvdtrain: error (rank {runtime.rank}): {type(e).__name__}: {e}", 1)
    report(trainer, history)
    return 0


def abort(world, message: str, code: int, collective: bool = False) -> None:
    """Print, then end every rank of the job. For an error that all ranks raise together (a bad
    checkpoint), rank 0 alone prints and aborts; the others give it a moment to do so."""
    import time

    if collective and world.Get_rank() != 0:
        time.sleep(10)
    else:
        print(message, file=sys.stderr, flush=True)
    world.Abort(code)
