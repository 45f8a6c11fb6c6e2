"""What the option sections share: a field with its help text, the finite-number check, the
"did you mean" of a misspelled name, and the readers of values that are more than a number (a
fault schedule, a metric goal, a stop target, a window of steps to profile)."""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
from dataclasses import field
from pathlib import Path
from typing import Any, Callable, Iterable

from ..errors import ConfigError, require
from ..faults.schedule import parse_faults



# The seeds feed torch, numpy and scikit-learn, whose generators take at most 64 (torch) or 32
# bits (scikit-learn's random_state); epoch_plan.py also derives per-epoch seeds from --seed.
MAX_SEED = 2**32 - 1
MAX_CYCLE_TIME_MS = 1000.0

MIN_CHUNK_MB = 0.001  # about 1 KiB: 262 float32 parameters per message

SEED_RANGE = f"use a whole number from 0 to {MAX_SEED} (2**32 - 1), e.g. 0"


def opt(default: Any, help: str, choices: tuple | None = None, **kw) -> Any:
    """A dataclass field whose metadata carries its help text (and allowed values)."""
    meta = {"help": help, "choices": choices, **kw}
    if isinstance(default, (list, tuple)):
        return field(default_factory=lambda: tuple(default), metadata=meta)
    return field(default=default, metadata=meta)


def require_finite(section: Any) -> None:
    """inf passes most range checks (inf >= 0) and then breaks the run; only the options marked
    infinite_ok (an unbounded --staleness) mean something by it."""
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        if isinstance(value, float) and not math.isfinite(value) and not (
                f.metadata.get("infinite_ok") and math.isinf(value)):
            require(False, "--" + f.name.replace("_", "-"), value,
                    f"use a finite number, e.g. the default {f.default:g}")


def default_of(f: dataclasses.Field) -> Any:
    """A field's default, made by its factory where it has one (a tuple's)."""
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


class UnreadOption(ConfigError):
    """An option that this run would not read; ``option`` is its name (train_flags.py drops it
    where it came from a config file, which may serve runs that do read it)."""

    def __init__(self, message: str, option: str):
        super().__init__(message)
        self.option = option


def refuse_unread(section: Any, names: Iterable[str], read: bool, why: str) -> None:
    """Refuse an option that only another setting reads, given where that setting is not: it
    would be ignored without a word (--synthetic-shape on digits, --momentum with adam). Given
    means different from its default; ``why`` may name the option as {flag}."""
    if read:
        return
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        if f.name in names and value != default_of(f):
            flag = "--" + ("no-" if value is False else "") + f.name.replace("_", "-")
            raise UnreadOption(f"{flag}: " + why.format(flag=flag), f.name)


def check_writable_folder(path: str, flag: str) -> None:
    """Fail at start-up, not at the first write, when ``path`` cannot become a folder that this
    process writes into: it (or what exists of it) is a regular file, or a folder without write
    permission."""
    existing = Path(path)
    while not os.path.exists(existing) and existing != existing.parent:
        existing = existing.parent  # the folder that would hold the new folders
    it = "it" if existing == Path(path) else str(existing)
    if not os.path.isdir(existing):
        raise ConfigError(f"{flag} {path}: {it} is a file, not a folder; pass the path of a "
                          "folder (it is created if missing)")
    where = "" if existing == Path(path) else ", where it would be created,"
    if os.statvfs(existing).f_flag & os.ST_RDONLY:  # no permission makes it writable
        raise ConfigError(f"{flag} {path}: {it}{where} is on a read-only file system; pass a "
                          "folder on a writable one")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"{flag} {path}: {it}{where} is not writable for this user; pass a "
                          "folder you can write to, or change its permissions")


def check_faults(schedule: str, flag: str = "--inject-faults") -> None:
    try:
        parse_faults(schedule)
    except ValueError as e:
        raise ConfigError(f"{flag}: invalid value {schedule!r}; {e}") from None


def near_names(name: str, known: Iterable[str], n: int = 3) -> list[str]:
    """The names of ``known`` nearest to a misspelled ``name``, best first: those it begins
    (a name cut short), difflib's close matches, then one that ``name``'s initials spell
    (learning_rate -> lr) or whose initials spell ``name`` (bs -> batch_size), which difflib
    rates far apart. Leading dashes are set aside and dashes and underscores are alike, so
    flags (--lr) compare like option names."""
    def bare(text: str) -> str:
        return text.lstrip("-").replace("-", "_")

    def initials(text: str) -> str | None:
        words = [w for w in text.split("_") if w]
        return "".join(w[0] for w in words) if len(words) > 1 else None

    by_bare: dict[str, str] = {}
    for k in known:
        by_bare.setdefault(bare(k), k)
    wanted = bare(name)
    # a name cut short (--ep) first: difflib rated --help nearer than --epochs
    found = [k for k in by_bare if len(wanted) >= 2 and k != wanted and k.startswith(wanted)]
    found += difflib.get_close_matches(wanted, list(by_bare), n=n)
    found += [k for k in by_bare if k != wanted and (
        initials(wanted) == k or (initials(k) is not None and initials(k) == wanted))]
    return [by_bare[k] for k in dict.fromkeys(found)][:n]


