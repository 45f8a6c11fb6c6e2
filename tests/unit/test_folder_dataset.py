"""FolderDataset reads an ImageFolder layout lazily with Pillow; every bad folder says the fix."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from hvdtrain.data.builtin import DataError
from hvdtrain.data.in_memory import InMemoryBatches
from hvdtrain.data.folder import FolderDataset, FolderSubset, load_folder
from hvdtrain.data.loader import LoaderBatches

CLASSES = ["eight", "one", "zero"]  # sorted by name: labels 0, 1, 2
DIGITS = {"zero": 0, "one": 1, "eight": 8}
PER_CLASS = 10


def digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    return np.round(bunch.images * 255 / 16).astype(np.uint8), bunch.target


def write_digits(root: Path, per_class: int = PER_CLASS) -> dict[str, list[np.ndarray]]:
    """PNG files of sklearn's digits 0, 1 and 8; returns the pixels written per class."""
    images, targets = digits()
    written = {}
    for name, digit in DIGITS.items():
        (root / name).mkdir(parents=True)
        written[name] = list(images[targets == digit][:per_class])
        for i, pixels in enumerate(written[name]):
            Image.fromarray(pixels, mode="L").save(root / name / f"{i:03d}.png")
    return written


def test_labels_shapes_and_values(tmp_path):
    written = write_digits(tmp_path)
    (tmp_path / "one" / "notes.txt").write_text("not an image")  # ignored
    ds = FolderDataset(tmp_path)
    assert ds.classes == CLASSES and ds.num_classes == 3 and ds.input_shape == (1, 8, 8)
    assert len(ds) == 3 * PER_CLASS
    assert Counter(ds.targets) == {0: PER_CLASS, 1: PER_CLASS, 2: PER_CLASS}
    for index in (0, PER_CLASS + 3, len(ds) - 1):
        x, y = ds[index]
        name = CLASSES[int(y)]
        assert x.dtype == torch.float32 and y.dtype == torch.int64 and x.shape == (1, 8, 8)
        want = torch.from_numpy(written[name][index % PER_CLASS].astype(np.float32) / 255)
        assert torch.equal(x[0], want)
        assert 0.0 <= x.min() and x.max() <= 1.0


def test_colour_images(tmp_path):
    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 256, (6, 5, 3), dtype=np.uint8)
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    Image.fromarray(rgb, mode="RGB").save(tmp_path / "a" / "rgb.png")
    Image.fromarray(np.dstack([rgb, rgb[..., :1]]), mode="RGBA").save(tmp_path / "a" / "rgba.png")
    palette = Image.fromarray(rgb, mode="RGB").quantize(colors=8)
    palette.save(tmp_path / "b" / "palette.png")
    Image.fromarray(rgb[..., 0], mode="L").save(tmp_path / "b" / "zgray.png")  # read as colour
    Image.fromarray(rgb, mode="RGB").save(tmp_path / "b" / "photo.jpg", quality=95)
    ds = FolderDataset(tmp_path)
    assert ds.input_shape == (3, 6, 5)
    files = [Path(p).name for p, _ in ds.samples]
    assert files == ["rgb.png", "rgba.png", "palette.png", "photo.jpg", "zgray.png"]
    want = torch.from_numpy(rgb.transpose(2, 0, 1).astype(np.float32) / 255)
    assert torch.equal(ds[0][0], want) and torch.equal(ds[1][0], want)
    from_palette = np.asarray(palette.convert("RGB"), dtype=np.float32).transpose(2, 0, 1) / 255
    assert torch.equal(ds[2][0], torch.from_numpy(from_palette))
    decoded = np.asarray(Image.open(tmp_path / "b" / "photo.jpg"), dtype=np.float32) / 255
    assert torch.equal(ds[3][0], torch.from_numpy(decoded.transpose(2, 0, 1)))  # lossy JPEG
    gray = ds[4][0]
    assert gray.shape == (3, 6, 5) and torch.equal(gray[0], gray[2]) and torch.equal(gray[0],
                                                                                    want[0])
    assert ds.targets == [0, 0, 1, 1, 1]


def test_missing_folder(tmp_path):
    with pytest.raises(DataError, match="nowhere: no such folder; .*one subfolder per class"):
        FolderDataset(tmp_path / "nowhere")
    with pytest.raises(DataError, match="no such folder"):
        load_folder(tmp_path / "nowhere", 0.2, 0)


def test_no_class_subfolders(tmp_path):
    Image.fromarray(np.zeros((4, 4), np.uint8)).save(tmp_path / "loose.png")
    with pytest.raises(DataError, match="no class subfolders; put the images of each class"):
        FolderDataset(tmp_path)


