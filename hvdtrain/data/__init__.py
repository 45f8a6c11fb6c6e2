"""Where the samples come from: the built-in datasets (builtin.py), the in-memory batches that
serve them (in_memory.py), torch DataLoaders for the user's own datasets (loader.py), and the
user's own data made ready to train on: numpy arrays, dtypes, a held-out test split (user_data.py)."""

from .builtin import DataError, Dataset, epoch_batches, eval_shard, load_dataset, read_idx

__all__ = ["DataError", "Dataset", "epoch_batches", "eval_shard", "load_dataset", "read_idx"]
