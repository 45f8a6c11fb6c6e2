"""hvdtrain.workload in one process: what the command line's --model/--dataset/--loss and fit()'s
objects turn into, what a user's model factory is offered, the check on a sample batch, and fit()'s
option validation (which must fail before anything starts). Every user module is written into
the test's own tmp_path."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from user_files import config, write
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import hvdtrain
from hvdtrain.cli import build_parser, config_from_args
from hvdtrain.config import Config, ConfigError
from hvdtrain.losses import LOSSES, accuracy
from hvdtrain.workload import Workload, workload_from_config, workload_from_objects

CPU = torch.device("cpu")

pytestmark = pytest.mark.usefixtures("isolated_imports", "in_user_folder")  # see conftest.py


MODELS = """
    import torch.nn as nn

    CALLS = []

    def build(input_shape, num_classes, width=4):
        CALLS.append(("build", input_shape, num_classes, width))
        features = input_shape[0] * input_shape[1] * input_shape[2]
        return nn.Sequential(nn.Flatten(), nn.Linear(features, width), nn.ReLU(),
                             nn.Linear(width, num_classes))

    def build_plain():
        CALLS.append(("build_plain",))
        return nn.Linear(16, 3)

    def build_any(**kwargs):
        CALLS.append(("build_any", kwargs))
        return nn.Linear(16, 3)

    def regressor(input_shape):
        CALLS.append(("regressor", input_shape))
        return nn.Linear(input_shape[0], 1)

    def needs_classes(input_shape, num_classes):
        return nn.Linear(input_shape[0], num_classes)