def test_class_folder_without_images(tmp_path):
    write_digits(tmp_path)
    (tmp_path / "seven").mkdir()
    (tmp_path / "seven" / "readme.txt").write_text("todo")
    with pytest.raises(DataError, match=r"seven: class folder holds no images \(.png"):
        FolderDataset(tmp_path)


def test_corrupt_image_is_named(tmp_path):
    write_digits(tmp_path)
    bad = tmp_path / "one" / "005.png"
    bad.write_bytes(bad.read_bytes()[:40])  # truncated
    ds = FolderDataset(tmp_path)  # lazy: only the first image is read up front
    index = [p for p, _ in ds.samples].index(str(bad))
    ds[index - 1]
    with pytest.raises(DataError, match=r"005\.png: cannot read this image .*replace or delete"):
        ds[index]
    (tmp_path / "eight" / "000.png").write_bytes(b"not a png at all")
    with pytest.raises(DataError, match=r"eight/000\.png: cannot read this image"):
        FolderDataset(tmp_path)


def test_images_of_different_sizes(tmp_path):
    write_digits(tmp_path)
    Image.fromarray(np.zeros((9, 7), np.uint8)).save(tmp_path / "zero" / "big.png")
    ds = FolderDataset(tmp_path)
    index = [Path(p).name for p, _ in ds.samples].index("big.png")
    with pytest.raises(DataError, match=r"big\.png: image is 7x9 pixels but .*000\.png is 8x8; "
                                        "all images must have one size"):
        ds[index]


def test_colour_image_in_a_grayscale_folder(tmp_path):
    write_digits(tmp_path)
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / "zero" / "colour.png")
    ds = FolderDataset(tmp_path)
    index = [Path(p).name for p, _ in ds.samples].index("colour.png")
    with pytest.raises(DataError, match=r"colour\.png: a colour image, .* grayscale"):
        ds[index]


def test_stratified_split(tmp_path):
    write_digits(tmp_path)
    train, test = load_folder(tmp_path, 0.2, seed=3)
    assert isinstance(train, FolderSubset) and isinstance(test, FolderSubset)
    assert len(train) == 24 and len(test) == 6
    assert Counter(test.targets) == {0: 2, 1: 2, 2: 2}  # stratified
    assert set(train.indices).isdisjoint(test.indices)
    assert sorted(train.indices + test.indices) == list(range(30))
    assert train.num_classes == 3 and train.input_shape == (1, 8, 8)
    again, _ = load_folder(tmp_path, 0.2, seed=3)
    other, _ = load_folder(tmp_path, 0.2, seed=4)
    assert again.indices == train.indices != other.indices
    x, y = train[0]
    assert x.shape == (1, 8, 8) and int(y) == train.targets[0]


def test_split_too_small_says_so(tmp_path):
    write_digits(tmp_path, per_class=1)
    with pytest.raises(DataError, match="cannot split 3 images .*--test-fraction"):
        load_folder(tmp_path, 0.2, 0)


def test_train_and_test_folders_are_used_as_given(tmp_path):
    write_digits(tmp_path / "train")
    write_digits(tmp_path / "test", per_class=2)
    (tmp_path / "test" / "eight" / "000.png").unlink()
    (tmp_path / "test" / "eight" / "001.png").unlink()
    (tmp_path / "test" / "eight").rmdir()  # a test split may lack a class
    train, test = load_folder(tmp_path, 0.5, 0)
    assert len(train) == 30 and len(test) == 4
    assert test.classes == CLASSES and test.targets == [1, 1, 2, 2]  # the train folder's labels
    (tmp_path / "test" / "nine").mkdir()
    Image.fromarray(np.zeros((8, 8), np.uint8)).save(tmp_path / "test" / "nine" / "0.png")
    with pytest.raises(DataError, match=r"\['nine'\] are not among the training classes"):
        load_folder(tmp_path, 0.5, 0)


def test_folder_through_a_loader(tmp_path):
    write_digits(tmp_path)
    ds = FolderDataset(tmp_path)
    xs = torch.stack([ds[i][0] for i in range(len(ds))])
    got = list(LoaderBatches(ds).train_batches(0, 1, 2, 5, 0, 0, 3))
    want = list(InMemoryBatches(xs, torch.tensor(ds.targets)).train_batches(0, 1, 2, 5, 0, 0, 3))
    assert len(got) == 3 and got[0][0].shape == (5, 1, 8, 8)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(got, want))
