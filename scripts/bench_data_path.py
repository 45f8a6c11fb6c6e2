"""The DataLoader path against the in-memory path, on the same data in the same run.

The same tensors are trained on three ways, alternating in rounds so the machine's drift hits all
alike: as an (x, y) pair (in memory: a batch is an index lookup), as a TensorDataset read through
a DataLoader in the training process, and through a DataLoader with --data-workers loader
processes. Prints each path's samples/s and its ratio to the in-memory path, per round and as
the median. One process, no launcher: the data path is the same on every worker.

    .venv/bin/python scripts/bench_data_path.py --rounds 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile

import torch
from torch.utils.data import TensorDataset

import hvdtrain


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--samples", type=int, default=8192)
    parser.add_argument("--features", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=3, help="per measurement; the first is "
                        "warm-up and not counted")
    parser.add_argument("--data-workers", type=int, default=2)
    args = parser.parse_args()

    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.samples, args.features, generator=g)
    y = (x[:, :10].sum(1) > 0).long()
    paths = {"in memory": ((x, y), 0), "DataLoader": (TensorDataset(x, y), 0),
             f"DataLoader, {args.data_workers} loader processes":
                 (TensorDataset(x, y), args.data_workers)}

    def model():
        return torch.nn.Sequential(torch.nn.Linear(args.features, 256), torch.nn.ReLU(),
                                   torch.nn.Linear(256, 2))

    rates: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(args.rounds):
        for name, (data, workers) in paths.items():
            with tempfile.TemporaryDirectory() as run_dir:
                result = hvdtrain.fit(model, data, None, epochs=args.epochs,
                                      batch_size=args.batch_size, data_workers=workers,
                                      progress=False, run_dir=run_dir, warmup_epochs=0)
            counted = [e["samples_per_sec"] for e in result.history[1:]]
            rates[name].append(statistics.mean(counted))
    baseline = rates["in memory"]
    report = {name: {"samples_per_sec": [round(r) for r in values],
                     "ratio_to_in_memory": [round(a / b, 3) for a, b in zip(values, baseline)],
                     "median_ratio": round(statistics.median(
                         a / b for a, b in zip(values, baseline)), 3)}
              for name, values in rates.items()}
    print("DATA_PATH " + json.dumps(report), flush=True)
    for name, figures in report.items():
        print(f"{name:40s} median {statistics.median(rates[name]):9,.0f} samples/s, "
              f"{figures['median_ratio']:.3f} x in memory", flush=True)


if __name__ == "__main__":
    main()
