"""The options of the data: where the samples come from and how they are split."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import require
from .values import MAX_SEED, SEED_RANGE, opt, refuse_unread


@dataclass
class DataConfig:
    """Where the samples come from and how they are split."""

    dataset: str = opt("digits", "digits (scikit-learn's bundled 8x8 digits), synthetic, "
                       "mnist (a folder of IDX files), npz (a file with x and y arrays), folder "
                       "(one subfolder of PNG/JPEG images per class, read lazily), or your own "
                       "MODULE:CALLABLE returning (train, test): Datasets, IterableDatasets or "
                       "(x, y) tensor pairs; MODULE is a dotted import path or a .py file")
    dataset_args: str = opt("", "keyword arguments for your --dataset callable, as a JSON "
                            "object, e.g. '{\"root\": \"data/\"}'")
    data_path: str | None = opt(None, "folder of MNIST IDX files, the .npz file, or the image "
                                "folder; required for --dataset mnist|npz|folder")
    collate: str = opt("", "your own MODULE:CALLABLE that makes a batch of a list of (input, "
                       "target) samples of a Dataset, e.g. padding sequences to the longest; "
                       "default: torch's default_collate, which stacks samples of one shape")
    data_workers: int = opt(0, "DataLoader processes per worker for Dataset inputs (started "
                            "with forkserver, persistent across epochs); 0 loads in the "
                            "training process. In-memory data never uses a DataLoader")
    test_fraction: float = opt(0.2, "share of samples held out for testing, when the dataset "
                               "has no test split of its own: stratified by label for the "
                               "built-in datasets, a random split (seeded by --data-seed) of "
                               "your own --dataset, which 0 trains on whole without a test split")
    data_seed: int = opt(0, "seed of the train/test split and of synthetic data")
    synthetic_samples: int = opt(8192, "number of samples in --dataset synthetic")
    synthetic_shape: tuple[int, ...] = opt((1024,), "shape of one synthetic sample, "
                                           "e.g. 1024 or 1x28x28")
    synthetic_classes: int = opt(10, "number of classes in --dataset synthetic")
    sparse_labels: bool = opt(False, "--dataset npz|mnist: accept labels whose range is far "
                              "larger than the labels in use (max label + 1 classes are "
                              "built); without it hvdtrain refuses more unused class indices "
                              "than both the distinct labels and 1000, usually raw ids that "
                              "were meant to be renumbered 0..K-1")

    def validate(self) -> None:
        d = self
        require(0 <= d.test_fraction < 1, "--test-fraction", d.test_fraction,
                "hold out a share between 0 and 1, e.g. 0.2, or 0 for none (your own "
                "--dataset only: the built-in ones need a test split)")
        require(d.synthetic_samples >= 2, "--synthetic-samples", d.synthetic_samples,
                "use at least 2 samples")
        require(len(d.synthetic_shape) >= 1 and all(n >= 1 for n in d.synthetic_shape),
                "--synthetic-shape", d.synthetic_shape, "give positive sizes such as 1024 or 1x28x28")
        require(d.synthetic_classes >= 2, "--synthetic-classes", d.synthetic_classes,
                "use at least 2 classes")
        refuse_unread(d, ("synthetic_samples", "synthetic_shape", "synthetic_classes"),
                      d.dataset == "synthetic", f"it shapes --dataset synthetic, and --dataset "
                      f"{d.dataset} would ignore it: add --dataset synthetic, or drop " "{flag}")
        if d.dataset in ("mnist", "npz", "folder"):
            require(bool(d.data_path), "--data-path", d.data_path,
                    f"--dataset {d.dataset} reads local files: pass --data-path "
                    + {"mnist": "FOLDER holding train-images-idx3-ubyte etc.",
                       "npz": "FILE.npz holding arrays x and y",
                       "folder": "FOLDER with one subfolder of images per class"}[d.dataset])
        else:  # the built-in digits trained instead, without a word (a forgotten --dataset npz)
            refuse_unread(d, ("data_path",), False,
                          f"only --dataset mnist, npz or folder read it, and --dataset "
                          f"{d.dataset} would ignore it: add --dataset npz (a .npz file), mnist "
                          "or folder, or give your own --dataset callable its path with "
                          "--dataset-args")
        require(d.data_workers >= 0, "--data-workers", d.data_workers,
                "use 0 (load in the training process) or a number of loader processes")
        require(0 <= d.data_seed <= MAX_SEED, "--data-seed", d.data_seed, SEED_RANGE)
