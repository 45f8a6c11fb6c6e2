"""Tier 1: datasets, file formats and their errors, and each worker's shard."""

import gzip

import numpy as np
import pytest

from hvdtrain.config import DataConfig
from hvdtrain.data import DataError, epoch_batches, eval_shard, load_dataset, read_idx


def test_digits_is_real_and_stratified():
    ds = load_dataset(DataConfig(dataset="digits"))
    assert len(ds.x_train) + len(ds.x_test) == 1797
    assert ds.input_shape == (1, 8, 8) and ds.num_classes == 10
    assert 0.0 <= float(ds.x_train.min()) and float(ds.x_train.max()) <= 1.0
    train_share = np.bincount(ds.y_train.numpy()) / len(ds.y_train)
    test_share = np.bincount(ds.y_test.numpy()) / len(ds.y_test)
    assert np.abs(train_share - test_share).max() < 0.01  # stratified: same class mix


def _same(a, b) -> bool:
    return all(np.array_equal(getattr(a, k).numpy(), getattr(b, k).numpy())
               for k in ("x_train", "y_train", "x_test", "y_test"))


def test_the_digits_split_is_cached_and_a_broken_cache_file_is_made_again(tmp_path, monkeypatch):
    import sklearn.model_selection

    monkeypatch.setenv("HVDTRAIN_CACHE", str(tmp_path / "cache"))
    cfg = DataConfig(dataset="digits", data_seed=3, test_fraction=0.25)
    made = load_dataset(cfg)
    [cached] = (tmp_path / "cache").glob("digits-*seed3.npz")
    assert len(made.x_test) == 450  # a quarter of 1,797, rounded up
    split = sklearn.model_selection.train_test_split
    def no_split(*args, **kwargs):
        raise AssertionError("the cached split was not used")
    monkeypatch.setattr(sklearn.model_selection, "train_test_split", no_split)
    assert _same(load_dataset(cfg), made)  # read back, without scikit-learn
    cached.write_bytes(cached.read_bytes()[:1000])  # a write cut short by a crash
    monkeypatch.setattr(sklearn.model_selection, "train_test_split", split)
    assert _same(load_dataset(cfg), made)
    assert cached.stat().st_size > 100_000  # written whole again
    other = load_dataset(DataConfig(dataset="digits", data_seed=4, test_fraction=0.25))
    assert not _same(other, made)  # another seed, another split and file
    assert len(list((tmp_path / "cache").iterdir())) == 2
    # a cache folder that cannot be made (here a file is in the way), or no home folder at all:
    # the split is made anyway
    monkeypatch.setenv("HVDTRAIN_CACHE", str(cached))
    assert _same(load_dataset(cfg), made)
    monkeypatch.delenv("HVDTRAIN_CACHE")
    def no_home():
        raise RuntimeError("Could not determine home directory")
    monkeypatch.setattr("pathlib.Path.home", staticmethod(no_home))
    assert _same(load_dataset(cfg), made)


def test_synthetic_is_seeded():
    cfg = DataConfig(dataset="synthetic", synthetic_samples=100, synthetic_shape=(1, 4, 4))
    a, b = load_dataset(cfg), load_dataset(cfg)
    assert a.input_shape == (1, 4, 4)
    assert np.array_equal(a.x_train.numpy(), b.x_train.numpy())


@pytest.mark.parametrize("world", [1, 2, 3])
def test_shards_are_disjoint_and_form_the_global_batch(world):
    n, b, seed = 103, 4, 7
    per_rank = [epoch_batches(n, b, r, world, epoch=2, seed=seed) for r in range(world)]
    steps = {len(p) for p in per_rank}
    assert len(steps) == 1  # every worker runs the same number of steps
    everything = np.concatenate([p.ravel() for p in per_rank])
    assert len(set(everything.tolist())) == len(everything)  # disjoint
    single = epoch_batches(n, b * world, 0, 1, epoch=2, seed=seed)
    for step in range(steps.pop()):  # at each step the union is one global batch of one process
        union = sorted(np.concatenate([p[step] for p in per_rank]).tolist())
        assert union == sorted(single[step].tolist())


def test_epochs_reshuffle():
    a = epoch_batches(100, 10, 0, 2, epoch=0, seed=1)
    b = epoch_batches(100, 10, 0, 2, epoch=1, seed=1)
    assert not np.array_equal(a, b)
    assert np.array_equal(a, epoch_batches(100, 10, 0, 2, epoch=0, seed=1))


def test_eval_shards_cover_the_test_split_once():
    for n, world in [(360, 2), (10, 3), (2, 3)]:
        covered = [i for r in range(world) for i in range(n)[eval_shard(n, r, world)]]
        assert covered == list(range(n))


def write_idx(path, array, gz=False):
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(d.to_bytes(4, "big") for d in array.shape)
    data = header + array.astype(np.uint8).tobytes()
    path.write_bytes(gzip.compress(data) if gz else data)


def make_mnist(folder, n_train=40, n_test=20, gz=False):
    rng = np.random.default_rng(0)
    folder.mkdir(exist_ok=True)
    sfx = ".gz" if gz else ""
    write_idx(folder / f"train-images-idx3-ubyte{sfx}", rng.integers(0, 255, (n_train, 28, 28)), gz)
    write_idx(folder / f"train-labels-idx1-ubyte{sfx}", np.arange(n_train) % 10, gz)
    write_idx(folder / f"t10k-images-idx3-ubyte{sfx}", rng.integers(0, 255, (n_test, 28, 28)), gz)
    write_idx(folder / f"t10k-labels-idx1-ubyte{sfx}", np.arange(n_test) % 10, gz)


