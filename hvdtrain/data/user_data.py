"""The user's own data (``--dataset MODULE:CALLABLE``, fit()'s objects), made ready to train on.

(x, y) pairs: numpy arrays become tensors (the way data most often arrives from files), and
dtypes the models and losses would refuse are converted, each conversion said once, in the
run's data line:
- float64 inputs and targets become the default dtype (float32 unless torch.set_default_dtype
  says otherwise), the dtype of the models' weights; float64 inputs failed in the model's first
  layer ("mat1 and mat2 must have the same dtype");
- integer targets of any other integer dtype become int64, the class indices cross_entropy and
  nll take (int32 labels failed inside the loss).

A dataset without a test split of its own gets one held out (--test-fraction): the split is a
pure function of (number of samples, fraction, seed), so every rank and every loader process
computes the same one. A stream cannot be split without reading it, and keeps no test split.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, Subset

from ..losses import integer_labels
from .builtin import DataError


def is_array(value: Any) -> bool:
    """A tensor or a numpy array: what x and y of a pair may be."""
    return isinstance(value, (torch.Tensor, np.ndarray))


def ready_pair(data: Any, where: str, what: str) -> tuple[Any, list[str]]:
    """``data`` with numpy arrays as tensors and dtypes converted as the module says, and what was
    converted ("x from float64 to float32"); anything but a pair of arrays comes back unchanged
    (check_data judges it)."""
    if not (isinstance(data, (tuple, list)) and len(data) == 2 and all(map(is_array, data))):
        return data, []
    x, y = (_as_tensor(value, where, what, name) for value, name in zip(data, "xy"))
    converted = []
    floats = torch.get_default_dtype()
    if x.dtype == torch.float64 and floats != torch.float64:
        x = x.to(floats)
        converted.append(f"x from float64 to {_dtype_name(floats)}")
    if y.dtype == torch.float64 and floats != torch.float64:
        y = y.to(floats)
        converted.append(f"y from float64 to {_dtype_name(floats)}")
    elif integer_labels(y.dtype) and y.dtype != torch.int64:
        converted.append(f"y from {_dtype_name(y.dtype)} to int64")
        y = y.long()
    return (x, y), converted


def conversion_note(converted: list[str]) -> list[str]:
    """The data line's note for what ready_pair converted (the training and test splits')."""
    unique = list(dict.fromkeys(converted))
    return ([f"converted {', '.join(unique)} (the dtypes the models and losses take)"]
            if unique else [])


def _as_tensor(value: Any, where: str, what: str, name: str) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    if not value.dtype.isnative:  # torch reads the machine's own byte order only
        value = value.astype(value.dtype.newbyteorder("="))
    elif not value.flags.writeable:  # a read-only array (a memory map): torch would warn
        value = value.copy()
    try:
        return torch.from_numpy(value)
    except TypeError:  # strings, objects, dates: torch holds numbers only
        raise DataError(f"{where}: {what}'s {name} is a numpy array of dtype {value.dtype}; x "
                        "and y must hold numbers: convert them, e.g. x.astype(numpy.float32), "
                        "y.astype(numpy.int64)") from None


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def targets_without_classes(y: torch.Tensor) -> tuple[int | None, str | None]:
    """For targets that are not one integer class label per sample: (the number of values per
    sample, where they are real values shaped (N, k), which a regression loss takes; why
    num_classes cannot be read from them, as a clause that ends the model factory's message)."""
    own_model = "pass num_classes in --model-args to your own --model"
    if integer_labels(y.dtype):  # a sequence's token ids, say
        return None, (f"the targets are integers shaped {tuple(y.shape)}, not one class label "
                      f"per sample (N,), so the number of classes cannot be read from them "
                      f"({own_model})")
    kind = "booleans" if y.dtype == torch.bool else f"{_dtype_name(y.dtype)} values"
    width = y.shape[1] if y.dim() == 2 and y.dtype != torch.bool else None
    # (N,) real values read as a regression loss's only where shaped (N, 1): the advice to
    # pass --loss mse came back to a run that passed it
    regression = ("shape them (N, 1) (y.unsqueeze(1)) and pass a regression loss (--loss mse, "
                  "l1, or bce_with_logits for 0/1 targets)" if y.dim() == 1 else
                  "pass a regression loss, --loss mse or l1, with targets shaped (N, k)")
    return width, (f"the targets are {kind} shaped {tuple(y.shape)}, not integer class labels, "
                   "so the number of classes cannot be read from them (for a classifier give "
                   f"labels 0..K-1, e.g. y.long(); for real-valued targets {regression}; or "
                   f"{own_model})")


class HeldOut(Subset):
    """The training or the held-out part of a map-style dataset without a test split of its own;
    messages name the user's dataset (its class), not this wrapper."""

    @property
    def name(self) -> str:
        return type(self.dataset).__name__


def split_indices(num_samples: int, fraction: float,
                  seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(train rows, test rows), each in the data's order: scikit-learn's train_test_split, as
    for an image folder (folder.py), seeded with ``seed``, chooses the test rows; the same on
    every rank (no collective needed). ValueError where a part would be empty."""
    from sklearn.model_selection import train_test_split

    train, test = train_test_split(np.arange(num_samples), test_size=fraction,
                                   random_state=seed)
    return torch.from_numpy(np.sort(train)), torch.from_numpy(np.sort(test))


def own_split_note(fraction: float) -> list[str]:
    """The data line's word that --test-fraction went unused: data with a test split of its own
    (MNIST's t10k files, an npz's x_test, a folder's test/, a --dataset's test) is evaluated on
    that split. Said only where the flag was changed from its default."""
    from ..config.data_options import DataConfig

    if fraction == DataConfig.test_fraction:
        return []
    return [f"--test-fraction {fraction} unused: the data brings its own test split"]


def hold_out(train: Any, fraction: float, seed: int,
             where: str) -> tuple[Any, Any, list[str]]:
    """(train, test, notes for the data line) for data without a test split: ``fraction`` of
    its samples held out (--test-fraction, --data-seed). A fraction of 0, or a stream, keeps all
    of them for training and no test split."""
    if fraction == 0:
        return train, None, []
    if isinstance(train, IterableDataset):
        return train, None, ["a stream is not split by --test-fraction (return a test split "
                             "of your own to evaluate)"]
    num_samples = len(train[0]) if isinstance(train, (tuple, list)) else len(train)
    try:
        rows, test_rows = split_indices(num_samples, fraction, seed)
    except ValueError as e:
        raise DataError(f"{where}: cannot hold out --test-fraction {fraction} of {num_samples} "
                        f"sample(s) as a test split ({e}); add samples, change --test-fraction, "
                        "return a test split of your own, or pass --test-fraction 0 to train "
                        "without one") from None
    note = f"test split held out of the training data (--test-fraction {fraction}, " \
           f"--data-seed {seed})"
    if isinstance(train, (tuple, list)):
        x, y = train
        return ((x[rows.to(x.device)], y[rows.to(y.device)]),
                (x[test_rows.to(x.device)], y[test_rows.to(y.device)]), [note])
    return HeldOut(train, rows.tolist()), HeldOut(train, test_rows.tolist()), [note]
