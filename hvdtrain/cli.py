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
    if rank_from_environment() == 0:
        print(f"hvdtrain: error: {message}", file=sys.stderr, flush=True)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)  # argparse exits with 2 on an unknown flag
    try:
        cfg = config_from_args(args)
    except ConfigError as e:
        return fail(str(e), EXIT_BAD_INPUT)
    if args.command == "train":
        return train(cfg)
    raise AssertionError(args.command)


def train(cfg: Config) -> int:
    from .trainer import Trainer, TrainingError

    try:
        trainer = prepare_sync(cfg)
        history = trainer.fit()
    except (ConfigError, DataError, CheckpointError) as e:
        return fail(str(e), EXIT_BAD_INPUT)
    except TrainingError as e:
        print(f"hvdtrain: error: {e}", file=sys.stderr, flush=True)
        return 1
    if trainer.is_main and history:
        final = history[-1]
        print(f"done: test accuracy {final.test_acc:.4f} after {final.epoch} epochs; "
              f"log {trainer.run_dir / 'metrics.jsonl'}, checkpoint "
              f"{trainer.run_dir / 'checkpoint.pt'}", flush=True)
    return 0


def prepare_sync(cfg: Config):
    """Everything that can fail on bad input happens before hvd.init(), identically on each rank."""
    import torch

    from .data import load_dataset
    from .models import build_model
    from .replica import Replica
    from .runtime import start_horovod
    from .sync import HorovodSync
    from .trainer import Trainer

    dataset = load_dataset(cfg.data)
    torch.manual_seed(cfg.run.seed)
    model = build_model(cfg.model.model, dataset.input_shape, dataset.num_classes, cfg.model)
    runtime = start_horovod(cfg.run, cfg.sync)
    scheme = HorovodSync(cfg, runtime)
    return Trainer(cfg, runtime, scheme, dataset, Replica(model, runtime.device),
                   num_workers=runtime.size, worker_rank=runtime.rank)