@pytest.mark.parametrize("gz", [False, True])
def test_mnist_idx_folder(tmp_path, gz):
    make_mnist(tmp_path / "mnist", gz=gz)
    ds = load_dataset(DataConfig(dataset="mnist", data_path=str(tmp_path / "mnist")))
    assert ds.input_shape == (1, 28, 28) and len(ds.x_train) == 40 and len(ds.x_test) == 20
    assert ds.num_classes == 10


def test_mnist_errors(tmp_path):
    with pytest.raises(DataError, match="no such folder"):
        load_dataset(DataConfig(dataset="mnist", data_path=str(tmp_path / "nope")))
    folder = tmp_path / "mnist"
    make_mnist(folder)
    (folder / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(DataError, match="missing t10k-labels-idx1-ubyte"):
        load_dataset(DataConfig(dataset="mnist", data_path=str(folder)))
    make_mnist(folder)
    images = folder / "train-images-idx3-ubyte"
    images.write_bytes(images.read_bytes()[:-100])
    with pytest.raises(DataError, match="truncated or corrupt"):
        read_idx(images)
    images.write_bytes(b"PK\x03\x04garbage")
    with pytest.raises(DataError, match="bad magic number"):
        read_idx(images)
    make_mnist(folder)
    write_idx(folder / "train-labels-idx1-ubyte", np.arange(39) % 10)
    with pytest.raises(DataError, match="expected \\(N, H, W\\) images and N labels"):
        load_dataset(DataConfig(dataset="mnist", data_path=str(folder)))


def test_npz_files(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "data.npz"
    np.savez(path, x=rng.standard_normal((50, 6)).astype(np.float32), y=np.arange(50) % 5)
    ds = load_dataset(DataConfig(dataset="npz", data_path=str(path)))
    assert ds.input_shape == (6,) and ds.num_classes == 5 and len(ds.x_test) == 10
    assert not ds.own_test_split  # held out by --test-fraction
    with_test = tmp_path / "split.npz"
    np.savez(with_test, x=rng.integers(0, 255, (30, 5, 5), dtype=np.uint8), y=np.arange(30) % 3,
             x_test=rng.integers(0, 255, (9, 5, 5), dtype=np.uint8), y_test=np.arange(9) % 3)
    ds = load_dataset(DataConfig(dataset="npz", data_path=str(with_test)))
    assert ds.input_shape == (1, 5, 5) and len(ds.x_test) == 9 and float(ds.x_train.max()) <= 1
    assert ds.own_test_split  # so a --test-fraction goes unused, and the data line says so


@pytest.mark.parametrize("arrays, message", [
    ({"x": np.zeros((10, 3))}, "no 'y'"),
    ({"x": np.zeros((10, 3)), "y": np.zeros(9, dtype=int)}, "one label per sample"),
    ({"x": np.zeros(10), "y": np.zeros(10, dtype=int)}, "expected \\(samples, features"),
    ({"x": np.zeros((10, 3)), "y": np.full(10, 0.5)}, "integer class labels"),
    ({"x": np.full((10, 3), np.nan), "y": np.zeros(10, dtype=int)}, "NaN"),
    # a negative label was blamed on the split ("cannot split ... change --test-fraction")
    ({"x": np.zeros((10, 3)), "y": np.array([-1] + [0, 1] * 4 + [1])}, "y has negative labels "
                                                                        "\\(the smallest is -1\\)"),
    # uint8 x is scaled by 1/255, a float x_test was not: a test loss of 23, "diverging"
    ({"x": np.zeros((10, 3), np.uint8), "y": np.arange(10) % 2,
      "x_test": np.zeros((4, 3), np.float32), "y_test": np.arange(4) % 2},
     "x is uint8 and x_test float32, and uint8 images are scaled by 1/255"),
])
def test_npz_wrong_shapes(tmp_path, arrays, message):
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    with pytest.raises(DataError, match=message):
        load_dataset(DataConfig(dataset="npz", data_path=str(path)))


def test_npz_corrupt_and_missing(tmp_path):
    path = tmp_path / "data.npz"
    np.savez(path, x=np.zeros((10, 3)), y=np.zeros(10, dtype=int))
    good = path.read_bytes()
    path.write_bytes(good[:50])  # truncated
    with pytest.raises(DataError, match="not an .npz archive .* truncated"):
        load_dataset(DataConfig(dataset="npz", data_path=str(path)))
    corrupt = bytearray(good)
    corrupt[200:210] = b"\xff" * 10  # inside x's data: the zip's CRC check catches it
    path.write_bytes(bytes(corrupt))
    with pytest.raises(DataError, match="not a readable .npz"):
        load_dataset(DataConfig(dataset="npz", data_path=str(path)))
    with pytest.raises(DataError, match="no such file"):
        load_dataset(DataConfig(dataset="npz", data_path=str(tmp_path / "none.npz")))


@pytest.mark.parametrize("num_samples, world_size", [(1, 1), (10, 3), (97, 4), (1000, 8),
                                                      (13107, 2)])
def test_sampler_indices_are_what_distributed_sampler_yields(num_samples, world_size):
    """epoch_batches reads the sampler's permutation from its tensor; resumes and the simulator
    depend on it dealing exactly what torch's DistributedSampler deals."""
    from torch.utils.data import DistributedSampler

    from hvdtrain.data.builtin import sampler_indices

    for rank in range(world_size):
        for epoch, seed in [(0, 0), (3, 7), (11, 12345)]:
            sampler = DistributedSampler(range(num_samples), num_replicas=world_size, rank=rank,
                                         shuffle=True, seed=seed, drop_last=True)
            sampler.set_epoch(epoch)
            ours = sampler_indices(num_samples, world_size, rank, epoch, seed)
            assert ours.tolist() == list(sampler), (rank, epoch, seed)
            assert ours.dtype == np.int64
