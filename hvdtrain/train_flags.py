"""``hvdtrain train``'s flags, built from the dataclasses in config/ so that every option is
documented once: one parser for the command line (cli.py) and for the train flags that
``hvdtrain compare`` hands its runs (compare/), and the Config they make."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, Sequence

from .config import SECTIONS, Config, ConfigError, load_config_file
from .config.values import UnreadOption, default_of, did_you_mean


def _builtin_models():
    from .models import MODELS
    return MODELS


def _builtin_datasets():
    from .workload import BUILTIN_DATASETS
    return BUILTIN_DATASETS


def _builtin_losses():
    from .losses import LOSSES
    return LOSSES


BUILTIN_NAMES = {"model": _builtin_models, "dataset": _builtin_datasets, "loss": _builtin_losses}


def train_parser() -> argparse.ArgumentParser:
    """--config and one flag per option, without -h: the `hvdtrain train` command takes it as
    its parent, and :func:`parse_train_flags` parses with it. exit_on_error=False: a caller
    that is not the command line gets an error to report, not an exit."""
    # allow_abbrev=False: argparse would otherwise take --epoch for --epochs, and a later flag
    # that shares the prefix would silently change what an old command line means.
    parser = argparse.ArgumentParser(prog="hvdtrain train", add_help=False, allow_abbrev=False,
                                     exit_on_error=False)
    add_train_flags(parser)
    return parser


def add_train_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=argparse.SUPPRESS, action="append",
                        help="TOML or YAML file of options; flags given here override it. "
                             "Given more than once, the files are read in order, a later "
                             "file's options over an earlier one's")
    for section, klass in SECTIONS.items():
        group = parser.add_argument_group(section, klass.__doc__)
        for f in dataclasses.fields(klass):
            add_flag(group, f)


def add_flag(group: argparse._ArgumentGroup, f: dataclasses.Field) -> None:
    default = default_of(f)
    flag = "--" + f.name.replace("_", "-")
    # SUPPRESS keeps unset flags out of the namespace, so a config file's values are not
    # overwritten by defaults; the dataclass holds the defaults.
    help = f.metadata["help"]
    if f.name in BUILTIN_NAMES:  # from the registries, so a @register'ed model shows up here
        help += f"; built in: {', '.join(sorted(BUILTIN_NAMES[f.name]()))}"
    kwargs: dict[str, Any] = {"dest": f.name, "default": argparse.SUPPRESS,
                              "help": f"{help} (default: {_show_default(default)})"}
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


def parse_train_flags(argv: Sequence[str], flag: str) -> argparse.Namespace:
    """The flags given in ``argv`` (unset ones absent); ConfigError, its message starting with
    ``flag`` (where the flags came from), for a flag or value that train does not take."""
    parser = train_parser()
    try:
        given, unknown = parser.parse_known_args(list(argv))
    except (argparse.ArgumentError, ValueError) as e:
        raise ConfigError(f"{flag}: {e}") from None
    if unknown:
        raise ConfigError(f"{flag}: unknown flag(s) {' '.join(unknown)}"
                          f"{near_flags(parser, unknown)}; see hvdtrain train --help")
    return given


def near_flags(parser: argparse.ArgumentParser, unknown: Sequence[str]) -> str:
    """"; --epoch: did you mean --epochs?" for each flag among ``unknown`` (what argparse did
    not recognise: flags, ``--flag=value``, the values after them) that is near some of
    ``parser``'s flags; "" where none is. Every command's parser (cli.py) asks this too."""
    flags = dict.fromkeys(text.split("=", 1)[0] for text in unknown if text.startswith("-"))
    known = [option for action in parser._actions for option in action.option_strings]
    return did_you_mean(flags, known)


def config_from_args(args: argparse.Namespace) -> Config:
    values: dict = {}
    origin: dict[str, str] = {}  # the file each option not given as a flag came from
    files = getattr(args, "config", None) or []
    for path in [files] if isinstance(files, str) else files:  # in order: the later wins
        read = load_config_file(path)
        values.update(read)
        origin.update(dict.fromkeys(read, path))
    given = {k: v for k, v in vars(args).items() if k not in ("command", "config")}
    values.update(given)
    # One file may hold both modes' options, each read under its mode (a [ps] section in a sync
    # run), and options that only another setting reads (a synthetic shape, a tracker project);
    # given on the command line, an option the run would not read is refused (UnreadOption).
    while True:
        try:
            return Config.from_overrides(values).validate()
        except UnreadOption as e:
            if e.option in given or e.option not in values:
                raise
            del values[e.option]
        except ConfigError as e:  # a bad value from a file: name the file, not only the flag
            name = str(e).split(":", 1)[0].split()[0].removeprefix("--").replace("-", "_")
            if name in given or name not in origin:
                raise
            raise ConfigError(f"{origin[name]}: {e} (the file's {name!r})") from None
