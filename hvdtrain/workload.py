"""What is trained: the model, the training and test data, the loss and the metrics, as one
object that the command line and the Python API both build, and that the trainer, the replica
and both schemes consume. Nothing below it knows whether a piece is built in or the user's own.

A piece named on the command line is a built-in name (``--model mlp``, ``--dataset digits``,
``--loss mse``) or the user's ``MODULE:CALLABLE``, where MODULE is a dotted import path or a
``.py`` file (user_code.py resolves it and reports the user's errors).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn as nn
from torch.utils.data import Dataset as TorchDataset
from torch.utils.data import IterableDataset

from .config import Config, ConfigError
from .data import DataError, builtin
from .data.batches import BatchSource, to_device
from .data.in_memory import InMemoryBatches
from .data.loader import LoaderBatches, UnstackableSamples
from .data.user_data import (conversion_note, hold_out, is_array, own_split_note, ready_pair,
                             targets_without_classes)
from .losses import (check_loss_accepts, check_metric_returns, check_scores_cover_labels,
                     default_metrics, integer_labels, metric_applies, resolve_loss,
                     resolve_metrics)
from .models import MODELS, build_model
from .replica import Metric, Objective
from .user_code import (UserCodeError, call_user, call_with_known_kwargs, expect_type,
                        parse_json_args, resolve_callable)

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
    classes_unknown: str | None = None     # why num_classes could not be learned, when known
    num_targets: int | None = None         # values per sample of (N, k) real-valued targets
    data_notes: list[str] = field(default_factory=list)  # conversions, a held-out test split
    origin: str = "train_data"             # where the data came from, for error messages
    from_command_line: bool = False
    collate: Callable[[list], Any] | None = None  # a batch of Dataset samples (--collate)
    train: BatchSource | None = None       # set by bind(), once the device is known
    test: BatchSource | None = None

    def bind(self, device: torch.device, cfg: Config) -> None:
        """Make the batch sources that feed ``device``."""
        try:
            self.train = batch_source(self.train_data, device, cfg, self.collate)
        except ConfigError as e:  # name the data's origin: the user's --dataset, say
            raise ConfigError(f"{self.origin}: {e}") from None
        try:
            self.test = (batch_source(self.test_data, device, cfg, self.collate)
                         if self.test_data is not None else None)
        except ConfigError as e:
            raise ConfigError(f"{origin_of_test_data(self.origin)}: {e}") from None

    def close(self) -> None:
        for source in (self.train, self.test):
            if source is not None:
                source.close()

    def objective(self) -> Objective:
        return Objective(self.loss, self.metrics)

    def describe(self) -> str:
        def count(source: Any) -> str:  # a stream without __len__ has no count
            return "?" if source.num_samples is None else str(source.num_samples)

        samples = (f"{count(self.train)} train / {count(self.test)} test samples"
                   if self.test is not None else
                   f"{count(self.train)} train samples, no test split")
        shape = (f", input {'x'.join(map(str, self.input_shape))}" if self.input_shape else "")
        plural = "s" if (self.num_targets or 0) > 1 else ""
        classes = (f", {self.num_classes} classes" if self.num_classes else
                   f", {self.num_targets} target value{plural} per sample" if self.num_targets
                   else "")
        notes = "".join(f"; {note}" for note in self.data_notes)
        return f"{self.data_name}: {samples}{shape}{classes}{notes}"

    def identity(self) -> dict[str, Any]:
        return {"input_shape": list(self.input_shape) if self.input_shape else None,
                "num_classes": self.num_classes}

    def check(self, forward: Callable[[Any], Any], device: torch.device) -> None:
        """Score one small batch before training, so a model, data and loss that do not fit
        together fail at once with a message, on every rank alike. Metrics that do not apply
        to this output (accuracy of a sequence model) are dropped."""
        x, y = self._sample(self.train, "training")
        flag = "--model" if self.from_command_line else "model"
        output = call_user(forward, flag, self.name, to_device(x, device))
        y = to_device(y, output.device if isinstance(output, torch.Tensor) else device)
        check_loss_accepts(self.loss, self.loss_name, output, y)
        check_scores_cover_labels(self.num_classes, self.loss_name, output,
                                  self.from_command_line)
        self.metrics = {name: m for name, m in self.metrics.items()
                        if metric_applies(m, output, y)}
        for name, metric in self.metrics.items():
            check_metric_returns(name, metric, output, y)
        if self.test is not None:  # else a whole epoch trains before the evaluation crashes
            self._check_test_batch(forward, device, flag, (x, y))

    def _sample(self, source: BatchSource, split: str) -> tuple[Any, Any]:
        try:
            return source.sample()
        except UnstackableSamples as e:  # the first batch already: say which split
            raise DataError(f"{self.origin}, the {split} data: {e}") from None

    def _check_test_batch(self, forward: Callable[[Any], Any], device: torch.device, flag: str,
                          train_batch: tuple[Any, Any]) -> None:
        """Score one test batch too. Test samples may differ in shape on purpose (a larger image
        for a convolutional model), so a difference is named only when the batch fails."""
        tx, ty = self._sample(self.test, "test")
        try:
            output = call_user(forward, flag, self.name, to_device(tx, device))
            ty = to_device(ty, output.device if isinstance(output, torch.Tensor) else device)
            check_loss_accepts(self.loss, self.loss_name, output, ty)
        except ConfigError as e:  # the training batch passed: the test split is what differs
            differs = [f"the test {what} are {describe_samples(got)} per sample, the training "
                       f"{what} {describe_samples(want)}"
                       for what, got, want in (("inputs", tx, train_batch[0]),
                                               ("targets", ty, train_batch[1]))
                       if sample_shapes(got) != sample_shapes(want)]
            error = ConfigError(
                f"{self.origin}: a batch of the test split fails where one of the training split "
                f"passes ({'; '.join(differs) or 'their shapes agree'}): {e}; give the test "
                "split samples like the training split's (shapes, dtypes, label range)")
            error.user_traceback = getattr(e, "user_traceback", None)
            raise error from e


def sample_shapes(batch: Any) -> Any:
    """The shape of one sample of a batch (a tensor, or tensors nested in tuples, lists and
    dicts), without the batch dimension: what must agree between the training and test splits."""
    if isinstance(batch, torch.Tensor):
        return tuple(batch.shape[1:])
    if isinstance(batch, dict):
        return {k: sample_shapes(v) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return tuple(sample_shapes(v) for v in batch)
    return type(batch).__name__


def describe_samples(batch: Any) -> str:
    shapes = sample_shapes(batch)
    if isinstance(shapes, tuple) and all(isinstance(n, int) for n in shapes):
        return f"of shape {shapes}" if shapes else "scalars"
    return f"shaped {shapes}"


# --- from the command line ---------------------------------------------------------------------
def workload_from_config(cfg: Config) -> Workload:
    """The workload the options name; ConfigError or DataError for what cannot work."""
    data = {"origin": f"--dataset {cfg.data.dataset}", **load_training_data(cfg)}
    loss, loss_name = resolve_loss(cfg.model.loss)
    model_spec = cfg.model.model
    metrics = resolve_metrics(cfg.model.metrics, "--metrics", loss_name)
    collate = resolve_callable(cfg.data.collate, "--collate") if cfg.data.collate else None
    return Workload(name=model_spec, build_model=model_factory(cfg, data), loss=loss,
                    loss_name=loss_name, metrics=metrics, from_command_line=True,
                    collate=collate, **data)


def load_training_data(cfg: Config) -> dict[str, Any]:
    d = cfg.data
    if d.dataset in BUILTIN_DATASETS and parse_json_args(d.dataset_args, "--dataset-args"):
        raise ConfigError(f"--dataset-args is for your own --dataset MODULE:CALLABLE; the "
                          f"built-in {d.dataset} would ignore it. Its settings are flags "
                          "(--data-path, --test-fraction, --data-seed, --synthetic-samples, "
                          "--synthetic-shape, --synthetic-classes): use those, or drop "
                          "--dataset-args")
    if d.dataset in builtin.DATASETS:
        ds = builtin.load_dataset(d, regression=cfg.model.loss in builtin.REGRESSION_LOSSES)
        return dict(train_data=(ds.x_train, ds.y_train), test_data=(ds.x_test, ds.y_test),
                    data_name=ds.name, input_shape=ds.input_shape, num_classes=ds.num_classes,
                    num_targets=ds.num_targets,
                    data_notes=own_split_note(d.test_fraction) if ds.own_test_split else [])
    if d.dataset == "folder":
        from .data.folder import FolderSubset, load_folder

        train, test = load_folder(d.data_path, d.test_fraction, d.data_seed)
        own = not isinstance(test, FolderSubset)  # test/ beside train/, not held out
        return dict(train_data=train, test_data=test, data_name=f"folder {d.data_path}",
                    input_shape=tuple(train.input_shape), num_classes=train.num_classes,
                    data_notes=own_split_note(d.test_fraction) if own else [])
    fn = resolve_callable(d.dataset, "--dataset", builtins=BUILTIN_DATASETS)
    result = call_with_known_kwargs(fn, "--dataset", d.dataset,
                                    parse_json_args(d.dataset_args, "--dataset-args"), {})
    if not (isinstance(result, (tuple, list)) and len(result) == 2):
        got = "None" if result is None else f"a {type(result).__name__}"
        raise ConfigError(f"--dataset {d.dataset} returned {got}, expected a pair (train, test); "
                          "return (train, test) where each is a Dataset, an IterableDataset or "
                          "an (x, y) pair of tensors, and test may be None")
    train, test = result
    if is_array(train) and is_array(test):
        raise ConfigError(f"--dataset {d.dataset} returned two tensors, which read as (train, "
                          f"test) = (x, y): one pair (x, y) of {tuple(train.shape)} and "
                          f"{tuple(test.shape)}; return ((x_train, y_train), (x_test, y_test)), "
                          "or ((x, y), None) to hold out --test-fraction of it for testing")
    data = describe_data(train, test, d.dataset, f"--dataset {d.dataset}",
                         sparse_labels=d.sparse_labels)
    if test is None:  # --test-fraction applies to any dataset without a test split
        data["train_data"], data["test_data"], held = hold_out(
            data["train_data"], d.test_fraction, d.data_seed, f"--dataset {d.dataset}")
        data["data_notes"] += held
    else:
        data["data_notes"] += own_split_note(d.test_fraction)
    return dict(data, origin=f"--dataset {d.dataset}")


def origin_of_test_data(where: str) -> str:
    """Where the test data came from: fit()'s test_data where its training data is train_data;
    the one --dataset that gave both."""
    return "test_data" if where == "train_data" else where


def describe_data(train: Any, test: Any, name: str, where: str,
                  sparse_labels: bool = False) -> dict[str, Any]:
    """Check the user's training and test data, and learn what a model factory may be offered:
    the input shape and the number of classes, where they can be known. (x, y) pairs come back
    as tensors of the dtypes the models and losses take (data/user_data.py)."""
    train, converted = ready_pair(train, where, "the training data")
    test_where = origin_of_test_data(where)
    test, converted_test = ready_pair(test, test_where, "the test data")
    check_data(train, where, "the training data")
    if test is not None:
        check_data(test, test_where, "the test data")
        if isinstance(test, IterableDataset):
            test = FirstSamples(test, test_where)
    input_shape = num_classes = classes_unknown = num_targets = None
    if isinstance(train, (tuple, list)):
        x, y = train
        input_shape = tuple(x.shape[1:])
        if integer_labels(y.dtype) and y.dim() == 1 and len(y):
            ys = [y] + ([test[1]] if isinstance(test, (tuple, list)) else [])
            num_classes, classes_unknown = classes_of_labels(ys, sparse_labels)
        else:
            num_targets, classes_unknown = targets_without_classes(y)
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
                num_classes=num_classes, classes_unknown=classes_unknown,
                num_targets=num_targets, data_notes=conversion_note(converted + converted_test))


def classes_of_labels(labels: list[torch.Tensor], sparse_ok: bool) -> tuple[int | None, str | None]:
    """(max label + 1, None) for integer targets that look like class indices 0..K-1, else
    (None, why not). Integer targets need not be classes (a user's own loss may read them
    otherwise), so implausible ones are not refused here: they are only not offered as
    num_classes, and a model that needs it is told why. Offered, a label of 2**40 made the
    built-in models ask the allocator for a 2**40-wide output layer."""
    flat = torch.cat([t.reshape(-1) for t in labels])
    low, high = (int(v) for v in flat.aminmax())
    if 0 <= low and high < builtin.MAX_UNUSED_CLASSES:
        return high + 1, None  # too few classes to be implausible: no need to sort them all
    values = flat.unique()
    used = len(values)
    if low < 0:
        return None, (f"the integer targets include negative values (the smallest is {low}), "
                      "so they are not class indices 0..K-1 (renumber them, or pass "
                      "num_classes in --model-args)")
    if high + 1 - used > max(used, builtin.MAX_UNUSED_CLASSES) and not sparse_ok:
        return None, (f"the labels go up to {high} but only {used} distinct ones occur (renumber "
                      f"them 0..{used - 1}, e.g. torch.unique(y, return_inverse=True), or pass "
                      "--sparse-labels if the unused classes are meant)")
    return high + 1, None


def check_data(data: Any, where: str, what: str) -> None:
    empty_fix = ("give it samples" if what == "the training data" else
                 "give it samples, or pass None as the test data to train without evaluating")
    if isinstance(data, (tuple, list)):
        if len(data) != 2 or not all(isinstance(t, torch.Tensor) for t in data):
            kinds = f" ({', '.join(type(t).__name__ for t in data)})" if 0 < len(data) < 4 else ""
            raise ConfigError(f"{where}: {what} is a {type(data).__name__} of {len(data)} "
                              f"item(s){kinds}; pass a pair (x, y) of tensors or numpy "
                              "arrays, a Dataset or an IterableDataset")
        x, y = data
        if x.dim() == 0 or y.dim() == 0:
            raise ConfigError(f"{where}: {what} holds a 0-dimensional tensor; x and y must hold "
                              "one row per sample")
        if len(x) != len(y):
            raise ConfigError(f"{where}: {what} has {len(x)} inputs but {len(y)} targets; "
                              "x and y must hold one row per sample")
        if len(x) == 0:
            raise ConfigError(f"{where}: {what} holds no samples; {empty_fix}")
        return
    if is_array(data):
        raise ConfigError(f"{where}: {what} is a single array {tuple(data.shape)}; pass a pair "
                          "(x, y) of tensors (inputs and targets), a Dataset or an "
                          "IterableDataset")
    if isinstance(data, torch.utils.data.DataLoader):
        raise ConfigError(f"{where}: {what} is a DataLoader; pass its dataset instead "
                          "(hvdtrain builds the loader, so that every worker gets its own "
                          "shard): use --batch-size and --data-workers for its settings")
    if isinstance(data, (str, bytes, dict)) or not isinstance(
            data, (TorchDataset, IterableDataset)) and not (
            hasattr(data, "__getitem__") and hasattr(data, "__len__")):
        raise ConfigError(f"{where}: {what} is {type(data).__name__}; pass a pair (x, y) of "
                          "tensors, a torch Dataset or an IterableDataset")
    if isinstance(data, IterableDataset):
        return  # a stream may be endless: its length, if any, is for the loader to ask
    try:
        size = len(data)
    except TypeError:  # torch's Dataset declares no __len__; the loader needs one to shard
        raise ConfigError(f"{where}: {what} is a map-style Dataset ({type(data).__name__}) "
                          "without __len__, so it cannot be split among the workers; define "
                          "__len__ returning the number of samples, or make it an "
                          "IterableDataset (and pass --max-steps-per-epoch)") from None
    except Exception as e:
        raise UserCodeError(where, f"{type(data).__name__}.__len__", e) from e
    if size == 0:
        raise ConfigError(f"{where}: {what} ({type(data).__name__}) holds no samples; "
                          f"{empty_fix}")


class FirstSamples(IterableDataset):
    """A test stream cut at its __len__. An evaluation reads a stream to its end, so an endless
    one (a generator of fresh samples, say) evaluated forever, deaf to SIGTERM, which is handled
    between steps; a stream without __len__ has no end to cut at and is refused."""

    def __init__(self, stream: IterableDataset, where: str):
        try:
            self.size = len(stream)
        except TypeError:
            raise ConfigError(
                f"{where}: the test data is a stream ({type(stream).__name__}) without __len__, "
                "so an evaluation cannot tell where it ends (an endless one never would); give "
                "it __len__ returning the number of test samples (the evaluation reads that "
                "many), or pass the test split as a map-style Dataset or (x, y) tensors") from None
        self.stream = stream
        self.name = type(stream).__name__

    def __len__(self) -> int:
        return self.size

    def __iter__(self):
        return itertools.islice(iter(self.stream), self.size)


def model_factory(cfg: Config, data: dict[str, Any]) -> Callable[[], nn.Module]:
    spec = cfg.model.model
    shape, classes = data["input_shape"], data["num_classes"]
    classes_unknown = data.get("classes_unknown")
    if spec in MODELS:
        classes = classes or builtin.regression_outputs(cfg.model.loss, data.get("num_targets"))
        if parse_json_args(cfg.model.model_args, "--model-args"):
            raise ConfigError(f"--model-args is for your own --model MODULE:CALLABLE; the "
                              f"built-in {spec} would ignore it. Its sizes are flags (--hidden "
                              "for mlp, --channels for cnn): use those, or drop --model-args")

        def build_builtin() -> nn.Module:
            if shape is None or classes is None:
                missing = " and ".join(name for name, value in (("the input shape", shape), (
                    "the number of classes", classes)) if value is None)
                why = (f"; {classes_unknown}" if classes is None and classes_unknown else
                       " (give it input_shape and num_classes attributes)")
                raise ConfigError(f"--model {spec}: the built-in models need the input shape and "
                                  f"the number of classes, and this dataset does not tell "
                                  f"{missing}{why}; or pass your own --model MODULE:CALLABLE")
            try:
                model = build_model(spec, shape, classes, cfg.model)
            except (MemoryError, RuntimeError) as e:  # torch's allocator raises RuntimeError
                if not isinstance(e, MemoryError) and "alloc" not in str(e):
                    raise
                raise ConfigError(
                    f"--model {spec}: its layers for input {'x'.join(map(str, shape))} and "
                    f"{classes:,} classes do not fit in memory ({str(e).splitlines()[0]}); "
                    f"check the labels (a {classes:,}-way classifier is built because the "
                    f"largest label is {classes - 1:,}: renumber them 0..K-1) and the model "
                    "options (--hidden, --channels)") from None
            return checked_trainable(model, "--model", spec)
        return build_builtin
    fn = resolve_callable(spec, "--model", builtins=MODELS)
    explicit = parse_json_args(cfg.model.model_args, "--model-args")
    offered = {k: v for k, v in (("input_shape", shape), ("num_classes", classes)) if v is not None}
    unlearned = {k: v for k, v in _why_not_offered(data).items() if k not in offered}

    def build_user() -> nn.Module:
        model = call_with_known_kwargs(fn, "--model", spec, explicit, offered,
                                       unlearned=unlearned)
        expect_type(model, nn.Module, "--model", spec, "the model instance (an nn.Module)")
        return checked_trainable(model, "--model", spec)
    return build_user


def _why_not_offered(data: dict[str, Any]) -> dict[str, str]:
    """What a user's model is told where the data did not tell its input_shape or
    num_classes."""
    # a stream (IterableDataset) is not read ahead for its first item, as a Dataset is
    pairs = ("" if isinstance(data["train_data"], IterableDataset) else
             "items that are (input tensor, target) pairs, ")
    return {"input_shape": "this dataset does not tell it (give the training dataset an "
                           f"input_shape attribute, {pairs}or pass it in --model-args)",
            "num_classes": data.get("classes_unknown") or
                           "this dataset does not tell it (give the training dataset a "
                           "num_classes or classes attribute, or pass it in --model-args)"}


def checked_trainable(model: nn.Module, flag: str, spec: str) -> nn.Module:
    """The model, if it has a parameter to train. Without one, sync training crashed inside
    Horovod and async training blamed the parameter server."""
    params = list(model.parameters())
    if any(p.requires_grad for p in params):
        return model
    if params:
        problem = (f"all {len(params)} of its parameter tensors are frozen (requires_grad=False)"
                   "; unfreeze the layers to train, e.g. p.requires_grad_(True)")
    else:
        problem = ("it has no parameters; give it layers with weights, assigned as attributes "
                   "(layers kept in a plain list are not registered: use nn.ModuleList)")
    raise ConfigError(f"{flag} {spec}: the model has nothing to train: {problem}")


# --- from the Python API -----------------------------------------------------------------------
def workload_from_objects(model: Any, train_data: Any, test_data: Any, loss: Any,
                          metrics: dict[str, Metric] | None, sparse_labels: bool = False,
                          collate: Callable[[list], Any] | str | None = None) -> Workload:
    label = "tensors" if isinstance(train_data, (tuple, list)) else type(train_data).__name__
    data = describe_data(train_data, test_data, label, "train_data", sparse_labels)
    loss_fn, loss_name = resolve_loss(loss)
    if isinstance(model, nn.Module):
        name = type(model).__name__

        def build() -> nn.Module:  # every rank passed its own instance
            return checked_trainable(model, "model", name)
    elif callable(model):
        name = ""  # named after the class of the model it builds (see launch.run)

        def build() -> nn.Module:
            what = getattr(model, "__qualname__", type(model).__name__)
            built = call_user(model, "model", what)
            expect_type(built, nn.Module, "model", what, "the model instance (an nn.Module)")
            return checked_trainable(built, "model", what)
    else:
        raise ConfigError(f"model: got {type(model).__name__}; pass an nn.Module, or a "
                          "function with no arguments that returns one")
    if isinstance(metrics, str):  # the command line's "top3=metrics.py:top3,..."
        metrics = resolve_metrics(metrics, "metrics", loss_name)
    try:
        own = dict(metrics or {})
    except (TypeError, ValueError):
        raise ConfigError(f"metrics: got {type(metrics).__name__}; pass a dict {{name: "
                          "metric(output, target) -> (sum, count)}, or 'NAME=MODULE:CALLABLE'")
    # added to the loss's built-in accuracy, as --metrics adds them (it had replaced it)
    builtin = default_metrics(loss_name)
    taken = [name for name in own if name in builtin and own[name] is not builtin[name]]
    if taken:
        raise ConfigError(f"metrics: the name {taken[0]!r} is the built-in accuracy's under "
                          f"loss {loss_name}; give your metric a name of its own")
    chosen = {**builtin, **own}
    for metric_name, metric in chosen.items():
        if not callable(metric):
            raise ConfigError(f"metrics: {metric_name!r} is {type(metric).__name__}; pass "
                              "callables metric(output, target) -> (sum, count)")
    if isinstance(collate, str):
        collate = resolve_callable(collate, "collate") if collate else None
    elif collate is not None and not callable(collate):
        raise ConfigError(f"collate: got {type(collate).__name__}; pass a function that makes "
                          "a batch of a list of (input, target) samples, or 'MODULE:CALLABLE'")
    return Workload(name=name, build_model=build, loss=loss_fn, loss_name=loss_name,
                    metrics=chosen, collate=collate, **data)


def batch_source(data: Any, device: torch.device, cfg: Config,
                 collate: Callable[[list], Any] | None = None) -> BatchSource:
    if isinstance(data, (tuple, list)):
        if collate is not None:  # it would be ignored: rows of tensors are sliced, not collated
            raise ConfigError("--collate (fit: collate=) makes batches of a Dataset's samples; "
                              "this data is a pair of tensors, batched by slicing rows: drop it")
        return InMemoryBatches(data[0], data[1], device)
    source = LoaderBatches(data, device, data_workers=cfg.data.data_workers, seed=cfg.run.seed,
                           stream_steps=cfg.run.max_steps_per_epoch or None, collate=collate)
    if isinstance(data, FirstSamples):
        source.name = data.name  # messages name the user's class
    return source
