"""The user's own data made ready to train on (hvdtrain/data/user_data.py): numpy arrays and
dtypes of (x, y) pairs, what is said about targets that are not class labels, real-valued
targets of --dataset npz under a regression loss, and the test split held out of data without
one (--test-fraction). Every user module is written into the test's own tmp_path."""

from __future__ import annotations

import json
import pickle
import re
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from user_files import config, write

from hvdtrain.config import Config, ConfigError, DataConfig
from hvdtrain.data import DataError, load_dataset
from hvdtrain.data.folder import load_folder
from hvdtrain.data.loader import LoaderBatches
from hvdtrain.data.user_data import HeldOut, hold_out, split_indices
from hvdtrain.user_code import resolve_callable
from hvdtrain.workload import workload_from_config, workload_from_objects

CPU = torch.device("cpu")

pytestmark = pytest.mark.usefixtures("isolated_imports", "in_user_folder")  # see conftest.py


DATA = """
    import numpy as np
    import torch
    from torch.utils.data import Dataset, IterableDataset

    def arrays(n=50, x_dtype="float32", y_dtype="int64"):
        rng = np.random.default_rng(0)
        x = rng.standard_normal((n, 6)).astype(x_dtype)
        return x, (np.arange(n) % 3).astype(y_dtype)

    def numpy_pairs(x_dtype="float32", y_dtype="int64"):
        x, y = arrays(x_dtype=x_dtype, y_dtype=y_dtype)
        return (x[:40], y[:40]), (x[40:], y[40:])

    def numpy_no_test(x_dtype="float32", y_dtype="int64"):
        return arrays(x_dtype=x_dtype, y_dtype=y_dtype), None

    def tensors_f64():
        x, y = arrays()
        x = torch.from_numpy(x).double()
        return (x[:40], torch.from_numpy(y[:40])), (x[40:], torch.from_numpy(y[40:]))

    def int32_labels():
        x, y = arrays()
        return (torch.from_numpy(x), torch.from_numpy(y).int()), None

    def float_labels():
        x, y = arrays()
        return (torch.from_numpy(x), torch.from_numpy(y).float()), None

    def regression_no_test():
        x, _ = arrays()
        return (x, np.stack([x[:, 0], x[:, 1] - x[:, 2]], 1).astype("float64")), None

    def strings():
        x, _ = arrays()
        return (x, np.array(["a", "b"] * 25)), None

    class Rows(Dataset):
        num_classes = 3
        def __init__(self, n): self.n = n
        def __len__(self): return self.n
        def __getitem__(self, i): return torch.full((4,), float(i)), i % 3

    class Stream(IterableDataset):
        def __len__(self): return 30
        def __iter__(self):
            for i in range(30):
                yield torch.full((4,), float(i)), i % 3

    def rows_no_test(n=101):
        return Rows(n), None

    def rows_with_test():
        return Rows(20), Rows(7)

    def stream_no_test():
        return Stream(), None

    def needs_classes(input_shape, num_classes):
        return torch.nn.Linear(input_shape[0], num_classes)
"""


def data_config(**options) -> Config:
    """The options, with the DATA module written as data.py in the current folder."""
    write(Path.cwd() / "data.py", DATA)
    return config(**options)


# --- 1. numpy arrays ------------------------------------------------------------------------
def test_a_pair_of_numpy_arrays_is_taken_as_tensors():
    # before: "the training data is a tuple of 2 item(s); pass a pair (x, y) of tensors"
    w = workload_from_config(data_config(dataset="data.py:numpy_pairs"))
    for x, y in (w.train_data, w.test_data):
        assert isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)
    assert w.train_data[0].shape == (40, 6) and w.test_data[0].shape == (10, 6)
    assert w.input_shape == (6,) and w.num_classes == 3
    w.bind(CPU, config())
    w.check(w.build_model(), CPU)  # the built-in mlp scores a batch of them


