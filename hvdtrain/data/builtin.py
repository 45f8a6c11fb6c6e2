"""Datasets, the train/test split, and each worker's shard of every epoch.

All datasets here fit in memory, so a dataset is four tensors and batches are index lookups; no
DataLoader worker processes compete with the training ranks for the machine's cores.
"""

from __future__ import annotations

import gzip
import zipfile
import zlib
from dataclasses import dataclass, replace
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DistributedSampler

from ..config import DataConfig
from . import digits_cache


class DataError(ValueError):
    """A dataset file is missing, unreadable or has the wrong shape. The message says which."""


@dataclass
class Dataset:
    name: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int | None      # None: real-valued targets (a regression loss)
    num_targets: int | None = None  # values per sample of (N, k) real-valued targets
    own_test_split: bool = False  # the files brought it (else --test-fraction held it out)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[1:])


# The built-in losses whose targets are real values shaped like the output (bce_with_logits:
# probabilities, e.g. multi-label 0/1), not class labels.
REGRESSION_LOSSES = ("mse", "l1", "bce_with_logits")


def regression_outputs(loss_name: str, num_targets: int | None) -> int | None:
    """The built-in models' output width for real-valued targets: k, for (N, k) targets under a
    regression loss; None otherwise (a classifier's width is its number of classes)."""
    return num_targets if loss_name in REGRESSION_LOSSES else None


def load_dataset(cfg: DataConfig, regression: bool = False) -> Dataset:
    """regression: the run's loss is one of REGRESSION_LOSSES, so --dataset npz reads y as
    real-valued targets, (N,) or (N, k), rather than class labels."""
    if cfg.dataset == "npz":
        return _npz(cfg, regression)
    return DATASETS[cfg.dataset](cfg)


# --- the datasets ----------------------------------------------------------------------------
def _digits(cfg: DataConfig) -> Dataset:
    cached = digits_cache.cache_path(cfg.test_fraction, cfg.data_seed)
    arrays = digits_cache.load(cached)
    if arrays is None:
        from sklearn.datasets import load_digits

        bunch = load_digits()  # ships inside scikit-learn: 1,797 real 8x8 images, no download
        x = (bunch.images / 16.0).astype(np.float32)[:, None, :, :]  # pixel values are 0..16
        arrays = _split_arrays("digits", x, bunch.target, cfg)
        digits_cache.store(cached, arrays)
    return _make("digits", *arrays, cfg, "--dataset digits")


def _synthetic(cfg: DataConfig) -> Dataset:
    """Gaussian inputs labelled by a fixed random linear teacher, so there is something to learn."""
    rng = np.random.default_rng(cfg.data_seed)
    n, shape, k = cfg.synthetic_samples, cfg.synthetic_shape, cfg.synthetic_classes
    x = rng.standard_normal((n, *shape), dtype=np.float32)
    teacher = rng.standard_normal((int(np.prod(shape)), k), dtype=np.float32)
    y = (x.reshape(n, -1) @ teacher).argmax(axis=1)
    return _split("synthetic", x, y, cfg, where="--dataset synthetic", stratify=False)


def _mnist(cfg: DataConfig) -> Dataset:
    folder = Path(cfg.data_path)
    if not folder.is_dir():
        raise DataError(f"--data-path {folder}: no such folder; it should hold the four MNIST "
                        "IDX files (train-images-idx3-ubyte, train-labels-idx1-ubyte, "
                        "t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte, optionally .gz)")
    arrays = {}
    for part in ("train-images", "train-labels", "t10k-images", "t10k-labels"):
        dims = 3 if part.endswith("images") else 1
        arrays[part] = read_idx(_find_idx(folder, part, dims))
    for split in ("train", "t10k"):
        images, labels = arrays[f"{split}-images"], arrays[f"{split}-labels"]
        if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
            raise DataError(f"{folder}: {split} images have shape {images.shape} but labels "
                            f"{labels.shape}; expected (N, H, W) images and N labels")
    mean, std = 0.1307, 0.3081  # MNIST's pixel statistics, the usual normalisation
    def prep(images: np.ndarray) -> np.ndarray:
        return ((images.astype(np.float32) / 255.0 - mean) / std)[:, None, :, :]
    y_train, y_test = arrays["train-labels"].astype(np.int64), arrays["t10k-labels"].astype(np.int64)
    return replace(_make("mnist", prep(arrays["train-images"]), y_train,
                         prep(arrays["t10k-images"]), y_test, cfg, str(folder)),
                   own_test_split=True)


