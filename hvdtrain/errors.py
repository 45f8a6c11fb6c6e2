"""The errors that every layer raises, for input that cannot work and for training that cannot
go on, and the checks that build their messages. They live apart from the config package and
the loop so that low-level modules (data, losses, the wire protocol, the run lock, user code,
the loss scale) and the rules can raise them without importing every option of a run."""

from __future__ import annotations

import sys
from typing import Any


class ConfigError(ValueError):
    """An option has a value that cannot work. The message names the flag and the fix."""


class TrainingError(RuntimeError):
    """Training cannot go on (for example the loss became NaN). The message says where and why."""


def require(ok: bool, flag: str, got: Any, fix: str) -> None:
    """Raise a ConfigError naming ``flag``, the value it ``got`` and the ``fix`` unless ``ok``."""
    if not ok:
        raise ConfigError(f"{flag}: invalid value {show(got)}; {fix}")


def show(value: Any) -> str:
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value) or "(empty)"
    return repr(value)


def too_deep(flag: str) -> str:
    """The message for a value nested deeper than Python's parsers and printers can recurse."""
    return (f"{flag}: the value is nested too deeply to read (more than about "
            f"{sys.getrecursionlimit()} levels of tables or brackets); pass a flat object of "
            "keyword arguments, e.g. {\"width\": 64}, and build deep structures in your own code")


def plain_message(error: BaseException) -> str:
    """``error``'s message, without the wrapper of torch's DataLoader: an error in a loader
    process comes back as "Caught DataError in DataLoader worker process 0." with the real
    message at the end of its traceback, and the one-line error (and the log's stop line) said
    only that first line."""
    text = str(error)
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].startswith("Caught ") and "DataLoader worker" in lines[0]:
        worker = lines[0].rstrip(".").rsplit(" ", 1)[-1]
        message = lines[-1].partition(": ")[2] or lines[-1]
        return f"{message} (in DataLoader worker process {worker})"
    return text
