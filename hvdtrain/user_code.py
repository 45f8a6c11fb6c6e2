"""The user's own model, dataset and loss: find them from a ``MODULE:CALLABLE`` flag, and call them.

A spec names a module and something callable in it::

    --model mypkg.models:build           a dotted module, from the current folder or PYTHONPATH
    --model models/resnet.py:build       a .py file, absolute or relative to the current folder
    --model models/resnet.py:Zoo.build   a dotted name inside the module

Two kinds of failure are kept apart. A spec that points nowhere (no such file, module or name) is
a :class:`ConfigError`: the message names the flag and the fix. An exception raised by the user's
own code, while its module is imported or when it is called, is a :class:`UserCodeError`: still a
ConfigError (the CLI exits 2), but it carries the user's traceback so the CLI can show where in
their code it broke.

Nothing here imports torch, so the CLI can check specs before the heavy imports.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import json
import math
import os
import re
import sys
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Iterable

from .config.values import did_you_mean, near_names
from .errors import ConfigError, too_deep

# Files loaded from a path are registered in this environment variable, so that a spawned or
# forkserver child (a DataLoader worker, say) can import them again by name when it unpickles an
# object whose class the file defines. Children inherit the environment; they do not inherit
# sys.modules.
USER_FILES_ENV = "HVDTRAIN_USER_FILES"

# A .py file becomes the module hvdtrain.user_code.<stem>_<hash of its path>: unique per file (two
# files named model.py don't clash), the same in every process, and importable there (see
# _UserFileFinder).
__path__: list[str] = []  # makes this module a package, so it can have those submodules
_FILE_MODULE_PREFIX = __name__ + "."

_HVDTRAIN_DIR = os.path.dirname(os.path.abspath(__file__))
_IMPORTLIB_DIR = os.path.dirname(os.path.abspath(importlib.__file__))
_MAX_LISTED = 10  # names shown when an attribute is missing


class UserCodeError(ConfigError):
    """The user's own code raised, while its module was imported or when it was called.

    The message names the flag and the spec and says where the user's code raised;
    ``user_traceback`` holds the traceback from the user's first frame down, for the CLI to print
    above the message.
    """

    def __init__(self, flag: str, spec: str, error: BaseException, doing: str = ""):
        self.flag = flag
        self.spec = spec
        self.error = error
        self.user_traceback = format_user_traceback(error)
        where = _innermost_user_frame(error)
        at = f"at {where.filename}:{where.lineno}, " if where else ""
        doing = f": {doing}" if doing else ""
        super().__init__(f"{flag} {spec}{doing} raised {type(error).__name__}: {error} "
                         f"({at}traceback above)")


def resolve_callable(spec: str, flag: str, builtins: Iterable[str] | None = None) -> Callable:
    """The callable a ``MODULE:CALLABLE`` spec names, importing its module (or .py file) first.

    ``builtins`` are the flag's built-in names, listed in the error when ``spec`` is neither one
    of them nor a ``MODULE:CALLABLE``.
    """
    module_part, colon, attribute_path = spec.rpartition(":")  # rpartition: C:\... paths
    if not colon or not module_part.strip() or not attribute_path.strip():
        raise ConfigError(_not_a_spec_message(spec, flag, builtins))
    module_part, attribute_path = module_part.strip(), attribute_path.strip()
    if _looks_like_file(module_part):
        module = _import_file(module_part, flag, spec)
    else:
        module = _import_dotted(module_part, flag, spec)
    target: Any = module
    walked = module_part
    for name in attribute_path.split("."):
        try:
            found = getattr(target, name, _MISSING)
        except Exception as e:  # a module __getattr__ or a property of the user's
            raise UserCodeError(flag, spec, e, f"looking up {name!r}") from e
        if found is _MISSING:
            raise ConfigError(_missing_attribute_message(target, walked, name, flag, spec))
        target, walked = found, f"{walked}.{name}"
    if not callable(target):
        raise ConfigError(f"{flag} {spec}: {attribute_path!r} is "
                          f"{_with_article(type(target).__name__)}, not a function or class; "
                          "name a function or class after the ':'")
    return target


def call_user(fn: Callable, flag: str, spec: str, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, where an exception from the user's code becomes a UserCodeError."""
    try:
        return fn(*args, **kwargs)
    except ConfigError:
        raise  # hvdtrain's own verdict on an option (--compile), reached through the user's call
    except (Exception, SystemExit) as e:  # SystemExit: a user's sys.exit() must not end us quietly
        raise UserCodeError(flag, spec, e) from e