def _npz(cfg: DataConfig, regression: bool = False) -> Dataset:
    path = Path(cfg.data_path)
    if not path.is_file():
        raise DataError(f"--data-path {path}: no such file; pass a .npz file holding arrays "
                        "x (samples first) and y (integer labels), optionally x_test and y_test")
    # Checked first: numpy reads any non-zip file as a pickle and then suggests allow_pickle,
    # the wrong fix for a truncated download or a file that is not an .npz at all.
    if not zipfile.is_zipfile(path):
        raise DataError(f"{path}: not an .npz archive (an .npz is a zip file; this one is "
                        "truncated or in another format); re-create it with "
                        "numpy.savez(path, x=..., y=...)")
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
    except Exception as e:  # zipfile, pickle and numpy raise different types for a bad file
        raise DataError(f"{path}: not a readable .npz file ({type(e).__name__}: {e}); "
                        "re-create it with numpy.savez(path, x=..., y=...)") from None
    for key in ("x", "y"):
        if key not in arrays:
            raise DataError(f"{path}: has arrays {sorted(arrays)} but no {key!r}; save it with "
                            "numpy.savez(path, x=samples, y=labels)")
    read_y = _as_targets if regression else _as_labels
    x = _as_samples(arrays["x"], path, "x")
    y = read_y(arrays["y"], len(x), path, "y")
    if "x_test" in arrays or "y_test" in arrays:
        if not ("x_test" in arrays and "y_test" in arrays):
            raise DataError(f"{path}: has only one of x_test / y_test; save both or neither")
        if (arrays["x"].dtype == np.uint8) != (arrays["x_test"].dtype == np.uint8):
            # 8-bit images are scaled to [0, 1]: one split scaled and the other not trained on
            # one scale and tested on another (a test loss of 23, "diverging")
            raise DataError(f"{path}: x is {arrays['x'].dtype} and x_test "
                            f"{arrays['x_test'].dtype}, and uint8 images are scaled by 1/255 "
                            "while other dtypes are kept as they are; save both with one dtype")
        x_test = _as_samples(arrays["x_test"], path, "x_test")
        if x_test.shape[1:] != x.shape[1:]:
            raise DataError(f"{path}: x_test samples have shape {x_test.shape[1:]} but x samples "
                            f"{x.shape[1:]}; they must match")
        y_test = read_y(arrays["y_test"], len(x_test), path, "y_test")
        if y_test.shape[1:] != y.shape[1:]:
            raise DataError(f"{path}: y_test has shape {y_test.shape} but y {y.shape}; the "
                            "targets of a sample must have one shape")
        return replace(_make(path.stem, x, y, x_test, y_test, cfg, str(path), regression),
                       own_test_split=True)
    return _split(path.stem, x, y, cfg, where=str(path), regression=regression)


def _as_samples(x: np.ndarray, path: Path, key: str) -> np.ndarray:
    if x.ndim < 2 or len(x) == 0:
        raise DataError(f"{path}: {key} has shape {x.shape}; expected (samples, features...) "
                        "with at least one sample")
    if not (np.issubdtype(x.dtype, np.number) or x.dtype == bool):
        raise DataError(f"{path}: {key} has dtype {x.dtype}; expected numbers")
    if x.dtype == np.uint8:
        x = x / 255.0  # 8-bit images
    if x.ndim == 3:
        x = x[:, None]  # (N, H, W) images get one channel
    x = x.astype(np.float32)
    if not np.isfinite(x).all():
        raise DataError(f"{path}: {key} contains NaN or infinite values; clean the data first")
    return x


_FOR_REGRESSION = ("; for real-valued targets pass a regression loss (--loss mse, l1 or "
                   "bce_with_logits), which reads them as (N,) or (N, k)")


def _as_labels(y: np.ndarray, n: int, path: Path, key: str) -> np.ndarray:
    if y.ndim != 1 or len(y) != n:
        raise DataError(f"{path}: {key} has shape {y.shape}; expected one label per sample, "
                        f"({n},){_FOR_REGRESSION if y.ndim == 2 and len(y) == n else ''}")
    if not np.issubdtype(y.dtype, np.integer):
        if np.issubdtype(y.dtype, np.floating) and np.all(np.mod(y, 1) == 0):
            y = y.astype(np.int64)
        else:
            raise DataError(f"{path}: {key} has dtype {y.dtype}; expected integer class labels"
                            + _FOR_REGRESSION)
    if len(y) and y.min() < 0:  # else the stratified split blamed the split and its fraction
        raise DataError(f"{path}: {key} has negative labels (the smallest is {y.min()}); class "
                        "labels must be 0..K-1: renumber them")
    return y.astype(np.int64)


