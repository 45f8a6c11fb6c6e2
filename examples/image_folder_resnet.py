"""A small residual CNN trained on images read lazily from PNG files: plain PyTorch, one fit call.

The images are scikit-learn's 8x8 digits, written once as PNG files in the ImageFolder layout
(one subfolder per class). Point --data-dir at your own folder of equal-sized images to train
on those instead: the Dataset below reads any such folder, one file per sample.

    python examples/image_folder_resnet.py                                  # one process
    horovodrun -np 2 --gloo python examples/image_folder_resnet.py          # sync, 2 workers
    mpirun -np 3 python examples/image_folder_resnet.py --mode async        # 2 workers + 1 server
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
from PIL import Image
from torch.utils.data import Dataset

import hvdtrain

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")


def write_digits_as_pngs(root: Path) -> Path:
    """Write the digits into root/<label>/<index>.png, unless root exists already.

    Every process of the job may get here at once, with no rank to tell them apart. Each writes
    a private copy and renames it into place: a rename is atomic, so a reader sees either no
    folder or a whole one, and the processes that lose the race drop their identical copies.
    """
    if root.is_dir():
        return root
    from sklearn.datasets import load_digits

    digits = load_digits()
    root.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{root.name}-", dir=root.parent))
    for index, (image, label) in enumerate(zip(digits.images, digits.target)):
        folder = staging / str(label)
        folder.mkdir(exist_ok=True)
        pixels = np.round(image * (255 / 16)).astype(np.uint8)  # digits are 0..16 gray levels
        Image.fromarray(pixels).save(folder / f"{index:04d}.png")
    try:
        os.rename(staging, root)
    except OSError:  # another process renamed its copy first
        shutil.rmtree(staging, ignore_errors=True)
    return root


def list_images(root: Path) -> tuple[list[tuple[str, int]], list[str]]:
    """(path, label) of every image, and the class names (the subfolders, sorted)."""
    classes = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    samples = [(str(path), label) for label, name in enumerate(classes)
               for path in sorted((root / name).iterdir()) if path.suffix.lower() in IMAGE_SUFFIXES]
    return samples, classes


class ImageFiles(Dataset):
    """Grayscale images read from disk one file per sample, so the folder may outgrow memory.

    Defined at module level: with --data-workers the DataLoader's processes receive it pickled.
    """

    def __init__(self, samples: list[tuple[str, int]]):
        self.samples = samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, label = self.samples[index]
        with Image.open(path) as image:
            pixels = np.asarray(image.convert("L"), dtype=np.float32) / 255.0
        x = torch.from_numpy(pixels).unsqueeze(0)  # 1 x H x W
        return (x - 0.5) / 0.5, label


def split(samples: list, test_fraction: float, seed: int) -> tuple[list, list]:
    shuffled = list(samples)
    random.Random(seed).shuffle(shuffled)  # a fixed seed: every process gets the same split
    n_test = int(len(shuffled) * test_fraction)
    return shuffled[n_test:], shuffled[:n_test]


class ResidualBlock(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(x + self.bn2(self.conv2(out)))


class SmallResNet(nn.Module):
    """stem -> block -> downsample -> block -> global pool -> dropout -> linear."""

    def __init__(self, num_classes: int, width: int = 16, dropout: float = 0.2):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, width, 3, padding=1, bias=False),
                                  nn.BatchNorm2d(width), nn.ReLU())
        self.block1 = ResidualBlock(width)
        self.down = nn.Sequential(nn.Conv2d(width, 2 * width, 3, stride=2, padding=1, bias=False),
                                  nn.BatchNorm2d(2 * width), nn.ReLU())
        self.block2 = ResidualBlock(2 * width)
        self.pool = nn.AdaptiveAvgPool2d(1)  # any image size works
        self.dropout = nn.Dropout(dropout)
        self.fc = nn.Linear(2 * width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.block2(self.down(self.block1(self.stem(x))))
        return self.fc(self.dropout(self.pool(x).flatten(1)))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("sync", "async"), default="sync")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32, help="per worker")
    parser.add_argument("--lr", type=float, default=0.05, help="per worker; scaled by workers")
    parser.add_argument("--width", type=int, default=16, help="channels of the first block")
    parser.add_argument("--data-dir", type=Path,
                        default=Path(tempfile.gettempdir()) / "hvdtrain-digits-png",
                        help="an image folder (one subfolder per class); the digits are "
                             "written there if it does not exist")
    parser.add_argument("--data-workers", type=int, default=0,
                        help="DataLoader processes per worker (0: read in the training process)")
    parser.add_argument("--max-steps-per-epoch", type=int, default=0,
                        help="cut each epoch short, for quick runs (0: whole epochs)")
    parser.add_argument("--run-dir", default=None, help="where the log and checkpoint go")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    samples, classes = list_images(write_digits_as_pngs(args.data_dir))
    train, test = split(samples, test_fraction=0.2, seed=args.seed)

    result = hvdtrain.fit(
        functools.partial(SmallResNet, num_classes=len(classes), width=args.width),
        ImageFiles(train), ImageFiles(test), loss="cross_entropy",
        mode=args.mode, epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
        lr_schedule="cosine",  # a small last step size settles BatchNorm's running statistics
        data_workers=args.data_workers, max_steps_per_epoch=args.max_steps_per_epoch,
        run_dir=args.run_dir, seed=args.seed)

    # Every process gets the same result; the launcher's rank picks the one that prints.
    if int(os.environ.get("HOROVOD_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", 0))) == 0:
        final = result.final
        print(f"final: epoch={final['epoch']} train_loss={final['train_loss']:.4f} "
              f"test_loss={final['test_loss']:.4f} test_acc={final['test_acc']:.4f} "
              f"({final['wall_seconds']:.1f}s, log: {result.log_path})")


if __name__ == "__main__":  # loader processes import this file; they must not train
    main()