def call_with_known_kwargs(fn: Callable, flag: str, spec: str, explicit: dict[str, Any],
                           offered: dict[str, Any], args_flag: str | None = None,
                           unlearned: dict[str, str] | None = None) -> Any:
    """Call the user's ``fn`` with ``explicit`` keywords (from ``--model-args``), plus each
    ``offered`` one (``input_shape``, ``num_classes``...) that its signature names or takes as
    ``**kwargs``. Explicit keywords win over offered ones.

    A call that cannot bind (an unknown or missing keyword) is the user's options, not their code:
    it is a ConfigError naming ``args_flag`` (default ``<flag>-args``) and the signature, raised
    before ``fn`` runs, so that a TypeError from inside ``fn`` is still a UserCodeError.
    ``unlearned`` names the keywords that would have been offered but could not be learned, each
    with how the user can make it known; the error adds that for each required one.
    """
    args_flag = args_flag or f"{flag}-args"
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins have none: pass only what the user asked for
        signature = None
    kwargs = {}
    if signature is not None:
        takes_any = any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values())
        by_keyword = _keyword_parameters(signature)
        kwargs = {k: v for k, v in offered.items() if takes_any or k in by_keyword}
    kwargs.update(explicit)
    if signature is not None:
        try:
            signature.bind(**kwargs)
        except TypeError as e:
            shown = ", ".join(kwargs) or "no arguments"
            raise ConfigError(  # named after the flag the user gave: --model-args, or --model
                f"{args_flag if explicit else flag}: {spec} is {_callable_name(fn)}{signature}, "
                f"which cannot be called "
                f"with {shown} ({e}){_near_parameters(signature, explicit)}; in {args_flag} give "
                f"only parameters it names, and every one without a default"
                + _args_example(signature, offered, args_flag)
                + _unlearned_advice(signature, kwargs, unlearned or {})) from None
    return call_user(fn, flag, spec, **kwargs)


def _keyword_parameters(signature: inspect.Signature) -> dict[str, inspect.Parameter]:
    return {name: p for name, p in signature.parameters.items()
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def _near_parameters(signature: inspect.Signature, explicit: dict[str, Any]) -> str:
    """"; widht: did you mean width?" for each given keyword that the callable does not name."""
    named = _keyword_parameters(signature)
    if any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values()):
        return ""
    return did_you_mean([k for k in explicit if k not in named], named)


def _args_example(signature: inspect.Signature, offered: dict[str, Any], args_flag: str) -> str:
    """", e.g. --model-args '{"vocab": 32, "d": 32}'": up to two of the callable's own parameters
    with their defaults, those hvdtrain offers (num_classes...) left out; "" where it has none
    whose default JSON can write (a fixed example would name a key it may well refuse)."""
    shown = {name: p.default for name, p in _keyword_parameters(signature).items()
             if name not in offered and _plain_json(p.default)}
    if not shown:
        return ""
    return f", e.g. {args_flag} '{json.dumps(dict(list(shown.items())[:2]))}'"


def _plain_json(value: Any) -> bool:
    """A default that reads as itself in JSON: a string, a bool or a finite number."""
    return isinstance(value, (bool, int, str)) or (isinstance(value, float)
                                                   and math.isfinite(value))


def _unlearned_advice(signature: inspect.Signature, kwargs: dict[str, Any],
                      unlearned: dict[str, str]) -> str:
    """Why a required keyword that hvdtrain offers when it can was not offered, and how the user
    can make it known: a user's Dataset that has no ``classes`` attribute cannot tell
    ``num_classes``, and the bind error alone does not say so."""
    missing = [name for name, p in signature.parameters.items()
               if name in unlearned and name not in kwargs and p.default is p.empty
               and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    return "".join(f"; {name} was not offered because {unlearned[name]}" for name in missing)


# What each flag's messages show as a JSON object to give.
JSON_EXAMPLES = {"--model-args": '{"width": 64}', "--dataset-args": '{"path": "data.npz"}'}


def parse_json_args(text: str | dict | None, flag: str) -> dict[str, Any]:
    """Keyword arguments from a JSON object (``--model-args '{"width": 64}'``); None or "" is {}.
    A dict (from a config file) passes through."""
    example = f"{flag} '{JSON_EXAMPLES.get(flag, JSON_EXAMPLES['--model-args'])}'"
    if text is None or (isinstance(text, str) and not text.strip()):
        return {}
    if isinstance(text, dict):
        return dict(text)
    if not isinstance(text, str):
        raise ConfigError(f"{flag}: expected a JSON object of keyword arguments, got a "
                          f"{type(text).__name__} ({text!r}); e.g. {example}")
    try:
        parsed = json.loads(text)
    except RecursionError:
        raise ConfigError(too_deep(flag)) from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{flag}: {text!r} is not valid JSON ({e}); give a JSON object of "
                          f"keyword arguments in single quotes, e.g. {example}") from None
    if not isinstance(parsed, dict):
        raise ConfigError(f"{flag}: {text!r} is a JSON {type(parsed).__name__}, not an object; "
                          f"give keyword arguments by name, e.g. {example}")
    return parsed