def test_numpy_arrays_read_only_or_of_another_byte_order_are_copied_and_strings_refused():
    x = np.arange(12, dtype=">f4").reshape(6, 2)  # big-endian: torch.from_numpy refuses it
    y = np.arange(6) % 2
    y.setflags(write=False)  # a memory map, say: torch.from_numpy warns
    w = workload_from_objects(lambda: torch.nn.Linear(2, 2), (x, y), None, "cross_entropy", None)
    assert torch.equal(w.train_data[0], torch.arange(12.0).reshape(6, 2))
    assert w.train_data[1].tolist() == y.tolist()
    with pytest.raises(DataError, match=r"the training data's y is a numpy array of dtype <U1"):
        workload_from_config(data_config(dataset="data.py:strings"))


def test_a_pair_of_something_else_names_what_it_holds():
    with pytest.raises(ConfigError, match=r"is a tuple of 2 item\(s\) \(list, list\); pass a "
                                          r"pair \(x, y\) of tensors or numpy arrays"):
        workload_from_objects(lambda: torch.nn.Linear(2, 2), ([1.0], [0]), None,
                              "cross_entropy", None)


# --- 2. float64 inputs ------------------------------------------------------------------------
@pytest.mark.parametrize("dataset", ["tensors_f64", "numpy_pairs"])
def test_float64_inputs_become_float32_said_once_in_the_data_line(dataset):
    # before: "--model mlp raised RuntimeError: mat1 and mat2 must have the same dtype"
    args = {} if dataset == "tensors_f64" else {"dataset_args": '{"x_dtype": "float64"}'}
    w = workload_from_config(data_config(dataset=f"data.py:{dataset}", **args))
    assert w.train_data[0].dtype == w.test_data[0].dtype == torch.float32
    w.bind(CPU, config())
    w.check(w.build_model(), CPU)
    line = w.describe()
    assert line.count("converted x from float64 to float32") == 1, line  # both splits: once


def test_float64_stays_where_it_is_the_default_dtype():
    x, y = torch.randn(8, 2, dtype=torch.float64), torch.arange(8) % 2
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        w = workload_from_objects(lambda: torch.nn.Linear(2, 2), (x, y), None, "cross_entropy",
                                  None)
    finally:
        torch.set_default_dtype(previous)
    assert w.train_data[0].dtype == torch.float64 and w.data_notes == []


# --- 3. integer labels ------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["int32", "int16", "int8", "uint8", "uint16"])
def test_integer_labels_of_any_integer_dtype_become_int64(dtype):
    # before: the loss failed with "expected target dtype to be Long"
    w = workload_from_config(data_config(dataset="data.py:numpy_pairs",
                                         dataset_args=f'{{"y_dtype": "{dtype}"}}'))
    assert w.train_data[1].dtype == w.test_data[1].dtype == torch.int64
    assert w.num_classes == 3
    w.bind(CPU, config())
    w.check(w.build_model(), CPU)
    assert f"converted y from {dtype} to int64" in "; ".join(w.data_notes)
    output = w.build_model()(w.train_data[0][:4])
    F.cross_entropy(output, w.train_data[1][:4])  # what failed inside the loss


def test_int32_labels_of_a_tensor_pair_train_with_cross_entropy():
    w = workload_from_config(data_config(dataset="data.py:int32_labels"))
    assert w.train_data[1].dtype == torch.int64 and w.num_classes == 3
    w.bind(CPU, config())
    w.check(w.build_model(), CPU)


# --- 4. float labels: why num_classes is unknown -------------------------------------------
def test_float_labels_of_a_tensor_pair_say_why_the_classes_are_unknown():
    # before: "(give it input_shape and num_classes attributes)", which a pair cannot have
    w = workload_from_config(data_config(dataset="data.py:float_labels"))
    with pytest.raises(ConfigError) as e:
        w.build_model()
    message = str(e.value)
    assert "attributes" not in message
    assert re.search(r"the targets are float32 values shaped \(\d+,\), not integer class "
                     r"labels, so the number of classes cannot be read from them", message)
    # (N,) targets: shaped (N, 1) for a regression loss (it had said to pass --loss mse to a
    # run that did)
    assert "y.long()" in message and "shape them (N, 1) (y.unsqueeze(1))" in message
    user = workload_from_config(data_config(dataset="data.py:float_labels",
                                            model="data.py:needs_classes"))
    with pytest.raises(ConfigError, match="num_classes was not offered because the targets are "
                                          "float32 values shaped"):
        user.build_model()


