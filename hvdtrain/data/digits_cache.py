"""The built-in digits split, kept on disk after the first run.

Importing scikit-learn pulls in SciPy: most of a second in every rank of every job, several times
what training on digits takes per epoch. The train/test split is scikit-learn's, so it is made
with scikit-learn once per (scikit-learn version, --test-fraction, --data-seed) and cached as a
small .npz (about 0.5 MB) in $HVDTRAIN_CACHE, by default ~/.cache/hvdtrain. Later starts read
that file with numpy alone. The cache is an optimisation only: a folder that cannot be written,
or a file that cannot be read, means the split is made with scikit-learn as before, never an
error."""

from __future__ import annotations

import contextlib
import os
import socket
from importlib import metadata
from pathlib import Path

import numpy as np

# Bump when what _digits puts in the split changes (scaling, shapes), so old files are not read.
FORMAT = 1
ARRAYS = ("x_train", "y_train", "x_test", "y_test")


def cache_dir() -> Path | None:
    """The folder where setup also keeps the Horovod wheel (scripts/setup/build_horovod.sh);
    None where there is no home folder to put it in (a container user without one)."""
    if os.environ.get("HVDTRAIN_CACHE"):
        return Path(os.environ["HVDTRAIN_CACHE"])
    try:
        return Path.home() / ".cache" / "hvdtrain"
    except RuntimeError:
        return None


def cache_path(test_fraction: float, seed: int) -> Path | None:
    folder = cache_dir()
    if folder is None:
        return None
    try:
        sklearn = metadata.version("scikit-learn")
    except metadata.PackageNotFoundError:
        sklearn = "none"
    return folder / f"digits-v{FORMAT}-sklearn{sklearn}-test{test_fraction!r}-seed{seed}.npz"


def load(path: Path | None) -> tuple[np.ndarray, ...] | None:
    """The four split arrays, or None when the file is missing or not a whole cache file."""
    if path is None:
        return None
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = tuple(npz[k] for k in ARRAYS)
    except Exception:  # missing, truncated, or not an .npz: make the split again
        return None
    x_train, y_train, x_test, y_test = arrays
    if x_train.ndim != 4 or len(x_train) != len(y_train) or len(x_test) != len(y_test):
        return None
    return arrays


def store(path: Path | None, arrays: tuple[np.ndarray, ...]) -> None:
    """Write atomically (ranks of one job, and other jobs, may store the same file at once, on
    hosts that share the home folder); a folder that cannot be written is skipped silently."""
    if path is None:
        return
    tmp = path.with_name(f".{path.name}.{socket.gethostname()}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            np.savez(f, **dict(zip(ARRAYS, arrays)))
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):  # the folder may not be there, or not be a folder
            tmp.unlink(missing_ok=True)