def expect_type(value: Any, types: type | tuple[type, ...], flag: str, spec: str,
                what: str) -> None:
    """Raise a ConfigError when the user's factory returned something other than ``types``.

    ``what`` finishes the fix "return ...", e.g. "the model instance".
    """
    if isinstance(value, types):
        return
    expected = " or ".join(_type_name(t) for t in (types if isinstance(types, tuple) else (types,)))
    if value is None:
        raise ConfigError(f"{flag} {spec} returned None, expected {_with_article(expected)}; "
                          f"return {what} (is a return statement missing?)")
    got = _with_article(type(value).__name__)
    raise ConfigError(f"{flag} {spec} returned {got}, expected {_with_article(expected)}; "
                      f"return {what}")


def format_user_traceback(error: BaseException) -> str:
    """The traceback of ``error``, without the leading frames of hvdtrain and importlib that
    only show how the user's code was reached."""
    report = traceback.TracebackException.from_exception(error)
    frames = list(report.stack)
    while frames and _is_machinery(frames[0].filename):
        frames.pop(0)
    report.stack = traceback.StackSummary.from_list(frames)
    return "".join(report.format())


# -- finding the module ------------------------------------------------------------------------

class _Missing:
    pass


_MISSING = _Missing()


def _looks_like_file(module_part: str) -> bool:
    return module_part.endswith(".py") or "/" in module_part or os.sep in module_part


def _import_dotted(module_name: str, flag: str, spec: str) -> ModuleType:
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:  # as `python -m` does; a console script doesn't
        sys.path.insert(0, cwd)
    importlib.invalidate_caches()  # a module written moments ago is found, not a cached listing
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and (module_name == e.name or module_name.startswith(e.name + ".")):
            as_file = module_name.replace(".", "/") + ".py"
            raise ConfigError(
                f"{flag} {spec}: no module named {e.name!r} in the current folder ({cwd}) or on "
                f"PYTHONPATH; run from the folder that holds it, add that folder to PYTHONPATH, "
                f"or give the file's path, e.g. {flag} path/to/{as_file}:"
                f"{spec.rpartition(':')[2]}") from None
        raise UserCodeError(flag, spec, e, f"importing {module_name}") from e
    except (Exception, SystemExit) as e:
        raise UserCodeError(flag, spec, e, f"importing {module_name}") from e


def _import_file(path_text: str, flag: str, spec: str) -> ModuleType:
    path = Path(path_text).expanduser()
    absolute = path if path.is_absolute() else Path.cwd() / path
    if not absolute.is_file():
        hint = ("" if path_text.endswith(".py") else
                "; for a dotted module path write it with dots, e.g. mypkg.models:build")
        raise ConfigError(f"{flag} {spec}: no such file {str(absolute)!r}; give the path of a .py "
                          f"file, absolute or relative to the current folder ({os.getcwd()})"
                          f"{hint}")
    real_path = os.path.realpath(absolute)
    module_name = file_module_name(real_path)
    folder = os.path.dirname(real_path)
    if folder not in sys.path:  # so the file can import its siblings
        sys.path.insert(0, folder)
    _register_file(real_path)
    importlib.invalidate_caches()  # siblings written moments ago are found
    try:
        return importlib.import_module(module_name)
    except (Exception, SystemExit) as e:
        raise UserCodeError(flag, spec, e, f"importing {path_text}") from e


def file_module_name(path: str | os.PathLike) -> str:
    """The module name a .py file is imported under: hvdtrain.user_code.<stem>_<path hash>."""
    real_path = os.path.realpath(path)
    stem = re.sub(r"\W", "_", Path(real_path).stem)
    digest = hashlib.sha1(real_path.encode()).hexdigest()[:10]
    return f"{_FILE_MODULE_PREFIX}{stem}_{digest}"