"""

DATA = """
    import torch
    from torch.utils.data import Dataset, IterableDataset

    def images(n=40, classes=3):
        g = torch.Generator().manual_seed(0)
        x = torch.randn(n, 1, 4, 4, generator=g)
        y = torch.arange(n) % classes
        return (x[: n // 2], y[: n // 2]), (x[n // 2:], y[n // 2:])

    def labels_only_in_test():
        x = torch.randn(8, 1, 4, 4)
        return (x, torch.zeros(8, dtype=torch.long)), (x, torch.full((8,), 6))

    def regression(n=32):
        x = torch.randn(n, 5)
        return (x, x.sum(1, keepdim=True)), None

    class Rows(Dataset):
        classes = ["a", "b", "c", "d"]

        def __init__(self, n):
            self.x = torch.randn(n, 2, 3)
            self.y = torch.arange(n) % 4

        def __len__(self):
            return len(self.x)

        def __getitem__(self, i):
            return self.x[i], self.y[i]

    class Stream(IterableDataset):
        def __iter__(self):
            for i in range(20):
                yield torch.randn(6), i % 2

    def rows():
        return Rows(12), Rows(4)

    class Plain(Dataset):  # most users' own Dataset: no classes attribute
        def __init__(self, n):
            self.rows = Rows(n)

        def __len__(self):
            return len(self.rows)

        def __getitem__(self, i):
            return self.rows[i]

    def plain():
        return Plain(12), Plain(4)

    def stream():
        return Stream(), None
"""


@pytest.fixture
def user_files(tmp_path):
    models = write(tmp_path / "user_models.py", MODELS)
    data = write(tmp_path / "user_data.py", DATA)
    return models, data


def user_module(path: Path):
    """The user's module, as hvdtrain imported it (its CALLS list records the factory's calls)."""
    from hvdtrain.user_code import file_module_name
    return sys.modules[file_module_name(path)]


# -- workload_from_config ------------------------------------------------------------------------

def test_user_model_is_offered_the_shape_and_classes_of_the_users_data(user_files):
    models, data = user_files
    workload = workload_from_config(config(
        model=f"{models}:build", model_args='{"width": 7}',
        dataset=f"{data}:images", dataset_args='{"n": 40, "classes": 5}'))

    assert workload.input_shape == (1, 4, 4) and workload.num_classes == 5
    assert workload.name == f"{models}:build"
    assert workload.loss is LOSSES["cross_entropy"] and workload.loss_name == "cross_entropy"
    assert set(workload.metrics) == {"acc"}
    assert len(workload.train_data[0]) == 20 and len(workload.test_data[0]) == 20
    model = workload.build_model()
    assert user_module(models).CALLS == [("build", (1, 4, 4), 5, 7)]  # --model-args width 7
    assert model(torch.zeros(2, 1, 4, 4)).shape == (2, 5)
    assert workload.identity() == {"input_shape": [1, 4, 4], "num_classes": 5}


def test_num_classes_counts_the_labels_of_both_splits(user_files):
    models, data = user_files
    workload = workload_from_config(config(model=f"{models}:build",
                                           dataset=f"{data}:labels_only_in_test"))
    assert workload.num_classes == 7  # label 6 appears only in the test split


@pytest.mark.parametrize("factory, offered", [
    ("build_plain", ("build_plain",)),  # names neither: gets neither
    ("build_any", ("build_any", {"input_shape": (1, 4, 4), "num_classes": 3})),  # **kwargs: both
])
def test_offered_keywords_go_only_where_the_signature_takes_them(user_files, factory, offered):
    models, data = user_files
    workload = workload_from_config(config(model=f"{models}:{factory}", dataset=f"{data}:images"))
    workload.build_model()
    assert user_module(models).CALLS == [offered]


def test_float_targets_have_no_classes_and_the_shape_is_still_offered(user_files):
    models, data = user_files
    workload = workload_from_config(config(model=f"{models}:regressor", loss="mse",
                                           dataset=f"{data}:regression", test_fraction=0))
    assert workload.num_classes is None and workload.input_shape == (5,)
    assert workload.metrics == {} and workload.test_data is None
    workload.build_model()
    assert user_module(models).CALLS == [("regressor", (5,))]


def test_a_factory_that_needs_classes_the_data_cannot_tell_names_the_missing_keyword(user_files):
    models, data = user_files
    workload = workload_from_config(config(model=f"{models}:needs_classes", loss="mse",
                                           dataset=f"{data}:regression"))
    with pytest.raises(ConfigError) as e:
        workload.build_model()
    message = str(e.value)
    assert message.startswith(f"--model: {models}:needs_classes is needs_classes(")  # not given
    # no example: its only parameters are hvdtrain's, without defaults to show
    assert "num_classes" in message and "--model-args '{" not in message
    assert "num_classes was not offered because the targets are float32 values" in message
    assert "input_shape was not offered" not in message  # it was offered


def test_a_map_style_dataset_tells_its_shape_from_a_sample_and_classes_from_classes(user_files):
    models, data = user_files
    workload = workload_from_config(config(model=f"{models}:build_any", dataset=f"{data}:rows"))
    assert workload.input_shape == (2, 3) and workload.num_classes == 4
    workload.build_model()
    assert user_module(models).CALLS == [("build_any", {"input_shape": (2, 3), "num_classes": 4})]


def test_a_dataset_without_classes_says_how_to_make_num_classes_known(user_files):
    models, data = user_files
    workload = workload_from_config(config(model=f"{models}:needs_classes",
                                           dataset=f"{data}:plain"))
    assert workload.input_shape == (2, 3) and workload.num_classes is None
    with pytest.raises(ConfigError) as e:
        workload.build_model()
    message = str(e.value)
    assert message.startswith(f"--model: {models}:needs_classes is needs_classes(")  # not given
    assert ("num_classes was not offered because this dataset does not tell it (give the "
            "training dataset a num_classes or classes attribute, or pass it in --model-args)"
            ) in message

    given = workload_from_config(config(model=f"{models}:needs_classes",
                                        dataset=f"{data}:plain", model_args='{"num_classes": 4}'))
    assert given.build_model().out_features == 4


def test_a_builtin_model_on_a_stream_that_cannot_tell_its_shape(user_files):
    _, data = user_files
    workload = workload_from_config(config(model="mlp", dataset=f"{data}:stream",
                                           max_steps_per_epoch=2))
    assert workload.input_shape is None and workload.num_classes is None
    with pytest.raises(ConfigError, match=r"^--model mlp: the built-in models need the input "
                                          r"shape and the number of classes"):
        workload.build_model()


def test_a_stream_is_told_to_give_its_input_shape_not_pairs_it_is_not_read_for(user_files):
    models, data = user_files
    workload = workload_from_config(config(model=f"{models}:regressor", dataset=f"{data}:stream",
                                           max_steps_per_epoch=2))
    with pytest.raises(ConfigError) as e:
        workload.build_model()
    assert ("input_shape was not offered because this dataset does not tell it (give the "
            "training dataset an input_shape attribute, or pass it in --model-args)"
            ) in str(e.value)


def test_a_builtin_dataset_and_model_need_no_user_code():
    workload = workload_from_config(config())
    assert workload.name == "mlp" and workload.data_name == "digits"
    assert workload.input_shape == (1, 8, 8) and workload.num_classes == 10
    assert workload.train_data[0].shape == (1437, 1, 8, 8)


def test_a_user_loss_by_spec_reports_no_accuracy(tmp_path, user_files):
    models, data = user_files
    loss = write(tmp_path / "my_loss.py", """
        import torch.nn.functional as F

        def smooth(output, target):
            return F.cross_entropy(output, target, label_smoothing=0.1)
    """)
    workload = workload_from_config(config(model=f"{models}:build", dataset=f"{data}:images",
                                           loss=f"{loss}:smooth"))
    assert workload.loss_name == f"{loss}:smooth" and workload.metrics == {}
    assert workload.loss(torch.randn(4, 3), torch.tensor([0, 1, 2, 0])).ndim == 0


# -- check(): one batch through the model and the loss, before training --------------------------

def bound(workload: Workload) -> Workload:
    workload.bind(CPU, Config())
    return workload


class SequenceModel(torch.nn.Module):
    """(N, F) -> (N, T, C): a sequence model's per-step class scores."""

    def __init__(self, steps=5, classes=3):
        super().__init__()
        self.steps, self.classes = steps, classes
        self.linear = torch.nn.Linear(4, steps * classes)

    def forward(self, x):
        return self.linear(x).view(-1, self.steps, self.classes)


def sequence_loss(output, target):
    return F.cross_entropy(output.flatten(0, 1), target.flatten())


def agreement(output, target):
    """A user's metric with no shape rule: it always applies."""
    return (output.argmax(-1) == target).sum(), target.numel()


def test_check_drops_accuracy_for_a_sequence_output_and_keeps_the_users_metric():
    x, y = torch.randn(16, 4), torch.randint(0, 3, (16, 5))
    workload = bound(workload_from_objects(SequenceModel(), (x, y), None, sequence_loss,
                                           {"acc": accuracy, "agree": agreement}))
    assert set(workload.metrics) == {"acc", "agree"}
    workload.check(workload.build_model(), CPU)
    assert set(workload.metrics) == {"agree"}
    assert set(workload.objective().metrics) == {"agree"}


def test_check_keeps_accuracy_for_class_scores():
    x, y = torch.randn(16, 4), torch.randint(0, 3, (16,))
    workload = bound(workload_from_objects(torch.nn.Linear(4, 3), (x, y), None, "cross_entropy",
                                           None))
    workload.check(workload.build_model(), CPU)
    assert set(workload.metrics) == {"acc"}


def test_check_drops_accuracy_for_cross_entropy_over_time_steps():
    """Built-in cross_entropy takes (N, C, T) scores against (N, T) targets; accuracy does not."""
    x, y = torch.randn(16, 4), torch.randint(0, 3, (16, 5))
    model = torch.nn.Sequential(SequenceModel(), Transpose())
    workload = bound(workload_from_objects(model, (x, y), None, "cross_entropy", None))
    workload.check(workload.build_model(), CPU)
    assert workload.metrics == {}


class Transpose(torch.nn.Module):
    def forward(self, x):
        return x.transpose(1, 2)


def test_check_names_the_loss_and_both_shapes_when_they_do_not_fit():
    x, y = torch.randn(16, 4), torch.randn(16)
    workload = bound(workload_from_objects(torch.nn.Linear(4, 1), (x, y), None, "mse", None))
    with pytest.raises(ConfigError, match=r"^--loss mse: the model's output is \(2, 1\) "
                                          r"torch.float32 and the target \(2,\) torch.float32"):
        workload.check(workload.build_model(), CPU)


def test_check_refuses_cross_entropy_on_a_single_output_with_float_targets():
    """One output column is one class: the softmax is 1 and the loss 0 for any weights, so a
    regression run that forgot --loss mse would train nothing, silently."""
    x = torch.randn(16, 4)
    workload = bound(workload_from_objects(torch.nn.Linear(4, 1), (x, x.sum(1, keepdim=True)),
                                           None, "cross_entropy", None))
    with pytest.raises(ConfigError) as e:
        workload.check(workload.build_model(), CPU)
    message = str(e.value)
    assert message.startswith("--loss cross_entropy: the model's output is (2, 1) torch.float32 "
                              "and the target (2, 1) torch.float32")
    assert "--loss mse" in message


# -- the Python API's objects ------------------------------------------------------------------

def test_fit_objects_a_module_a_factory_and_a_dataset():
    x, y = torch.randn(10, 3, 2), torch.tensor([0, 1, 2, 3, 4] * 2)
    module = torch.nn.Linear(6, 5)
    workload = workload_from_objects(module, TensorDataset(x, y), None, "nll", None)
    assert workload.build_model() is module and workload.name == "Linear"
    assert workload.input_shape == (3, 2) and workload.num_classes is None  # no attribute
    assert set(workload.metrics) == {"acc"} and workload.loss_name == "nll"
    # a metric of the user's is added beside the accuracy, as --metrics adds it (it replaced it,
    # and --stop-at test_acc was refused)
    top = workload_from_objects(module, TensorDataset(x, y), None, "nll", {"top": len}).metrics
    assert set(top) == {"acc", "top"}

    def factory():
        return torch.nn.Linear(6, 5)
    workload = workload_from_objects(factory, (x, y), (x, y), "mse", {})
    assert workload.num_classes == 5 and workload.input_shape == (3, 2)
    assert workload.metrics == {} and workload.loss is F.mse_loss
    assert isinstance(workload.build_model(), torch.nn.Linear)


@pytest.mark.parametrize("model, train, metrics, says", [
    (3, None, None, "model: got int; pass an nn.Module, or a function"),
    (torch.nn.Linear(2, 2), 5, None, "train_data: the training data is int; pass a pair"),
    (torch.nn.Linear(2, 2), None, {"top": "yes"}, "metrics: 'top' is str"),
    (torch.nn.Linear(2, 2), None, {"acc": len}, "metrics: the name 'acc' is the built-in "
                                                "accuracy's under loss cross_entropy"),
    (torch.nn.Linear(2, 2), (torch.zeros(4, 2), torch.zeros(3)), None,
     "train_data: the training data has 4 inputs but 3 targets"),
    (torch.nn.Linear(2, 2), (torch.zeros(4, 2),), None,
     "train_data: the training data is a tuple of 1 item(s)"),
    (torch.nn.Linear(2, 2), DataLoader(TensorDataset(torch.zeros(4, 2), torch.zeros(4))), None,
     "train_data: the training data is a DataLoader; pass its dataset instead"),
])
def test_fit_objects_that_cannot_work(model, train, metrics, says):
    train = (torch.zeros(4, 2), torch.zeros(4, dtype=torch.long)) if train is None else train
    with pytest.raises(ConfigError) as e:
        workload_from_objects(model, train, None, "cross_entropy", metrics)
    assert str(e.value).startswith(says), str(e.value)


def test_a_factory_that_returns_no_module_names_it():
    def forgot_return():
        torch.nn.Linear(2, 2)
    workload = workload_from_objects(forgot_return, (torch.zeros(4, 2), torch.zeros(4)), None,
                                     "mse", None)
    with pytest.raises(ConfigError, match=r"model .*forgot_return returned None, expected a "
                                          r"torch.nn.Module.*is a return statement missing"):
        workload.build_model()


# -- fit()'s options: checked before anything starts ---------------------------------------------

DATA_PAIR = (torch.zeros(8, 2), torch.zeros(8, dtype=torch.long))


def cli_error(*flags: str) -> str:
    with pytest.raises(ConfigError) as e:
        config_from_args(build_parser().parse_args(["train", *flags]))
    return str(e.value)


@pytest.mark.parametrize("options, flags", [
    ({"batch_size": -1}, ["--batch-size", "-1"]),
    ({"lr": 0.0}, ["--lr", "0"]),
    ({"backward_passes_per_step": 3}, ["--backward-passes-per-step", "3"]),
    ({"mode": "async", "sync_batchnorm": True}, ["--mode", "async", "--sync-batchnorm"]),
])
def test_fit_rejects_a_bad_option_with_the_flags_message(options, flags):
    expected = cli_error(*flags)
    with pytest.raises(ConfigError) as e:
        hvdtrain.fit(torch.nn.Linear(2, 2), DATA_PAIR, **options)
    assert str(e.value) == expected


def test_fit_rejects_a_bad_choice_as_the_flag_would():
    with pytest.raises(ConfigError) as e:
        hvdtrain.fit(torch.nn.Linear(2, 2), DATA_PAIR, optimizer="lbfgs")
    assert str(e.value) == "--optimizer: invalid choice 'lbfgs'; choose one of sgd, adam, adamw"


def test_fit_epochs_0_is_the_command_lines_message():
    with pytest.raises(ConfigError) as e:
        hvdtrain.fit(torch.nn.Linear(2, 2), DATA_PAIR, epochs=0)
    assert str(e.value) == cli_error("--epochs", "0")
    assert str(e.value) == ("--epochs: invalid value 0; train for at least one epoch, "
                            "e.g. --epochs 10")


def test_fit_unknown_option_lists_the_valid_ones():
    with pytest.raises(ConfigError) as e:
        hvdtrain.fit(torch.nn.Linear(2, 2), DATA_PAIR, epoch=3)
    message = str(e.value)
    assert message.startswith("unknown option 'epoch' (did you mean epochs?); "
                              "valid options are: ")
    listed = message.split("valid options are: ")[1].split(", ")
    assert {"epochs", "batch_size", "mode", "data_workers", "sync_batchnorm"} <= set(listed)
    assert not {"dataset", "dataset_args", "model", "loss"} & set(listed)  # fit refuses them
    assert listed == sorted(listed)


@pytest.mark.parametrize("name", ["dataset", "model_args", "dataset_args"])
def test_fit_takes_objects_not_spec_options(name):
    with pytest.raises(ConfigError, match=rf"^{name}=: fit\(\) takes the model, the data and the "
                                          "loss as objects"):
        hvdtrain.fit(torch.nn.Linear(2, 2), DATA_PAIR, **{name: "x"})


def test_fit_options_override_a_config_and_are_checked():
    with pytest.raises(ConfigError, match=r"^--epochs: invalid value 0"):
        hvdtrain.fit(torch.nn.Linear(2, 2), DATA_PAIR, config=Config(), epochs=0)
    with pytest.raises(ConfigError, match=r"^config: got dict; pass a hvdtrain.config.Config"):
        hvdtrain.fit(torch.nn.Linear(2, 2), DATA_PAIR, config={"epochs": 2})


def test_the_data_line_counts_the_splits_and_says_where_there_is_no_test_split():
    x, y = torch.randn(40, 3), torch.arange(40) % 2
    both = workload_from_objects(lambda: torch.nn.Linear(3, 2), (x[:30], y[:30]),
                                 (x[30:], y[30:]), "cross_entropy", None)
    alone = workload_from_objects(lambda: torch.nn.Linear(3, 2), (x, y), None,
                                  "cross_entropy", None)
    for w in (both, alone):
        w.bind(CPU, config())
    assert "30 train / 10 test samples" in both.describe()
    # before: "40 train, no test split samples"
    assert "40 train samples, no test split" in alone.describe()
