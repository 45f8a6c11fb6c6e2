"""What is trained: the model, the training and test data, the loss and the metrics, as one
object that the command line and the Python API both build, and that the trainer, the replica
and both schemes consume. Nothing below it knows whether a piece is built in or the user's own.

A piece named on the command line is a built-in name (``--model mlp``, ``--dataset digits``,
``--loss mse``) or the user's ``MODULE:CALLABLE``, where MODULE is a dotted import path or a
``.py`` file (user_code.py resolves it and reports the user's errors).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn as nn
from torch.utils.data import Dataset as TorchDataset
from torch.utils.data import IterableDataset

from .config import Config, ConfigError
from .data import builtin
from .data.batches import BatchSource, to_device
from .data.in_memory import InMemoryBatches
from .data.loader import LoaderBatches
from .losses import check_loss_accepts, default_metrics, metric_applies, resolve_loss
from .models import MODELS, build_model
from .replica import Metric, Objective
from .user_code import (call_user, call_with_known_kwargs, expect_type, parse_json_args,
                        resolve_callable)

BUILTIN_DATASETS = (*builtin.DATASETS, "folder")


@dataclass
class Workload:
    name: str                              # the model's name: logs and checkpoint identity
                                           # ("": the built model's class name)
    build_model: Callable[[], nn.Module]   # called on every rank after seeding
    train_data: Any                        # (x, y) tensors, a Dataset or an IterableDataset
    test_data: Any | None
    loss: Callable[[Any, Any], torch.Tensor]
    loss_name: str
    metrics: dict[str, Metric] = field(default_factory=dict)
    data_name: str = "data"
    input_shape: tuple[int, ...] | None = None
    num_classes: int | None = None
    origin: str = "train_data"             # where the data came from, for error messages
    from_command_line: bool = False
    train: BatchSource | None = None       # set by bind(), once the device is known
    test: BatchSource | None = None

    def bind(self, device: torch.device, cfg: Config) -> None:
        """Make the batch sources that feed ``device``."""
        try:
            self.train = batch_source(self.train_data, device, cfg)
            self.test = (batch_source(self.test_data, device, cfg)
                         if self.test_data is not None else None)
        except ConfigError as e:  # name the data's origin: the user's --dataset, say
            raise ConfigError(f"{self.origin}: {e}") from None

    def close(self) -> None:
        for source in (self.train, self.test):
            if source is not None:
                source.close()

    def objective(self) -> Objective:
        return Objective(self.loss, self.metrics)

    def describe(self) -> str:
        test = f" / {self.test.num_samples} test" if self.test is not None else ", no test split"
        shape = (f", input {'x'.join(map(str, self.input_shape))}" if self.input_shape else "")
        classes = f", {self.num_classes} classes" if self.num_classes else ""
        return (f"{self.data_name}: {self.train.num_samples} train{test} samples{shape}"
                f"{classes}")

    def identity(self) -> dict[str, Any]:
        return {"input_shape": list(self.input_shape) if self.input_shape else None,
                "num_classes": self.num_classes}

    def check(self, forward: Callable[[Any], Any], device: torch.device) -> None:
        """Score one small batch before training, so a model, data and loss that do not fit
        together fail at once with a message, on every rank alike. Metrics that do not apply
        to this output (accuracy of a sequence model) are dropped."""
        x, y = self.train.sample()
        flag = "--model" if self.from_command_line else "model"
        output = call_user(forward, flag, self.name, to_device(x, device))
        y = to_device(y, output.device if isinstance(output, torch.Tensor) else device)
        check_loss_accepts(self.loss, self.loss_name, output, y)
        self.metrics = {name: m for name, m in self.metrics.items()
                        if metric_applies(name, output, y)}


# --- from the command line ---------------------------------------------------------------------
def workload_from_config(cfg: Config) -> Workload:
    """The workload the options name; ConfigError or DataError for what cannot work."""
    data = {"origin": f"--dataset {cfg.data.dataset}", **load_training_data(cfg)}
    loss, loss_name = resolve_loss(cfg.model.loss)
    model_spec = cfg.model.model
    return Workload(name=model_spec, build_model=model_factory(cfg, data), loss=loss,
                    loss_name=loss_name, metrics=default_metrics(loss_name),
                    from_command_line=True, **data)


def load_training_data(cfg: Config) -> dict[str, Any]:
    d = cfg.data
    if d.dataset in builtin.DATASETS:
        ds = builtin.load_dataset(d)
        return dict(train_data=(ds.x_train, ds.y_train), test_data=(ds.x_test, ds.y_test),
                    data_name=ds.name, input_shape=ds.input_shape, num_classes=ds.num_classes)
    if d.dataset == "folder":
        from .data.folder import load_folder

        train, test = load_folder(d.data_path, d.test_fraction, d.data_seed)
        return dict(train_data=train, test_data=test, data_name=f"folder {d.data_path}",
                    input_shape=tuple(train.input_shape), num_classes=train.num_classes)
    fn = resolve_callable(d.dataset, "--dataset", builtins=BUILTIN_DATASETS)
    result = call_with_known_kwargs(fn, "--dataset", d.dataset,
                                    parse_json_args(d.dataset_args, "--dataset-args"), {})
    if not (isinstance(result, (tuple, list)) and len(result) == 2):
        got = "None" if result is None else f"a {type(result).__name__}"
        raise ConfigError(f"--dataset {d.dataset} returned {got}, expected a pair (train, test); "
                          "return (train, test) where each is a Dataset, an IterableDataset or "
                          "an (x, y) pair of tensors, and test may be None")
    train, test = result
    return dict(describe_data(train, test, d.dataset, f"--dataset {d.dataset}"),
                origin=f"--dataset {d.dataset}")


def describe_data(train: Any, test: Any, name: str, where: str) -> dict[str, Any]:
    """Check the user's training and test data, and learn what a model factory may be offered:
    the input shape and the number of classes, where they can be known."""
    check_data(train, where, "the training data")
    if test is not None:
        check_data(test, where, "the test data")
    input_shape = num_classes = None
    if isinstance(train, (tuple, list)):
        x, y = train
        input_shape = tuple(x.shape[1:])
        if not y.dtype.is_floating_point and y.dim() == 1 and len(y):
            ys = [y] + ([test[1]] if isinstance(test, (tuple, list)) else [])
            num_classes = int(max(int(t.max()) for t in ys)) + 1
    else:
        num_classes = getattr(train, "num_classes", None)
        if num_classes is None and hasattr(train, "classes"):
            num_classes = len(train.classes)
        shape = getattr(train, "input_shape", None)
        if shape is None and not isinstance(train, IterableDataset):
            first = call_user(train.__getitem__, where, "__getitem__", 0)
            if isinstance(first, (tuple, list)) and isinstance(first[0], torch.Tensor):
                shape = first[0].shape
        input_shape = tuple(shape) if shape is not None else None
    return dict(train_data=train, test_data=test, data_name=name, input_shape=input_shape,
                num_classes=num_classes)


def check_data(data: Any, where: str, what: str) -> None:
    if isinstance(data, (tuple, list)):
        if len(data) != 2 or not all(isinstance(t, torch.Tensor) for t in data):
            raise ConfigError(f"{where}: {what} is a {type(data).__name__} of "
                              f"{len(data)} item(s); pass a pair (x, y) of tensors, a Dataset "
                              "or an IterableDataset")
        x, y = data
        if len(x) != len(y):
            raise ConfigError(f"{where}: {what} has {len(x)} inputs but {len(y)} targets; "
                              "x and y must hold one row per sample")
        return
    if isinstance(data, torch.utils.data.DataLoader):
        raise ConfigError(f"{where}: {what} is a DataLoader; pass its dataset instead "
                          "(hvdtrain builds the loader, so that every worker gets its own "
                          "shard): use --batch-size and --data-workers for its settings")
    if isinstance(data, (str, bytes, dict)) or not isinstance(
            data, (TorchDataset, IterableDataset)) and not (
            hasattr(data, "__getitem__") and hasattr(data, "__len__")):
        raise ConfigError(f"{where}: {what} is {type(data).__name__}; pass a pair (x, y) of "
                          "tensors, a torch Dataset or an IterableDataset")


def model_factory(cfg: Config, data: dict[str, Any]) -> Callable[[], nn.Module]:
    spec = cfg.model.model
    shape, classes = data["input_shape"], data["num_classes"]
    if spec in MODELS:
        def build_builtin() -> nn.Module:
            if shape is None or classes is None:
                raise ConfigError(f"--model {spec}: the built-in models need the input shape "
                                  "and the number of classes, which this dataset does not tell "
                                  "(give it input_shape and num_classes attributes, or pass "
                                  "your own --model MODULE:CALLABLE)")
            return build_model(spec, shape, classes, cfg.model)
        return build_builtin
    fn = resolve_callable(spec, "--model", builtins=MODELS)
    explicit = parse_json_args(cfg.model.model_args, "--model-args")
    offered = {k: v for k, v in (("input_shape", shape), ("num_classes", classes)) if v is not None}
    how = {"input_shape": "this dataset does not tell it (give the training dataset an "
                          "input_shape attribute, or items that are (input tensor, target) pairs, "
                          "or pass it in --model-args)",
           "num_classes": "this dataset does not tell it (give the training dataset a "
                          "num_classes or classes attribute, or pass it in --model-args)"}
    unlearned = {k: v for k, v in how.items() if k not in offered}

    def build_user() -> nn.Module:
        model = call_with_known_kwargs(fn, "--model", spec, explicit, offered,
                                       unlearned=unlearned)
        expect_type(model, nn.Module, "--model", spec, "the model instance (an nn.Module)")
        return model
    return build_user


# --- from the Python API -----------------------------------------------------------------------
def workload_from_objects(model: Any, train_data: Any, test_data: Any, loss: Any,
                          metrics: dict[str, Metric] | None) -> Workload:
    label = "tensors" if isinstance(train_data, (tuple, list)) else type(train_data).__name__
    data = describe_data(train_data, test_data, label, "train_data")
    loss_fn, loss_name = resolve_loss(loss)
    if isinstance(model, nn.Module):
        name = type(model).__name__
        build = lambda: model  # noqa: E731  every rank passed its own instance
    elif callable(model):
        name = ""  # named after the class of the model it builds (see launch.run)

        def build() -> nn.Module:
            what = getattr(model, "__qualname__", type(model).__name__)
            built = call_user(model, "model", what)
            expect_type(built, nn.Module, "model", what, "the model instance (an nn.Module)")
            return built
    else:
        raise ConfigError(f"model: got {type(model).__name__}; pass an nn.Module, or a "
                          "function with no arguments that returns one")
    chosen = dict(default_metrics(loss_name)) if metrics is None else dict(metrics)
    for metric_name, metric in chosen.items():
        if not callable(metric):
            raise ConfigError(f"metrics: {metric_name!r} is {type(metric).__name__}; pass "
                              "callables metric(output, target) -> (sum, count)")
    return Workload(name=name, build_model=build, loss=loss_fn, loss_name=loss_name,
                    metrics=chosen, **data)


def batch_source(data: Any, device: torch.device, cfg: Config) -> BatchSource:
    if isinstance(data, (tuple, list)):
        return InMemoryBatches(data[0], data[1], device)
    return LoaderBatches(data, device, data_workers=cfg.data.data_workers, seed=cfg.run.seed,
                         stream_steps=cfg.run.max_steps_per_epoch or None)