def _register_file(real_path: str) -> None:
    registered = _registered_files()
    if real_path not in registered:
        os.environ[USER_FILES_ENV] = os.pathsep.join([*registered, real_path])


def _registered_files() -> list[str]:
    return [p for p in os.environ.get(USER_FILES_ENV, "").split(os.pathsep) if p]


class _UserFileFinder(importlib.abc.MetaPathFinder):
    """Imports hvdtrain.user_code.<stem>_<hash> from the registered file with that name."""

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith(_FILE_MODULE_PREFIX):
            return None
        for file in _registered_files():
            if file_module_name(file) == fullname:
                return importlib.util.spec_from_file_location(fullname, file)
        return None


if not any(isinstance(f, _UserFileFinder) for f in sys.meta_path):
    sys.meta_path.append(_UserFileFinder())


# -- messages ----------------------------------------------------------------------------------

def _not_a_spec_message(spec: str, flag: str, builtins: Iterable[str] | None) -> str:
    noun = flag.lstrip("-").replace("-", "_")
    example = f"e.g. my_{noun}:build (a module) or path/to/my_{noun}.py:build (a file)"
    if spec.strip().endswith(".py"):
        return (f"{flag}: {spec!r} names a file but not what to call in it; add ':' and the "
                f"function or class, e.g. {flag} {spec.strip()}:build")
    names = sorted(builtins or ())
    if names:
        return (f"{flag}: {spec!r} is not a built-in {noun} name nor MODULE:CALLABLE; choose one "
                f"of {', '.join(names)}, or give your own as MODULE:CALLABLE, {example}")
    return f"{flag}: {spec!r} is not of the form MODULE:CALLABLE; {example}"


def _missing_attribute_message(owner: Any, owner_name: str, name: str, flag: str,
                               spec: str) -> str:
    available = _public_callables(owner)
    close = near_names(name, available, n=1)
    suggestion = f"did you mean {close[0]!r}? " if close else ""
    if available:
        shown = ", ".join(available[:_MAX_LISTED])
        if len(available) > _MAX_LISTED:
            shown += f" (and {len(available) - _MAX_LISTED} more)"
        has = f"it has {shown}"
    else:
        has = "it has no public functions or classes"
    where = f" ({owner.__file__})" if isinstance(owner, ModuleType) and getattr(
        owner, "__file__", None) else ""
    return (f"{flag} {spec}: {owner_name}{where} has no attribute {name!r}; {suggestion}{has}; "
            f"fix the name after the ':'")


def _public_callables(owner: Any) -> list[str]:
    """Public functions and classes of a module or class; for a module, those defined in it come
    first (not the ones it imported)."""
    names = [n for n in dir(owner) if not n.startswith("_")]
    found = []
    for n in names:
        try:
            value = getattr(owner, n)
        except Exception:
            continue
        if callable(value) and not isinstance(value, ModuleType):
            found.append((n, value))
    if isinstance(owner, ModuleType):
        found.sort(key=lambda item: getattr(item[1], "__module__", None) != owner.__name__)
    return [n for n, _ in found]


def _callable_name(fn: Callable) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__name__


def _type_name(cls: type) -> str:
    """The shortest public dotted name of a class: torch.nn.Module, not
    torch.nn.modules.module.Module."""
    if cls.__module__ == "builtins":
        return cls.__qualname__
    parts = cls.__module__.split(".")
    for end in range(1, len(parts) + 1):
        module = sys.modules.get(".".join(parts[:end]))
        if module is not None and getattr(module, cls.__qualname__, None) is cls:
            return f"{'.'.join(parts[:end])}.{cls.__qualname__}"
    return f"{cls.__module__}.{cls.__qualname__}"


def _with_article(noun: str) -> str:
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"


def _is_machinery(filename: str) -> bool:
    if filename.startswith("<frozen importlib"):
        return True
    path = os.path.abspath(filename)
    return path.startswith(_HVDTRAIN_DIR + os.sep) or path.startswith(_IMPORTLIB_DIR + os.sep)


def _innermost_user_frame(error: BaseException) -> traceback.FrameSummary | None:
    """The last frame outside hvdtrain, importlib and installed packages (torch...): the line of
    the user's code that raised, or that called the library that did."""
    frames = [f for f in traceback.extract_tb(error.__traceback__) if not _is_machinery(f.filename)]
    own = [f for f in frames if "site-packages" not in f.filename
           and not f.filename.startswith(sys.base_prefix)]
    return (own or frames or [None])[-1]