def _as_targets(y: np.ndarray, n: int, path: Path, key: str) -> np.ndarray:
    """Real-valued targets for a regression loss: numbers shaped (N,) or (N, k), as float32."""
    if y.ndim not in (1, 2) or len(y) != n:
        raise DataError(f"{path}: {key} has shape {y.shape}; expected one target per sample, "
                        f"({n},) or ({n}, k) for k values per sample")
    if not (np.issubdtype(y.dtype, np.number) or y.dtype == bool) or \
            np.issubdtype(y.dtype, np.complexfloating):
        raise DataError(f"{path}: {key} has dtype {y.dtype}; expected real numbers")
    y = y.astype(np.float32)
    if not np.isfinite(y).all():
        raise DataError(f"{path}: {key} contains NaN or infinite values; clean the data first")
    return y


def _split(name: str, x: np.ndarray, y: np.ndarray, cfg: DataConfig, where: str,
           stratify: bool = True, regression: bool = False) -> Dataset:
    """Real-valued targets (``regression``) cannot be stratified: their split is random."""
    arrays = _split_arrays(name, x, y, cfg, stratify and not regression)
    return _make(name, *arrays, cfg, where, regression)


def _split_arrays(name: str, x: np.ndarray, y: np.ndarray, cfg: DataConfig,
                  stratify: bool = True) -> tuple[np.ndarray, ...]:
    """(x_train, y_train, x_test, y_test): scikit-learn's split, stratified by label."""
    from sklearn.model_selection import train_test_split

    if cfg.test_fraction == 0:
        raise DataError(f"{name}: --test-fraction 0 holds out nothing, and {name} has no test "
                        "split of its own to evaluate on; hold out a share, e.g. 0.2")
    try:
        x_tr, x_te, y_tr, y_te = train_test_split(
            x, y, test_size=cfg.test_fraction, random_state=cfg.data_seed,
            stratify=y if stratify else None)
    except ValueError as e:  # e.g. a class with a single sample cannot be stratified
        raise DataError(f"{name}: cannot split {len(x)} samples into train and test ({e}); "
                        "add samples or change --test-fraction") from None
    return x_tr, y_tr, x_te, y_te


def _make(name, x_tr, y_tr, x_te, y_te, cfg: DataConfig, where: str,
          regression: bool = False) -> Dataset:
    num_classes = None if regression else count_classes(y_tr, y_te, where, cfg.sparse_labels)
    num_targets = y_tr.shape[1] if regression and y_tr.ndim == 2 else None
    x_tr, y_tr, x_te, y_te = (torch.from_numpy(np.ascontiguousarray(a))
                              for a in (x_tr, y_tr, x_te, y_te))
    return Dataset(name, x_tr, y_tr, x_te, y_te, num_classes, num_targets)


# A label range this much larger than the labels in use is almost always a labelling mistake
# (raw ids instead of class indices): the output layer would mostly train classes that never occur.
MAX_UNUSED_CLASSES = 1000


def count_classes(y_train: np.ndarray, y_test: np.ndarray, where: str, sparse_ok: bool) -> int:
    """The classifier's width, max label + 1, for labels that make a sensible classifier: no
    negative labels, at least 2 classes in the training labels, and (unless ``sparse_ok``, the
    --sparse-labels flag) no more unused class indices than both the labels in use and
    MAX_UNUSED_CLASSES."""
    labels = np.unique(np.concatenate([y_train, y_test]))
    if labels[0] < 0:
        raise DataError(f"{where}: has negative labels (the smallest is {labels[0]}); class "
                        "labels must be 0..K-1: renumber them")
    trained = np.unique(y_train)
    if len(trained) < 2:
        raise DataError(f"{where}: every training label is {trained[0]}, one class; a "
                        "classifier needs samples of at least 2 classes")
    num_classes = int(labels[-1]) + 1
    unused = num_classes - len(labels)
    if unused > max(len(labels), MAX_UNUSED_CLASSES) and not sparse_ok:
        raise DataError(
            f"{where}: labels go up to {labels[-1]}, a {num_classes}-way classifier, but only "
            f"{len(labels)} distinct labels occur; hvdtrain refuses more unused class indices "
            f"than both the labels in use and {MAX_UNUSED_CLASSES}. Renumber the labels "
            f"0..{len(labels) - 1} (numpy.unique(y, return_inverse=True)), or pass "
            "--sparse-labels if the unused classes are meant")
    return num_classes


DATASETS = {"digits": _digits, "synthetic": _synthetic, "mnist": _mnist, "npz": _npz}


# --- MNIST IDX files -------------------------------------------------------------------------
_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def _find_idx(folder: Path, part: str, dims: int) -> Path:
    # Distributions spell the names either train-images-idx3-ubyte or train-images.idx3-ubyte.
    for stem in (f"{part}-idx{dims}-ubyte", f"{part}.idx{dims}-ubyte"):
        for suffix in ("", ".gz"):
            if (folder / (stem + suffix)).is_file():
                return folder / (stem + suffix)
    raise DataError(f"{folder}: missing {part}-idx{dims}-ubyte (or .gz); an MNIST folder needs "
                    "train-images, train-labels, t10k-images and t10k-labels IDX files")


