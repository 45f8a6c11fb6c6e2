"""Run ``hvdtrain train`` with every async worker on the staged-copy path that GPU workers take
(pinned host buffers, chunked copies between the device buffer and the host buffer), on CPUs.

Usage: train_staged_copies.py [hvdtrain train flags...]. On a CPU the staged copies run
synchronously, so a run must end exactly where the direct path (the model's weights are the
host buffer) ends: that checks the chunk arithmetic on machines without a GPU.
"""

import sys

import torch

from hvdtrain.cli import main
from hvdtrain.ps import client, device_copies

client.copies_for = lambda device, total: device_copies.StagedCopies(total, torch.device("cpu"))
sys.exit(main(["train", *sys.argv[1:]]))
