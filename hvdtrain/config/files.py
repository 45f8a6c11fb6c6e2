"""Options from a TOML or YAML file: read, parsed, and flattened to option pairs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import ConfigError, too_deep
from .values import did_you_mean
from .whole import SECTIONS, field_owners


def load_config_file(path: str) -> dict[str, Any]:
    """Read a TOML or YAML file into flat option pairs.

    Keys may sit at the top level or under a section named like the dataclasses
    (``[optim]``, ``[run]``...). Dashes and underscores are interchangeable.
    """
    raw = _parse_config_text(path, _read_config_text(path))
    if not isinstance(raw, dict):
        raise ConfigError(f"--config: {path} must hold a table of options, not {type(raw).__name__}")
    return _flat_options(raw, path)


def _read_config_text(path: str) -> str:
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"--config: {path} is a folder; pass the path of a .toml or .yaml "
                          "file (a run folder's options are in the header of its metrics.jsonl)")
    if not p.is_file():
        raise ConfigError(f"--config: file {path} not found; pass the path of a .toml or .yaml file")
    try:
        return p.read_text(encoding="utf-8")  # TOML is UTF-8 by definition; YAML files in practice
    except UnicodeDecodeError as e:
        bad = e.object[e.start:e.start + 1]
        raise ConfigError(f"--config: {path} is not UTF-8 text (byte {e.start} is {bad!r}); "
                          "save it with UTF-8 encoding") from None
    except OSError as e:
        raise ConfigError(f"--config: cannot read {path} ({e.strerror}); check its "
                          "permissions") from None


def _parse_config_text(path: str, text: str) -> Any:
    """The file's content as TOML or YAML, by its suffix."""
    try:
        if Path(path).suffix == ".toml":
            try:
                import tomllib
            except ModuleNotFoundError:  # Python 3.10
                import tomli as tomllib
            return tomllib.loads(text)
        if Path(path).suffix in (".yaml", ".yml"):
            return _load_yaml(text)
        raise ConfigError(f"--config: {path} must end in .toml, .yaml or .yml")
    except ConfigError:
        raise
    except RecursionError:  # tomllib and yaml parse nested tables recursively
        raise ConfigError(too_deep(f"--config: {path}")) from None
    except Exception as e:  # the parsers' own error types differ; all mean "fix the file"
        raise ConfigError(f"--config: cannot parse {path}: {e}") from None


def _load_yaml(text: str) -> Any:
    """YAML as safe_load reads it, except that a key given twice in one mapping is an error,
    as TOML's is: safe_load kept the last (lr: 0.1, then lr: 0.2, trained at 0.2 silently)."""
    import yaml

    class Strict(yaml.SafeLoader):
        pass

    def mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict:
        seen = set()
        for key_node, _ in node.value:
            key = loader.construct_object(key_node, deep=True)
            if key in seen:
                raise ValueError(f"the key {key!r} is given twice in one mapping "
                                 f"(line {key_node.start_mark.line + 1}); keep one")
            seen.add(key)
        return loader.construct_mapping(node, deep=True)

    Strict.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    return yaml.load(text, Loader=Strict) or {}


def _flat_options(raw: dict, path: str) -> dict[str, Any]:
    """The file's options as flat pairs, each known and in its own section (or at the top), and
    each given once: one at the top level and again in its section had the section's win in
    silence."""
    owners = field_owners()
    flat: dict[str, Any] = {}
    where: dict[str, str] = {}  # each option's place in the file, for a second one's message
    misplaced, twice = [], []
    for key, value in raw.items():
        key = str(key).replace("-", "_")
        section = key if key in SECTIONS and isinstance(value, dict) else None
        pairs = value.items() if section else [(key, value)]
        place = f"under [{section}]" if section else "at the top level"
        for name, v in pairs:
            name = str(name).replace("-", "_")
            if section and owners.get(name, section) != section:
                # would silently apply elsewhere than it reads
                misplaced.append(f"{name} is {place} but belongs in [{owners[name]}]")
            if name in flat:
                twice.append(f"{name} is given {where[name]} and again {place}")
            flat[name], where[name] = v, place
    if misplaced:
        raise ConfigError(f"--config: {path}: {'; '.join(misplaced)}; move it to that section "
                          "(or to the top level)")
    if twice:
        raise ConfigError(f"--config: {path}: {'; '.join(twice)}; keep one of them")
    unknown = sorted(k for k in flat if k not in owners)
    if unknown:
        hints = did_you_mean(unknown, [*owners, *SECTIONS], n=1,
                             shown=lambda m: f"[{m}]" if m in SECTIONS else m)
        raise ConfigError(f"--config: {path} has unknown option(s) {', '.join(unknown)}{hints} "
                          f"(sections: {', '.join(f'[{s}]' for s in SECTIONS)}); valid options "
                          f"are: {', '.join(sorted(owners))}")
    return flat