def read_idx(path: Path) -> np.ndarray:
    """Read one IDX file (the MNIST format): magic, dimension sizes, then raw big-endian data."""
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError, zlib.error) as e:  # gzip.BadGzipFile is an OSError
        raise DataError(f"{path}: cannot read ({e}); the download may be incomplete") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise DataError(f"{path}: not an IDX file (bad magic number {raw[:4].hex() or 'none'}); "
                        "expected MNIST-format data")
    ndim = raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(f"{path}: truncated header; the file is incomplete, download it again")
    shape = tuple(int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    dtype = np.dtype(_IDX_DTYPES[raw[2]])
    expected = int(np.prod(shape)) * dtype.itemsize
    if len(raw) - header != expected:
        raise DataError(f"{path}: header says shape {shape} ({expected} bytes of data) but the "
                        f"file holds {len(raw) - header}; it is truncated or corrupt, "
                        "download it again")
    return np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape)


# --- sharding --------------------------------------------------------------------------------
def epoch_batches(num_samples: int, batch_size: int, rank: int, world_size: int,
                  epoch: int, seed: int) -> np.ndarray:
    """This worker's batches of sample indices for one epoch, shape (steps, batch_size).

    Every epoch is one permutation, seeded by (seed, epoch), shared by all workers; worker r takes
    every world_size-th index starting at r (torch's DistributedSampler). So at each step the
    workers' batches are disjoint and together form one global batch of batch_size * world_size
    consecutive samples of the permutation: the same global batch a single process would draw
    with that batch size. All workers get the same number of steps; the remainder is dropped.
    """
    indices = sampler_indices(num_samples, world_size, rank, epoch, seed)
    steps = len(indices) // batch_size
    return indices[: steps * batch_size].reshape(steps, batch_size)


def share_batches(num_samples: int, batch_size: int, worker: int, shares: Sequence[int],
                  epoch: int, seed: int) -> np.ndarray:
    """This worker's batches of sample indices for one epoch under unequal shares of the global
    batch (--balance), shape (steps, shares[worker]).

    At each step the global batch is the one epoch_batches gives the workers together (the
    batch a single process would draw); laid out as worker 0's equal batch, then worker 1's,
    and so on, worker w takes the ``shares[w]`` rows after the shares of the workers before it.
    Equal shares therefore give exactly epoch_batches' rows, and any shares cover every row of
    the global batch once. The steps are epoch_batches' (the shares add up to the global
    batch)."""
    workers = len(shares)
    if not 0 <= worker < workers or sum(shares) != batch_size * workers or min(shares) < 1:
        raise ValueError(f"shares {list(shares)} of worker {worker}: need one positive share "
                         f"per worker adding up to {batch_size} x {workers}")
    order = _permutation(num_samples, epoch, seed)
    steps = len(order) // workers // batch_size
    # Row j of the equal split: worker w's batch is order[j*G + w :: workers][:batch_size].
    glob = order[: steps * batch_size * workers].reshape(steps, batch_size, workers)
    by_worker = glob.transpose(0, 2, 1).reshape(steps, batch_size * workers)
    start = sum(shares[:worker])
    return np.ascontiguousarray(by_worker[:, start:start + shares[worker]])


def _permutation(num_samples: int, epoch: int, seed: int) -> np.ndarray:
    """The epoch's permutation that epoch_batches deals out (DistributedSampler's)."""
    return sampler_indices(num_samples, 1, 0, epoch, seed)


def sampler_indices(num_samples: int, world_size: int, rank: int, epoch: int,
                    seed: int) -> np.ndarray:
    """What ``DistributedSampler(shuffle=True, drop_last=True)`` yields to ``rank`` in ``epoch``,
    taken from the tensor it draws rather than through its Python list: the sampler's
    iterator turns the permutation into a list first, which cost 15 ms an epoch at 160,000
    samples, inside the first step (tests/unit/test_data.py checks that both agree)."""
    sampler = DistributedSampler(range(num_samples), num_replicas=world_size, rank=rank,
                                 shuffle=True, seed=seed, drop_last=True)
    generator = torch.Generator()
    generator.manual_seed(seed + epoch)  # the sampler's seed for an epoch
    order = torch.randperm(num_samples, generator=generator)[:sampler.total_size]
    return order[rank::world_size].numpy()


def eval_shard(num_samples: int, rank: int, world_size: int) -> slice:
    """A contiguous slice of the test split per worker; together they cover it exactly once."""
    per, extra = divmod(num_samples, world_size)
    start = rank * per + min(rank, extra)
    return slice(start, start + per + (1 if rank < extra else 0))
