"""A folder of images, one subfolder per class (the ImageFolder layout), read lazily with Pillow.

    root/
      cat/  001.png  002.jpg ...
      dog/  001.png ...

Classes are the subfolders sorted by name; a sample's label is its class's index. Each
__getitem__ opens one file, so the folder may be larger than memory; serve it through
loader.LoaderBatches, with --data-workers to decode in parallel. Pillow reads the images
(torchvision does not install beside the CPU torch here; see DESIGN.md).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset, Subset

from .builtin import DataError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
_GRAY_MODES = {"1": 255.0, "L": 255.0, "LA": 255.0, "I;16": 65535.0, "I;16B": 65535.0,
               "I;16L": 65535.0, "I": 65535.0}  # grayscale modes and their full scale (16-bit PNG)


class FolderDataset(Dataset):
    """Samples (float32 C x H x W in [0, 1], int64 label). Grayscale images give C = 1, colour
    ones (RGB, RGBA, palette, CMYK) C = 3. The first image fixes the shape: all images must have
    one size and one kind (grayscale or colour; a grayscale image in a colour folder becomes
    colour). `classes` names the classes to use (a test folder takes the train folder's)."""

    def __init__(self, root: str | Path, classes: list[str] | None = None):
        self.root = Path(root)
        if not self.root.is_dir():
            raise DataError(f"{self.root}: no such folder; an image folder holds one subfolder "
                            "per class with PNG or JPEG files in it (e.g. "
                            f"{self.root}/cat/001.png), or train/ and test/ folders laid out so")
        found = sorted(p.name for p in self.root.iterdir()
                       if p.is_dir() and not p.name.startswith("."))
        if not found:
            raise DataError(f"{self.root}: has no class subfolders; put the images of each class "
                            f"into a subfolder named after it (e.g. {self.root}/cat/001.png)")
        if classes is None:
            if len(found) < 2:
                raise DataError(f"{self.root}: has one class subfolder ({found[0]}); a "
                                "classifier needs at least 2 classes: add a subfolder of "
                                "images for each other class")
            classes = found
        elif unknown := sorted(set(found) - set(classes)):
            raise DataError(f"{self.root}: class folders {unknown} are not among the training "
                            f"classes {classes}; the test folder's classes must also be in the "
                            "train folder")
        self.classes = list(classes)
        self.samples: list[tuple[str, int]] = []
        for label, name in enumerate(self.classes):
            folder = self.root / name
            if not folder.is_dir():
                continue  # a test folder may lack a class
            files = sorted(p for p in folder.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES
                           and p.is_file() and not p.name.startswith("."))
            if not files:
                raise DataError(f"{folder}: class folder holds no images "
                                f"({', '.join(IMAGE_SUFFIXES)}); add images or remove the folder")
            self.samples += [(str(p), label) for p in files]
        self.targets = [label for _, label in self.samples]
        self.num_classes = len(self.classes)
        first = self._read(self.samples[0][0])
        self._colour = first.shape[0] == 3
        self.input_shape: tuple[int, ...] = tuple(first.shape)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        path, label = self.samples[index]
        x = self._read(path, self._colour)
        if tuple(x.shape) != self.input_shape:
            c, h, w = x.shape
            first = self.samples[0][0]
            if (h, w) != self.input_shape[1:]:
                raise DataError(f"{path}: image is {w}x{h} pixels but {first} is "
                                f"{self.input_shape[2]}x{self.input_shape[1]}; all images must "
                                "have one size: resize them first (e.g. Pillow's Image.resize)")
            raise DataError(f"{path}: a colour image, but {first} (the first image) is "
                            "grayscale; all images must be grayscale or all colour: convert "
                            "them first (e.g. Pillow's Image.convert('RGB'))")
        return x, torch.tensor(label, dtype=torch.int64)

    @staticmethod
    def _read(path: str, colour: bool = False) -> torch.Tensor:
        from PIL import Image

        try:
            with Image.open(path) as image:
                image.load()  # decodes now: a truncated file fails here, not later
                if image.mode in _GRAY_MODES:
                    gray = image.convert("L") if image.mode in ("1", "LA") else image
                    pixels = np.asarray(gray, dtype=np.float32)[None] / _GRAY_MODES[image.mode]
                    if colour:  # a grayscale image among colour ones
                        pixels = np.repeat(pixels, 3, axis=0)
                else:
                    rgb = image.convert("RGB")  # palette, RGBA, CMYK
                    pixels = np.asarray(rgb, dtype=np.float32).transpose(2, 0, 1) / 255.0
        except Exception as e:  # Pillow raises OSError, SyntaxError, ValueError for bad files
            raise DataError(f"{path}: cannot read this image ({type(e).__name__}: {e}); the file "
                            "is corrupt or not a PNG/JPEG: replace or delete it") from None
        return torch.from_numpy(np.ascontiguousarray(pixels))


class FolderSubset(Subset):
    """A part of a FolderDataset that still tells its classes and input shape."""

    dataset: FolderDataset

    @property
    def classes(self) -> list[str]:
        return self.dataset.classes

    @property
    def num_classes(self) -> int:
        return self.dataset.num_classes

    @property
    def input_shape(self) -> tuple[int, ...]:
        return self.dataset.input_shape

    @property
    def targets(self) -> list[int]:
        return [self.dataset.targets[i] for i in self.indices]


def load_folder(root: str | Path, test_fraction: float,
                seed: int) -> tuple[FolderDataset | FolderSubset, FolderDataset | FolderSubset]:
    """(train, test) datasets of an image folder. A root with train/ and test/ subfolders is
    used as given; otherwise its images are split, stratified by class, with test_fraction of
    them held out (decided from the file list, without opening the images)."""
    from sklearn.model_selection import train_test_split

    root = Path(root)
    if (root / "train").is_dir() and (root / "test").is_dir():
        train = FolderDataset(root / "train")
        return train, FolderDataset(root / "test", classes=train.classes)
    if test_fraction == 0:
        raise DataError(f"{root}: --test-fraction 0 holds out nothing, and the folder has no "
                        "train/ and test/ subfolders to evaluate on; hold out a share, e.g. 0.2")
    full = FolderDataset(root)
    try:
        train_idx, test_idx = train_test_split(np.arange(len(full)), test_size=test_fraction,
                                               random_state=seed, stratify=full.targets)
    except ValueError as e:  # e.g. a class with a single image cannot be stratified
        raise DataError(f"{root}: cannot split {len(full)} images into train and test ({e}); "
                        "add images, change --test-fraction, or provide train/ and test/ "
                        "folders") from None
    return FolderSubset(full, train_idx.tolist()), FolderSubset(full, test_idx.tolist())
