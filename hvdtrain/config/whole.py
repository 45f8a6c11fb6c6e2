"""A run's whole configuration: its sections, built from flat option pairs, recorded, and
validated (each section its own fields, then the checks across sections)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError, too_deep
from .data_options import DataConfig
from .model_options import ModelConfig, OptimConfig
from .pipeline_options import PipelineConfig
from .ps_options import PSConfig
from .run_options import RunConfig
from .sync_options import SyncConfig, expand_local_steps
from .cross_checks import check_combinations
from .values import default_of, near_names, parse_bool, parse_int_tuple, require_finite


SECTIONS = {"data": DataConfig, "model": ModelConfig, "optim": OptimConfig,
            "sync": SyncConfig, "ps": PSConfig, "pipeline": PipelineConfig, "run": RunConfig}
RECORDED_ARGS_LIMIT = 64 * 1024  # bytes of --model-args/--dataset-args copied into the records


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    sync: SyncConfig = field(default_factory=SyncConfig)
    ps: PSConfig = field(default_factory=PSConfig)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    run: RunConfig = field(default_factory=RunConfig)

    # --- building -----------------------------------------------------------------------------
    @classmethod
    def from_overrides(cls, values: dict[str, Any], unlisted: tuple[str, ...] = ()) -> "Config":
        """Build from flat ``{field_name: value}`` pairs; names are unique across sections.
        ``unlisted``: options the caller takes otherwise (fit's model and data), neither
        suggested nor listed where a name is unknown."""
        cfg = cls()
        owner = field_owners()
        for name, value in expand_local_steps(values).items():
            if name not in owner:  # fit(learning_rate=...): a keyword of the user's
                listed = sorted(n for n in owner if n not in unlisted)
                near = near_names(name, listed)
                hint = f" (did you mean {' or '.join(near)}?)" if near else ""
                raise ConfigError(f"unknown option {name!r}{hint}; valid options are: "
                                  f"{', '.join(listed)}")
            section = getattr(cfg, owner[name])
            setattr(section, name, coerce(section, name, value))
        return cfg

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return dataclasses.asdict(self)

    def to_record(self) -> dict[str, dict[str, Any]]:
        """to_dict for what the run records again and again (every checkpoint, the log's header,
        a tracker's parameters): keyword arguments longer than RECORDED_ARGS_LIMIT (a 20 MB
        --model-args) are kept as their size and digest, with a note; the command line has
        them, and a copy in every checkpoint would cost that much each time."""
        out = self.to_dict()
        for section, name in (("data", "dataset_args"), ("model", "model_args")):
            value = out[section][name]
            text = value if isinstance(value, str) else json.dumps(value, default=str)
            if len(text.encode()) > RECORDED_ARGS_LIMIT:
                digest = hashlib.sha256(text.encode()).hexdigest()
                out[section][name] = (f"<{len(text.encode())} bytes, sha256 {digest}: too long "
                                      "to copy into every checkpoint and log header; not stored>")
        return out

    # --- checking -----------------------------------------------------------------------------
    def validate(self) -> "Config":
        """Raise :class:`ConfigError` for the first value that cannot work: each section checks
        its own fields, then the combinations that span sections (cross_checks.py, and each
        rule's own in hvdtrain/rules/)."""
        for section in (self.run, self.optim, self.data, self.model, self.sync, self.ps,
                        self.pipeline):
            section.validate()
            require_finite(section)
        check_combinations(self)
        return self


def field_owners() -> dict[str, str]:
    """Map each option name to the section that holds it."""
    owners: dict[str, str] = {}
    for section, klass in SECTIONS.items():
        for f in dataclasses.fields(klass):
            assert f.name not in owners, f"option {f.name} defined twice"
            owners[f.name] = section
    return owners


def coerce(section: Any, name: str, value: Any) -> Any:
    """Turn a value from the command line or a config file into the field's type."""
    f = {f.name: f for f in dataclasses.fields(section)}[name]
    flag = "--" + name.replace("_", "-")
    default = default_of(f)
    kind = {bool: "True or False", int: "a whole number", float: "a number",
            tuple: "a list of whole numbers"}.get(type(default), "a string")
    if value is None and default is not None:
        # fit(epochs=None), or a YAML null: the checks after this one compare numbers and would
        # raise a bare TypeError. None is a value only where it is the default (--run-dir).
        shown = ",".join(map(str, default)) if isinstance(default, tuple) else default
        raise ConfigError(f"{flag}: got None; give {kind} (the default is {shown!r}), or "
                          "leave the option out for its default")
    try:
        if value is None:
            out = None
        elif isinstance(default, bool):
            out = parse_bool(value)
        elif isinstance(value, bool):  # true in a file, or fit(lr=True): not a number
            raise ValueError("a boolean, not a number")
        elif isinstance(default, tuple):
            out = parse_int_tuple(value)
        elif isinstance(default, int):
            if isinstance(value, float) and not value.is_integer():
                raise ValueError("not a whole number")
            out = int(value)
        elif isinstance(default, float):
            out = float(value)
        elif isinstance(value, dict):  # --model-args as a TOML/YAML table
            out = json.dumps(value)
        else:
            out = str(value)
    except RecursionError:  # json.dumps of a table nested thousands deep; its repr would too
        raise ConfigError(too_deep(flag)) from None
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{flag}: cannot read {value!r} ({e}); expected {kind}"
                          + (", e.g. 3 or 2,5" if isinstance(default, tuple) else "")) from None
    choices = f.metadata.get("choices")
    if choices and out not in choices:
        raise ConfigError(f"{flag}: invalid choice {out!r}; choose one of {', '.join(choices)}")
    return out