def test_a_regression_loss_gives_the_builtin_model_one_output_per_target_value():
    w = workload_from_config(data_config(dataset="data.py:regression_no_test", loss="mse"))
    assert w.num_classes is None and w.num_targets == 2
    assert w.train_data[1].dtype == torch.float32  # float64 targets too: mse_loss mixes neither
    assert "converted y from float64 to float32" in "; ".join(w.data_notes)
    model = w.build_model()
    assert model(w.train_data[0][:3]).shape == (3, 2)
    w.bind(CPU, config(loss="mse"))
    w.check(model, CPU)
    assert "2 target values per sample" in w.describe()


# --- 5. --dataset npz with a regression loss -----------------------------------------------
def _npz(tmp_path, **arrays):
    path = tmp_path / "d.npz"
    np.savez(path, **arrays)
    return str(path)


@pytest.mark.parametrize("loss", ["mse", "l1", "bce_with_logits"])
@pytest.mark.parametrize("width", [1, 3])
def test_npz_takes_real_valued_targets_n_by_k_under_a_regression_loss(tmp_path, loss, width):
    # before: "y has shape (100, 1); expected one label per sample"
    rng = np.random.default_rng(0)
    path = _npz(tmp_path, x=rng.standard_normal((100, 4)),
                y=rng.random((100, width)).astype(np.float64))
    w = workload_from_config(config(dataset="npz", data_path=path, loss=loss))
    assert w.train_data[1].dtype == torch.float32 and w.train_data[1].shape == (80, width)
    assert w.num_classes is None and w.num_targets == width
    model = w.build_model()
    assert model(w.train_data[0][:2]).shape == (2, width)  # the mlp has one output per value
    w.bind(CPU, config(loss=loss))
    w.check(model, CPU)
    assert f"{width} target value{'s' if width > 1 else ''} per sample" in w.describe()


def test_npz_regression_targets_are_checked_and_class_labels_unchanged(tmp_path):
    x = np.zeros((20, 3), np.float32)
    with pytest.raises(DataError, match=r"y_test has shape \(5, 2\) but y \(20, 1\)"):
        load_dataset(DataConfig(dataset="npz", data_path=_npz(
            tmp_path, x=x, y=np.zeros((20, 1)), x_test=x[:5], y_test=np.zeros((5, 2)))),
            regression=True)
    with pytest.raises(DataError, match=r"y has shape \(20, 1, 1\); expected one target"):
        load_dataset(DataConfig(dataset="npz", data_path=_npz(tmp_path, x=x,
                                                              y=np.zeros((20, 1, 1)))),
                     regression=True)
    path = _npz(tmp_path, x=x, y=np.zeros((20, 1)))
    with pytest.raises(DataError, match=r"expected one label per sample, \(20,\); for "
                                        r"real-valued targets pass a regression loss"):
        load_dataset(DataConfig(dataset="npz", data_path=path))
    labels = _npz(tmp_path, x=x, y=np.arange(20) % 2)
    ds = load_dataset(DataConfig(dataset="npz", data_path=labels))
    assert ds.num_classes == 2 and ds.y_train.dtype == torch.int64 and ds.num_targets is None


# --- 6. --test-fraction for data without a test split ------------------------------------------
def test_test_fraction_holds_out_a_seeded_split_of_a_dataset_without_one():
    # before: "1001 train samples, no test split", whatever --test-fraction said
    cfg = data_config(dataset="data.py:rows_no_test", test_fraction=0.3, data_seed=5)
    w = workload_from_config(cfg)
    assert isinstance(w.train_data, HeldOut) and isinstance(w.test_data, HeldOut)
    assert (len(w.train_data), len(w.test_data)) == (70, 31)
    rows = set(w.train_data.indices) | set(w.test_data.indices)
    assert rows == set(range(101)) and not set(w.train_data.indices) & set(w.test_data.indices)
    again = workload_from_config(cfg)  # another rank: the same split, no collective needed
    assert again.test_data.indices == w.test_data.indices
    other = workload_from_config(data_config(dataset="data.py:rows_no_test", test_fraction=0.3,
                                             data_seed=6))
    assert other.test_data.indices != w.test_data.indices
    assert w.num_classes == 3 and w.input_shape == (4,)  # read from the user's dataset
    w.bind(CPU, cfg)
    assert w.train.name == "Rows"  # messages name the user's class, not the wrapper
    assert ("70 train / 31 test samples, input 4, 3 classes; test split held out of the "
            "training data (--test-fraction 0.3, --data-seed 5)") in w.describe()
    assert pickle.loads(pickle.dumps(w.test_data)).indices == w.test_data.indices  # to loaders