def did_you_mean(unknown: Iterable[str], known: Iterable[str], n: int = 3,
                 shown: Callable[[str], str] = str) -> str:
    """"; --epoch: did you mean --epochs?" for each of ``unknown`` that has near names in
    ``known`` (:func:`near_names`), "" where none has: the hint after every "unknown" error (a
    config file's keys, fit()'s options, a command's flags, a callable's keyword arguments)."""
    known = list(known)
    hints = []
    for name in unknown:
        near = near_names(name, known, n)
        if near:
            hints.append(f"; {name}: did you mean {' or '.join(map(shown, near))}?")
    return "".join(hints)


def check_tracker(text: str, project: str) -> None:
    from ..trackers.names import missing_package, project_problem, tracker_names
    try:
        names = tracker_names(text)
    except ValueError as e:
        given = {name.strip().lower() for name in text.split(",")}
        # TensorBoard writes files in the run folder, no tracker run: its own flag does that
        hint = ("; for TensorBoard pass --tensorboard instead (tensorboard=True in fit()), "
                "which writes its event files to the run folder" if "tensorboard" in given
                else "")
        raise ConfigError(f"{e}{hint}") from None
    problem = missing_package(names) or project_problem(names, project)
    if problem:
        raise ConfigError(problem)


def parse_metric_goal(text: str) -> tuple[str, str] | None:
    """``"test_acc"`` -> ("test_acc", "max"); ``"test_loss"`` -> ("test_loss", "min"), as is any
    name that ends in loss; ``"min:test_mae"`` -> ("test_mae", "min"); ``""`` -> None."""
    text = (text or "").strip()
    if not text:
        return None
    goal, _, name = text.rpartition(":")
    name = name.strip()
    if goal.strip() not in ("", "max", "min") or not name:
        raise ValueError("name a metric such as test_acc or test_loss, optionally after max: "
                         "or min:, e.g. min:test_mae")
    return name, goal.strip() or ("min" if name.endswith("loss") else "max")


STOP_AT_FORMAT = "write NAME>=VALUE or NAME<=VALUE, e.g. test_acc>=0.95 or test_loss<=0.1"


def reaches(value: float, op: str, target: float) -> bool:
    """Whether ``value`` reaches ``target`` in the direction ``op`` (">=" or "<=", as
    parse_stop_at returns it): the run's --stop-at (loop/target.py) and compare's judge of its
    runs (compare/target_metric.py), which imports no torch for `compare --help`."""
    return value >= target if op == ">=" else value <= target


def parse_stop_at(text: str) -> tuple[str, str, float] | None:
    """``"test_acc>=0.95"`` -> ("test_acc", ">=", 0.95); ``"test_loss <= 0.1"`` ->
    ("test_loss", "<=", 0.1); ``""`` -> None. Whether the run reports NAME is known only once
    its metrics are (loop/target.py)."""
    text = (text or "").strip()
    if not text:
        return None
    for op in (">=", "<="):
        name, found, value = text.partition(op)
        if found:
            break
    else:
        raise ValueError(STOP_AT_FORMAT)
    name = name.strip()
    try:
        target = float(value)
    except ValueError:
        raise ValueError(f"{value.strip()!r} is not a number; {STOP_AT_FORMAT}") from None
    if not name.isidentifier() or not math.isfinite(target):
        raise ValueError(STOP_AT_FORMAT)
    # The built-in metrics' direction is known: the other way round, the untrained model's
    # first evaluation would reach the target (a loss at or above 0.8), surely a slip.
    falls = {"test_loss": True, "test_acc": False}.get(name)
    if falls is not None and (op == ">=") == falls:
        better = "<=" if falls else ">="
        raise ValueError(f"{name} {'falls' if falls else 'rises'} as a model learns, so "
                         f"{name}{op}{value.strip()} would be reached by an untrained one; "
                         f"write {name}{better}{value.strip()}")
    if name == "test_acc" and target <= 0:  # reached at the first evaluation, whatever trains
        raise ValueError(f"every model reaches test_acc>={value.strip()}, an accuracy of 0 or "
                         "less; give a fraction above 0, e.g. test_acc>=0.95")
    return name, op, target


def parse_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected true or false")


def parse_int_tuple(value: Any) -> tuple[int, ...]:
    """``"1024,1024"``, ``"1x28x28"``, ``[256, 128]`` or ``64`` -> a tuple of ints."""
    if isinstance(value, (list, tuple)):
        parts = list(value)
    elif isinstance(value, int):
        parts = [value]
    else:
        parts = [p for p in str(value).replace("x", ",").split(",") if p.strip()]
    return tuple(int(p) for p in parts)


def parse_profile_steps(spec: str) -> tuple[int, int]:
    """"A:B" -> (A, B), with 2 <= A <= B; a ConfigError that says what to pass otherwise."""
    first, sep, last = spec.partition(":")
    try:
        a, b = int(first), int(last or first)
    except ValueError:
        a = b = -1
    if (sep and not last) or a < 2 or b < a:
        raise ConfigError(f"--profile-steps: invalid value {spec!r}; use FIRST:LAST, the steps of "
                          "each worker process to profile, counted from 1, with 2 <= FIRST <= "
                          "LAST (step 1 holds one-off costs), e.g. 50:70")
    return a, b