def test_test_fraction_splits_a_tensor_pair_by_rows():
    w = workload_from_config(data_config(dataset="data.py:numpy_no_test", test_fraction=0.2))
    (x, y), (tx, ty) = w.train_data, w.test_data
    assert (len(x), len(tx)) == (40, 10) and len(y) == 40 and len(ty) == 10
    whole = sorted(map(tuple, torch.cat([x, tx]).tolist()))
    original = np.random.default_rng(0).standard_normal((50, 6)).astype("float32")
    assert whole == sorted(map(tuple, torch.from_numpy(original).tolist()))
    w.bind(CPU, config())
    assert "40 train / 10 test samples" in w.describe()


def test_data_with_a_test_split_a_stream_and_test_fraction_0_are_not_split():
    w = workload_from_config(data_config(dataset="data.py:rows_with_test", test_fraction=0.5))
    assert len(w.train_data) == 20 and len(w.test_data) == 7
    assert w.data_notes == ["--test-fraction 0.5 unused: the data brings its own test split"]
    assert workload_from_config(data_config(dataset="data.py:rows_with_test")).data_notes == []
    whole = workload_from_config(data_config(dataset="data.py:rows_no_test", test_fraction=0))
    assert whole.test_data is None and len(whole.train_data) == 101
    stream = workload_from_config(data_config(dataset="data.py:stream_no_test"))
    assert stream.test_data is None
    assert "a stream is not split by --test-fraction" in "; ".join(stream.data_notes)
    alone = workload_from_objects(lambda: torch.nn.Linear(4, 3), (torch.randn(9, 4),
                                  torch.arange(9) % 3), None, "cross_entropy", None)
    assert alone.test_data is None  # fit(test_data=None) asks for no test split


def test_the_split_arithmetic_and_too_few_samples(tmp_path):
    train, test = split_indices(10, 0.3, seed=1)
    assert (len(train), len(test)) == (7, 3)  # not 4: 10 * 0.3 is 3.0000000000000004
    assert sorted(train.tolist() + test.tolist()) == list(range(10))
    assert train.tolist() == sorted(train.tolist())  # each part keeps the data's order
    assert [len(part) for part in split_indices(1001, 0.3, seed=1)] == [700, 301]
    assert torch.equal(split_indices(50, 0.2, seed=3)[1], split_indices(50, 0.2, seed=3)[1])
    assert not torch.equal(split_indices(50, 0.2, seed=3)[1], split_indices(50, 0.2, seed=4)[1])
    with pytest.raises(DataError, match=r"cannot hold out --test-fraction 0.5 of 1 sample.*"
                                        r"train set will be empty"):
        hold_out((torch.zeros(1, 2), torch.zeros(1)), 0.5, 0, "--dataset d.py:f")
    with pytest.raises(DataError, match="--test-fraction 0 holds out nothing"):
        load_dataset(DataConfig(dataset="synthetic", synthetic_samples=20, test_fraction=0))
    with pytest.raises(DataError, match="--test-fraction 0 holds out nothing"):
        load_folder(tmp_path, 0, 0)
    with pytest.raises(ConfigError, match="between 0 and 1"):
        config(test_fraction=1.0)
    assert LoaderBatches(HeldOut(torch.utils.data.TensorDataset(torch.zeros(4, 1)), [0, 1])
                         ).name == "TensorDataset"


def test_metrics_of_the_users_own_are_taken_from_files_and_reported_beside_the_builtin_ones():
    """hvdtrain train had no way to a metric of the user's own, which compare's --target and
    --stop-at offered to name (only hvdtrain.fit took metrics)."""
    write(Path.cwd() / "mine.py", """
        def top2(output, target):
            hit = (output.topk(2, dim=1).indices == target[:, None]).any(1)
            return hit.sum(), hit.numel()
    """)
    w = workload_from_config(data_config(dataset="data.py:numpy_pairs",
                                         metrics="top2=mine.py:top2"))
    assert sorted(w.metrics) == ["acc", "top2"]  # the loss's accuracy stays
    w.bind(CPU, config())
    w.check(lambda x: torch.eye(3)[torch.arange(len(x)) % 3] * 5, CPU)
    assert "top2" in w.objective().metrics
    for text, words in (("top2", "'top2' is not NAME=MODULE:CALLABLE"),
                        ("loss=mine.py:top2", "the name 'loss' is the loss's"),
                        ("a=mine.py:top2,a=mine.py:top2", "the name 'a' is given twice"),
                        ("test_x=mine.py:top2", "the name 'test_x' would be logged as "
                                                "train_test_x and test_test_x; name it 'x'")):
        with pytest.raises(ConfigError, match=f"--metrics: invalid value .*{words}"):
            Config.from_overrides({"metrics": text}).validate()
    # it replaced the built-in accuracy, acc and test_acc, without a word; free under mse
    with pytest.raises(ConfigError, match="--metrics: the name 'acc' is the built-in accuracy's"):
        workload_from_config(data_config(dataset="data.py:numpy_pairs",
                                         metrics="acc=mine.py:top2"))
    assert "acc" in workload_from_config(data_config(
        dataset="data.py:numpy_pairs", metrics="acc=mine.py:top2", loss="mse")).metrics


def test_labels_past_the_models_scores_are_refused_before_training():
    """torch's "Target 7 is out of bounds" came at the first step that drew the label, and a
    test label's only after a whole epoch."""
    x, y = torch.randn(40, 5), torch.arange(40) % 3
    test_y = torch.tensor([0, 1, 5, 2])
    w = workload_from_objects(lambda: torch.nn.Linear(5, 3), (x, y), (torch.randn(4, 5), test_y),
                              "cross_entropy", None)
    w.bind(CPU, config())
    with pytest.raises(ConfigError, match=r"^loss=cross_entropy: the labels run to 5 \(6 classes "
                                          r"in the training and test data\), and the model gives 3 "
                                          r"scores per sample; build it with 6 outputs"):
        w.check(torch.nn.Linear(5, 3), CPU)
    fits = workload_from_objects(lambda: torch.nn.Linear(5, 3), (x, y), None, "cross_entropy",
                                 None)
    fits.bind(CPU, config())
    fits.check(torch.nn.Linear(5, 3), CPU)


def test_fit_takes_metrics_as_the_command_line_writes_them():
    """fit(metrics="top2=mine.py:top2") raised a raw ValueError from dict()."""
    write(Path.cwd() / "mine.py", """
        def top2(output, target):
            hit = (output.topk(2, dim=1).indices == target[:, None]).any(1)
            return hit.sum(), hit.numel()
    """)
    pair = (torch.randn(8, 5), torch.arange(8) % 3)
    w = workload_from_objects(lambda: torch.nn.Linear(5, 3), pair, None, "cross_entropy",
                              "top2=mine.py:top2")
    assert sorted(w.metrics) == ["acc", "top2"]
    for bad, words in (("top2", "is not NAME=MODULE:CALLABLE"), ([1], "got list; pass a dict")):
        with pytest.raises(ConfigError, match=f"^metrics: .*{words}"):
            workload_from_objects(lambda: torch.nn.Linear(5, 3), pair, None, "cross_entropy", bad)


def test_a_fit_run_records_its_own_objects_and_refuses_the_built_in_shapes(tmp_path):
    """fit's header and checkpoint carried the command line's defaults (digits, mlp,
    cross_entropy) for the user's own model, data and loss; hidden= was ignored without a word
    and channels= refused as if the model were the built-in mlp."""
    import hvdtrain
    from hvdtrain.api import FIT_DATA, FIT_MODEL

    def squared(output, target):
        return ((output - target) ** 2).mean()

    x = torch.randn(32, 4)
    result = hvdtrain.fit(torch.nn.Linear(4, 1), (x, x.sum(1, keepdim=True)), epochs=1,
                          loss=squared, run_dir=str(tmp_path / "run"), progress=False)
    header = json.loads(result.log_path.read_text().splitlines()[0])
    assert header["config"]["model"]["model"] == FIT_MODEL
    assert header["config"]["data"]["dataset"] == FIT_DATA
    assert header["config"]["model"]["loss"].endswith("<locals>.squared")  # its qualified name
    saved = torch.load(result.checkpoint_path, weights_only=False)["config"]
    assert saved["model"]["model"] == FIT_MODEL and saved["model"]["loss"].endswith("squared")
    for name, value in (("hidden", "32"), ("channels", "8,8"), ("test_fraction", 0.1),
                        ("data_path", "x.npz")):
        with pytest.raises(ConfigError, match=f"^{name}=: it shapes the command line's built-in"):
            hvdtrain.fit(torch.nn.Linear(4, 1), (x, x), epochs=1, **{name: value})


def test_a_collate_function_is_taken_from_the_command_line_and_from_fit(tmp_path):
    """Samples of different lengths had no way to become a batch but padding in the dataset."""
    import hvdtrain

    code = write(tmp_path / "seqs.py", """
        import torch

        class Seqs(torch.utils.data.Dataset):
            def __len__(self):
                return 40

            def __getitem__(self, i):
                return torch.ones(i % 4 + 1), i % 2

        def load():
            return Seqs(), Seqs()

        def pad(samples):
            xs = torch.nn.utils.rnn.pad_sequence([x for x, _ in samples], batch_first=True)
            return xs[:, :1], torch.tensor([y for _, y in samples])  # one feature: Linear(1, 2)
    """)
    cfg = config(dataset=f"{code}:load", model="torch.nn:Linear", model_args='{"in_features": 1,'
                 ' "out_features": 2}', collate=f"{code}:pad")
    workload = workload_from_config(cfg)
    workload.bind(torch.device("cpu"), cfg)
    x, y = workload.train.sample()
    assert x.shape == (2, 1) and y.tolist() == [0, 1]
    train, test = resolve_callable(f"{code}:load", "--dataset")()
    result = hvdtrain.fit(torch.nn.Linear(1, 2), train, test, collate=f"{code}:pad", epochs=1,
                          batch_size=8, run_dir=str(tmp_path / "run"), progress=False)
    assert result.final["test_acc"] is not None
    header = json.loads(result.log_path.read_text().splitlines()[0])
    assert header["config"]["data"]["collate"] == "pad"
    with pytest.raises(ConfigError, match=r"--dataset digits: --collate .*a pair of tensors, "
                                          r"batched by slicing rows: drop it"):
        digits = config(collate=f"{code}:pad")
        workload_from_config(digits).bind(torch.device("cpu"), digits)
    with pytest.raises(ConfigError, match="^collate: got int; pass a function"):
        hvdtrain.fit(torch.nn.Linear(1, 2), train, collate=3)


def test_a_datasets_float64_arrays_train_and_its_text_labels_are_named(tmp_path):
    """float64 samples (numpy's default) were blamed on the model ("mat1 and mat2 must have the
    same dtype"), and label names on the loss ("'tuple' object has no attribute 'dtype'")."""
    code = write(tmp_path / "rows.py", """
        import numpy as np
        import torch

        class Rows(torch.utils.data.Dataset):
            def __init__(self, names=False):
                self.names = names

            def __len__(self):
                return 16

            def __getitem__(self, i):
                label = ["cat", "dog"][i % 2] if self.names else np.full(1, i % 2.0)
                return {"x": np.full(3, float(i))}, label

        def floats():
            return Rows(), Rows()

        def names():
            return Rows(names=True), None

        class Model(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.linear = torch.nn.Linear(3, 1)

            def forward(self, x):
                return self.linear(x)
    """)
    cfg = config(dataset=f"{code}:floats", model=f"{code}:Model", loss="mse")
    workload = workload_from_config(cfg)
    workload.bind(torch.device("cpu"), cfg)
    x, y = workload.train.sample()
    assert x["x"].dtype == torch.float32 and y.dtype == torch.float32
    model = workload.build_model()
    workload.check(lambda inputs: model(**inputs), torch.device("cpu"))  # the model takes them
    named = config(dataset=f"{code}:names", model=f"{code}:Model", loss="cross_entropy")
    workload = workload_from_config(named)
    workload.bind(torch.device("cpu"), named)
    with pytest.raises(ConfigError, match=r"the data's targets are text \('cat', \.\.\.\).*"
                                          r"return class indices 0\.\.K-1"):
        workload.check(lambda inputs: model(**inputs), torch.device("cpu"))
