"""Bad input that used to be accepted, or to crash with a traceback (issue 14, items 7, 9, 10
and 11): each is refused with exit code 2 and a message that names the flag or file and the fix."""

import gzip
import os
import sys
import types

import numpy as np
import pytest
import torch
import torch.utils.data as torch_data
from PIL import Image
from user_files import CANNOT_TRAIN, write

from hvdtrain import checkpoint
from hvdtrain.cli import main
from hvdtrain.config import Config, ConfigError, DataConfig, ModelConfig, RunConfig, SyncConfig
from hvdtrain.data import DataError, load_dataset, read_idx
from hvdtrain.data.folder import load_folder
from hvdtrain.models import build_model


def save_npz(path, y, **more):
    x = np.random.default_rng(0).standard_normal((len(y), 8)).astype(np.float32)
    np.savez(path, x=x, y=np.asarray(y), **more)
    return str(path)


def write_idx(path, array, dtype_code=0x08, gz=False):
    header = bytes([0, 0, dtype_code, array.ndim]) + b"".join(
        d.to_bytes(4, "big") for d in array.shape)
    data = header + array.tobytes()
    path.write_bytes(gzip.compress(data) if gz else data)


def make_mnist(folder, train_labels, test_labels, dtype_code=0x08):
    folder.mkdir(exist_ok=True)
    for split, labels in (("train", train_labels), ("t10k", test_labels)):
        labels = np.asarray(labels, dtype=np.int8 if dtype_code == 0x09 else np.uint8)
        write_idx(folder / f"{split}-images-idx3-ubyte",
                  np.zeros((len(labels), 4, 4), np.uint8))
        write_idx(folder / f"{split}-labels-idx1-ubyte", labels, dtype_code)
    return str(folder)


def npz(path, **kw):
    return load_dataset(DataConfig(dataset="npz", data_path=path, **kw))


@pytest.fixture
def no_training(monkeypatch):
    """main() may read the options and the data, but must stop before training."""
    from hvdtrain import cli

    def refuse(*args, **kwargs):
        pytest.fail("bad input reached training")
    monkeypatch.setattr(cli, "train", refuse)


# --- item 7: the labels of the built-in classification datasets ---------------------------------
def test_labels_of_one_class_are_refused(tmp_path):
    path = save_npz(tmp_path / "one.npz", np.ones(100, dtype=np.int64))  # max + 1 = 2 "classes"
    with pytest.raises(DataError, match=r"one\.npz: every training label is 1, one class; .*"
                                        "at least 2 classes"):
        npz(path)
    folder = make_mnist(tmp_path / "mnist", [3] * 20, [3] * 10)
    with pytest.raises(DataError, match="mnist: every training label is 3, one class"):
        load_dataset(DataConfig(dataset="mnist", data_path=folder))
    (tmp_path / "images" / "cat").mkdir(parents=True)
    Image.fromarray(np.zeros((4, 4), np.uint8)).save(tmp_path / "images" / "cat" / "1.png")
    with pytest.raises(DataError, match=r"has one class subfolder \(cat\); a classifier needs"):
        load_folder(tmp_path / "images", 0.2, 0)


def test_a_label_range_far_beyond_the_labels_in_use_needs_sparse_labels(tmp_path):
    two = save_npz(tmp_path / "two.npz", np.arange(100) % 2 * 100000)
    with pytest.raises(DataError, match=r"two\.npz: labels go up to 100000, a 100001-way "
                                        r"classifier, but only 2 distinct .*--sparse-labels"):
        npz(two)
    assert npz(two, sparse_labels=True).num_classes == 100001
    with pytest.raises(DataError, match="labels go up to 1099511627776"):  # was an allocator crash
        npz(save_npz(tmp_path / "huge.npz", np.arange(100) % 2 * 2**40))
    # Some unused classes are common (a subset of a labelled set) and stay accepted.
    assert npz(save_npz(tmp_path / "gaps.npz", np.arange(100) % 4 * 300)).num_classes == 901
    with_test = save_npz(tmp_path / "split.npz", np.arange(20) % 2,
                         x_test=np.zeros((4, 8), np.float32), y_test=np.array([0, 1, 0, 5000]))
    with pytest.raises(DataError, match="labels go up to 5000"):
        npz(with_test)


def test_negative_labels_are_refused(tmp_path):
    with pytest.raises(DataError, match="negative labels"):
        npz(save_npz(tmp_path / "neg.npz", np.arange(50) % 3 - 1))
    folder = make_mnist(tmp_path / "mnist", np.arange(20) % 3 - 1, np.arange(10) % 3,
                        dtype_code=0x09)  # IDX int8 labels can be negative
    with pytest.raises(DataError, match=r"mnist: has negative labels \(the smallest is -1\)"):
        load_dataset(DataConfig(dataset="mnist", data_path=folder))


# --- item 9: a checkpoint of another model with the same parameter count ------------------------
def test_same_parameter_count_other_shapes_names_the_tensor():
    def mlp(hidden):
        return build_model("mlp", (1, 8, 8), 10, ModelConfig(hidden=hidden))

    saved, wanted = mlp((256, 128)).state_dict(), mlp((182, 202)).state_dict()
    assert sum(t.numel() for t in saved.values()) == sum(t.numel() for t in wanted.values())
    with pytest.raises(checkpoint.CheckpointError,
                       match=r"1\.weight: checkpoint has shape \(256, 64\), this run's model "
                             r"\(182, 64\)"):
        checkpoint.check_model_state(saved, wanted, "run")


# --- item 10: tracebacks ------------------------------------------------------------------------
def test_corrupt_gzip_in_an_mnist_file_is_named(tmp_path):
    path = tmp_path / "train-labels-idx1-ubyte.gz"
    write_idx(path, np.arange(5000, dtype=np.uint8) % 10, gz=True)
    good = path.read_bytes()
    body = bytearray(good)
    body[20:40] = b"\x00" * 20  # inside the deflate stream: zlib.error
    for broken in (bytes(body), good[: len(good) // 2], b"not gzip at all"):
        path.write_bytes(broken)
        with pytest.raises(DataError, match=r"train-labels-idx1-ubyte\.gz: cannot read"):
            read_idx(path)


@pytest.mark.parametrize("flag", ["--warmup-epochs", "--fusion-threshold-mb",
                                  "--stall-timeout-s", "--chunk-mb", "--weight-decay",
                                  "--dc-lambda", "--timeout-s", "--cycle-time-ms"])
@pytest.mark.parametrize("value", ["inf", "nan"])
def test_non_finite_numbers_are_refused(flag, value, capsys, no_training):
    assert main(["train", flag, value]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"hvdtrain: error: {flag}: invalid value {value}") and \
        "Traceback" not in err


def test_an_unbounded_staleness_stays_the_default():
    assert Config.from_overrides({"staleness": "inf"}).validate().ps.staleness == float("inf")
    with pytest.raises(ConfigError, match="--staleness: invalid value nan"):
        Config.from_overrides({"staleness": "nan"}).validate()
    # the pipeline's own flags without --stages ran a plain run, the same losses bit for bit
    with pytest.raises(ConfigError, match=r"--micro-batches 4, --schedule 1f1b: pipeline "
                                          r"options, for a replica split into stages; add "
                                          r"--stages K"):
        Config.from_overrides({"micro_batches": 4, "schedule": "1f1b"}).validate()
    Config.from_overrides({"stages": 2, "micro_batches": 4}).validate()
    # another built-in model's shape flag was ignored without a word
    with pytest.raises(ConfigError, match=r"--channels: it shapes "
                                          r"--model cnn, not --model mlp: drop it"):
        Config.from_overrides({"model": "mlp", "channels": "256,512"}).validate()
    with pytest.raises(ConfigError, match=r"--hidden: .* not --model my.py:build: drop it "
                                          r"\(your own model takes its sizes in --model-args\)"):
        Config.from_overrides({"model": "my.py:build", "hidden": "64"}).validate()
    # a bound counts pushes: 2.5 was taken, and bounded nothing a 2 would not
    with pytest.raises(ConfigError, match="--staleness: invalid value 2.5; use 0 .lock-step., "
                                          "a whole number of pushes"):
        Config.from_overrides({"staleness": "2.5"}).validate()
    assert Config.from_overrides({"staleness": 2, "mode": "async"}).validate().ps.staleness == 2
    # a rule of the server in a sync run was ignored: three sync workers, not SSP
    for flag, values in (("--staleness", {"staleness": 0}), ("--bsp", {"bsp": True}),
                         ("--no-round-staleness-weight", {"round_staleness_weight": False}),
                         ("--eval-pauses-workers", {"eval_pauses_workers": True})):
        with pytest.raises(ConfigError, match=f"{flag}: an option of the parameter server "
                                              f"\\(--mode async\\); this run is --mode sync and "
                                              f"would ignore it: add --mode async, or drop {flag}"):
            Config.from_overrides(values).validate()
    # the transport's tuning changes no result, and tunes nothing in the other mode
    Config.from_overrides({"chunk_mb": 4, "mode": "async"}).validate()
    with pytest.raises(ConfigError, match=r"--chunk-mb: it tunes the parameter server's"):
        Config.from_overrides({"chunk_mb": 4}).validate()
    # each mode's limit on a hang, set in the other mode, bounded nothing
    with pytest.raises(ConfigError, match=r"--timeout-s: .*a sync run's hangs are ended by "
                                          r"--stall-timeout-s instead"):
        Config.from_overrides({"timeout_s": 30}).validate()
    with pytest.raises(ConfigError, match=r"--stall-timeout-s: .*an async job's hangs are "
                                          r"ended by --timeout-s"):
        Config.from_overrides({"mode": "async", "stall_timeout_s": 30}).validate()
    Config.from_overrides({"mode": "async", "timeout_s": 30}).validate()
    Config.from_overrides({"stall_timeout_s": 30}).validate()
    # ... and what the server would ignore: sync's compression, a bound on lock-step rounds,
    # DiLoCo's round weight without local steps
    for values, told in (({"compression": "fp16"}, "take --wire-dtype fp16"),
                         ({"bsp": True, "staleness": 2}, "--bsp rounds are lock-step"),
                         ({"bsp": True, "pull_every": 3}, "--pull-every: .*pulling every k "
                                                          "rounds would train on stale ones"),
                         ({"round_staleness_weight": False}, "the round weight is asynchronous "
                                                             "DiLoCo's")):
        with pytest.raises(ConfigError, match=told):
            Config.from_overrides({"mode": "async", **values}).validate()
    # --data-path without a dataset that reads it: the built-in digits trained instead
    with pytest.raises(ConfigError, match=r"--data-path: .*only --dataset mnist, npz or folder "
                                          r"read it, and --dataset digits would ignore it"):
        Config.from_overrides({"data_path": "mine.npz"}).validate()
    # a cosine schedule whose warm-up lasts the whole run never decays
    with pytest.raises(ConfigError, match=r"--warmup-epochs: .*--lr-schedule cosine decays after "
                                          r"the warm-up, which would last all of --epochs 4"):
        Config.from_overrides({"lr_schedule": "cosine", "epochs": 4,
                               "warmup_epochs": 5}).validate()
    Config.from_overrides({"lr_schedule": "cosine", "epochs": 2}).validate()
    # an option that only another setting reads, given without it, was ignored without a word
    for values, told in (
            ({"optimizer": "adam", "momentum": 0.5}, r"--momentum: SGD's momentum; --optimizer "
                                                     r"adam .* drop --momentum, or use "
                                                     r"--optimizer sgd"),
            ({"synthetic_shape": "64"}, r"--synthetic-shape: it shapes --dataset synthetic, and "
                                        r"--dataset digits would ignore it"),
            ({"tracker_project": "mine"}, r"--tracker-project: .* add --tracker mlflow"),
            ({"tracker_artifacts": True}, r"--tracker-artifacts: .* no tracker"),
            ({"elastic_commit_steps": 5}, r"--elastic-commit-steps: .* add --elastic")):
        with pytest.raises(ConfigError, match=told):
            Config.from_overrides(values).validate()
    Config.from_overrides({"optimizer": "adam"}).validate()  # the default momentum: not given
    Config.from_overrides({"dataset": "synthetic", "synthetic_shape": "64"}).validate()
    Config.from_overrides({"run_dir": "r", "elastic": True,
                           "elastic_commit_steps": 5}).validate()


def test_a_run_dir_that_is_a_file_is_refused(tmp_path, capsys, no_training):
    file = tmp_path / "taken"
    file.write_text("")
    for run_dir in (file, file / "run"):
        assert main(["train", "--run-dir", str(run_dir)]) == 2
        assert f"--run-dir {run_dir}: {'it' if run_dir == file else file} is a file, not a " \
               "folder" in capsys.readouterr().err
    RunConfig(run_dir=str(tmp_path / "new" / "run")).validate()  # created later: fine


def test_a_read_only_run_dir_is_refused(tmp_path, monkeypatch):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    if os.geteuid() == 0:  # root may write into any folder: pretend to be another user
        monkeypatch.setattr(os, "access", lambda path, mode: False)
    try:
        for run_dir in (folder, folder / "run"):
            with pytest.raises(ConfigError, match=f"--run-dir {run_dir}: .* not writable"):
                RunConfig(run_dir=str(run_dir)).validate()
    finally:
        folder.chmod(0o700)


def test_a_config_file_that_is_not_utf8(tmp_path, capsys, no_training):
    for name in ("latin1.toml", "latin1.yaml"):
        path = tmp_path / name
        path.write_bytes("# caf\xe9\nepochs = 1\n".encode("latin-1"))
        assert main(["train", "--config", str(path)]) == 2
        assert f"--config: {path} is not UTF-8 text" in capsys.readouterr().err


# --- compare: nothing may be launched for any of these --------------------------------------------
@pytest.fixture
def no_runs(monkeypatch):
    from hvdtrain.compare import runner

    def refuse(*args, **kwargs):
        pytest.fail("bad input reached the runs")
    monkeypatch.setattr(runner, "run_one", refuse)


@pytest.mark.parametrize("argv, message", [
    (["--modes", ""], "--modes: no mode given, so the plan is empty"),
    (["--modes", "ssp", "--staleness-bounds", ""], "--staleness-bounds: ssp needs at least a bound"),
    (["--train-args", "--seed 3"], "--seed is set by the plan for each run; use --seeds"),
    (["--train-args", "--batch-size 8 --mode=async"], "--train-args: --mode is set by the plan"),
    (["--train-args", "--run-dir x"], "--train-args: --run-dir is set by the plan"),
    # it came after the plan's own --stop-at, so real runs stopped there and simulated ones not
    (["--train-args", "--stop-at test_acc>=0.5"], "--stop-at is set by the plan for each run; "
                                                  "use --target"),
    (["--train-args", "--staleness 4"], "use --staleness-bounds"),
    (["--train-args", "--batch-size 8 --epoch 3"], "--train-args: unknown flag(s) --epoch"),
    (["--train-args", "--lr -1"], "--train-args: --lr: invalid value -1.0"),
    (["--run-timeout", "-5"], "--run-timeout: invalid value -5.0; use a positive number of "
                              "seconds"),  # issue 24: were accepted
    (["--simulate", "--sim-step-ms", "nan"], "--sim-apply-ms and --sim-sample-ms: use 0 or "
                                             "more milliseconds (a finite number)"),
])
def test_compare_refuses_an_empty_plan_and_train_args_that_override_it(
        argv, message, tmp_path, capsys, no_runs):
    assert main(["compare", "--out", str(tmp_path / "out"), *argv]) == 2
    assert message in capsys.readouterr().err


def test_compare_out_that_is_a_file(tmp_path, capsys, no_runs):
    out = tmp_path / "out"
    out.write_text("")
    assert main(["compare", "--out", str(out)]) == 2
    assert f"--out {out}: it is a file, not a folder" in capsys.readouterr().err


# --- item 11: accepted silently -----------------------------------------------------------------
@pytest.mark.parametrize("argv", [["train", "--epoch", "1"], ["train", "--hid", "8"],
                                  ["compare", "--seed", "1"], ["compare", "--work", "1"]])
def test_abbreviated_flags_are_refused(argv, tmp_path, capsys, no_training, no_runs):
    if argv[0] == "compare":
        argv = [*argv, "--out", str(tmp_path / "out")]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert "unrecognized arguments" in capsys.readouterr().err


@pytest.mark.parametrize("name, text", [
    ("wrong.toml", "[optim]\nepochs = 1\nlr = 0.1\n"),
    ("wrong.yaml", "optim:\n  lr: 0.1\n  epochs: 1\n"),
])
def test_a_config_key_under_the_wrong_section(tmp_path, name, text, capsys, no_training):
    path = tmp_path / name
    path.write_text(text)
    assert main(["train", "--config", str(path)]) == 2
    assert "epochs is under [optim] but belongs in [run]" in capsys.readouterr().err


def test_elastic_under_mpirun_is_refused_before_horovod_starts(monkeypatch):
    from hvdtrain import runtime

    def init():
        pytest.fail("hvd.init() was reached")
    monkeypatch.setitem(sys.modules, "horovod.torch", types.SimpleNamespace(init=init))
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "0")
    monkeypatch.delenv("HOROVOD_GLOO_RENDEZVOUS_ADDR", raising=False)
    with pytest.raises(ConfigError, match="--elastic needs horovodrun.*horovodrun -np N --gloo"):
        runtime.start_horovod(RunConfig(run_dir="r"), SyncConfig(elastic=True))
    # horovodrun --gloo: Adasum failed at the first step, blamed on another rank or a stall
    monkeypatch.setenv("HOROVOD_CONTROLLER", "gloo")
    with pytest.raises(ConfigError, match="--reduce-op adasum needs Horovod's MPI controller"):
        runtime.start_horovod(RunConfig(), SyncConfig(reduce_op="adasum"))


# --- issue 24: bad input that ended in a traceback ------------------------------------------------
def nested(depth: int) -> str:
    return '{"a": ' * depth + "1" + "}" * depth


@pytest.mark.parametrize("name, text", [
    ("deep.toml", "[model]\nmodel_args = " + "{a = " * 100_000 + "1" + "}" * 100_000 + "\n"),
    ("deep.yaml", "model_args: " + "{a: " * 100_000 + "1" + "}" * 100_000 + "\n"),
    ("json.toml", f"model_args = '{nested(100_000)}'\n"),  # a string, parsed as JSON later
])
def test_model_args_nested_100000_deep_in_a_config_file(name, text, tmp_path, capsys, no_training):
    (tmp_path / "m.py").write_text("import torch\ndef build(**kw):\n    return torch.nn.Linear(8, 3)\n")
    path = tmp_path / name
    path.write_text(text)
    assert main(["train", "--config", str(path), "--model", f"{tmp_path / 'm.py'}:build"]) == 2
    err = capsys.readouterr().err
    assert "is nested too deeply to read" in err and "pass a flat object" in err, err[-2000:]


@pytest.mark.parametrize("flag, value", [("--seed", "99999999999999999999"), ("--seed", "-1"),
                                         ("--data-seed", str(2**32))])
def test_a_seed_beyond_what_the_generators_take(flag, value, capsys, no_training):
    assert main(["train", flag, value]) == 2  # was an overflow in torch.manual_seed
    assert f"{flag}: invalid value {value}; use a whole number from 0 to 4294967295" in \
        capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--model-args", '{"width": 3}'], "--model-args: it is for your own --model "
                                       "MODULE:CALLABLE; the built-in mlp would ignore it"),
    (["--dataset", "synthetic", "--dataset-args", '{"n": 3}'],
     "--dataset-args is for your own --dataset MODULE:CALLABLE; the built-in synthetic would "
     "ignore it"),
    (["--cycle-time-ms", "1e7"], "--cycle-time-ms: invalid value 10000000.0; use 0 (chosen for "
                                 "you) or a time in ms, at most 1000"),
    (["--cycle-time-ms", "-1"], "--cycle-time-ms: invalid value -1.0; use 0 (chosen for you) or a "
                                "time in ms, at most 1000"),
    (["--chunk-mb", "1e-7"], "--chunk-mb: invalid value 1e-07; use a size in MiB of at least "
                             "0.001"),
])
def test_options_that_were_ignored_or_hung_silently(argv, message, capsys, no_training):
    assert main(["train", *argv]) == 2
    assert message in capsys.readouterr().err


def test_a_config_that_is_a_folder(tmp_path, capsys, no_training):
    assert main(["train", "--config", str(tmp_path)]) == 2
    assert f"--config: {tmp_path} is a folder; pass the path of a .toml or .yaml file" in \
        capsys.readouterr().err


class Foreign:
    """An object that hvdtrain never writes into a checkpoint."""


def test_an_unreadable_checkpoint_does_not_advise_weights_only_false(tmp_path):
    import torch
    torch.save({"format_version": 1, "x": Foreign()}, tmp_path / "foreign.pt")
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    for name, reason in (("foreign.pt", "it holds a Python object of type "),
                         ("junk.pt", "not a torch zip archive")):
        with pytest.raises(checkpoint.CheckpointError) as error:
            checkpoint.load(tmp_path / name)
        assert reason in str(error.value) and "weights_only" not in str(error.value)


def test_a_checkpoint_whose_tensor_bytes_changed_is_refused_as_damaged(tmp_path):
    """torch.load reads a zip record without its CRC-32: a resume trained on from the damaged
    weights (a loss of 348,636) and overwrote the file."""
    import torch
    weights = torch.arange(50_000, dtype=torch.float32)
    path = checkpoint.save_atomic({"format_version": checkpoint.FORMAT_VERSION,
                                   "model": {"w": weights}}, tmp_path / "checkpoint.pt")
    assert torch.equal(checkpoint.load(path)["model"]["w"], weights)
    data = bytearray(path.read_bytes())
    at = data.find(weights[1000:1004].numpy().tobytes())
    assert at > 0
    data[at:at + 40] = bytes(b ^ 0x5A for b in data[at:at + 40])
    path.write_bytes(bytes(data))
    with pytest.raises(checkpoint.CheckpointError, match=r"checkpoint\.pt is damaged \(its "
                                                         r"record .* does not match the checksum "
                                                         r"written with it"):
        checkpoint.load(path)


def test_elastic_without_a_launcher_is_refused(monkeypatch):
    from hvdtrain import runtime

    def init():
        pytest.fail("hvd.init() was reached")
    monkeypatch.setitem(sys.modules, "horovod.torch", types.SimpleNamespace(init=init))
    for name in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "HOROVOD_RANK", "HOROVOD_ELASTIC",
                 "HOROVOD_GLOO_RENDEZVOUS_ADDR"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ConfigError, match="--elastic needs horovodrun's elastic mode, and this "
                                          "job was started without a launcher"):
        runtime.start_horovod(RunConfig(run_dir="r"), SyncConfig(elastic=True))
    monkeypatch.setenv("HOROVOD_RANK", "0")  # horovodrun without --min-np/--max-np
    monkeypatch.setenv("HOROVOD_GLOO_RENDEZVOUS_ADDR", "127.0.0.1")
    with pytest.raises(ConfigError, match="started by horovodrun --gloo without --min-np"):
        runtime.start_horovod(RunConfig(run_dir="r"), SyncConfig(elastic=True))


def test_a_job_that_torchrun_started_is_refused_by_horovod_and_the_server(monkeypatch):
    """Under torchrun every process trained alone in sync (Horovod found no job), each in a
    folder of its own, and async said '--num-servers 1 with 1 process(es)'."""
    from hvdtrain import runtime

    monkeypatch.setitem(sys.modules, "horovod.torch", types.SimpleNamespace(
        init=lambda: pytest.fail("hvd.init() was reached")))
    for name in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "HOROVOD_RANK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    with pytest.raises(ConfigError, match="started by torchrun.*add --collective torch"):
        runtime.start_horovod(RunConfig(), SyncConfig())
    with pytest.raises(ConfigError, match="--mode async talks MPI, but torchrun starts no MPI"):
        runtime.start_mpi(RunConfig(), lambda rank, size: False)


def test_a_nan_evaluation_keeps_no_best_and_reaches_no_target():
    import math

    from hvdtrain.loop.best import BestTracker
    from hvdtrain.loop.target import TargetStop
    from hvdtrain.scheme import Progress

    nan_eval = (math.nan, {"acc": 0.97})  # NaN in the test data: argmax still gives an "accuracy"
    target = TargetStop(RunConfig(stop_at="test_acc>=0.9"), ["acc"], True)
    target.evaluated(nan_eval, 10)
    assert target.reached is None
    target.evaluated((0.1, {"acc": 0.95}), 20)
    assert target.reached.startswith("test_acc 0.95 >= 0.9 at step 20")

    saved = []
    checkpointer = types.SimpleNamespace(components={}, save=lambda *a: saved.append(a))
    best = BestTracker(RunConfig(keep_best="test_acc"), None, checkpointer, ["acc"], True)
    best.evaluated(nan_eval, Progress(workers=1))
    assert saved == [] and best.best is None and best.since_best == 1




@pytest.fixture
def user_spec(tmp_path, isolated_imports):
    path = write(tmp_path / "user_code_24.py", CANNOT_TRAIN)
    return lambda name: f"{path}:{name}"


def checked_workload(**options):
    """The workload the options name, built, bound and checked as launch.run does (no Horovod)."""
    from hvdtrain.workload import workload_from_config
    import torch

    cfg = Config.from_overrides(options).validate()
    workload = workload_from_config(cfg)
    model = workload.build_model()
    workload.bind(torch.device("cpu"), cfg)
    workload.check(model, torch.device("cpu"))
    return workload


@pytest.mark.parametrize("dataset, model, message", [
    # evaluation crashed after a whole epoch of training
    ("test_of_another_shape", "linear",
     r"the test split fails where one of the training split passes \(the test inputs are of "
     r"shape \(5,\) per sample, the training inputs of shape \(8,\)\)"),
    # an allocator traceback: a 2**40-wide output layer
    ("huge_label", "mlp", r"the labels go up to 1099511627776 but only 4 distinct ones occur"),
    ("huge_label", "linear", r"num_classes was not offered because the labels go up to "
                             r"1099511627776"),
    # max() of an empty tensor
    ("empty_test", "linear", r"the test data holds no samples; give it samples, or pass None"),
    # torch.stack in the collate function
    ("ragged", "fixed", r"the training data: .*the samples of a batch cannot be stacked into "
                        r"one \(stack expects each tensor to be equal size.*pad or crop.*"
                        r"--collate"),
    # hvdtrain's own TypeError from the loader
    ("no_len", "fixed", r"is a map-style Dataset \(NoLen\) without __len__.*define __len__"),
    # blamed the built-in model for a missing input shape
    ("one_pair", "mlp", r"returned two tensors, which read as \(train, test\) = \(x, y\).*"
                        r"or \(\(x, y\), None\)"),
    # a traceback from backward() in sync, a misleading message in async
    ("pairs", "frozen", r"the model has nothing to train: all 2 of its parameter tensors are "
                        r"frozen \(requires_grad=False\)"),
    ("pairs", "Listed", r"the model has nothing to train: it has no parameters;.*nn.ModuleList"),
])
def test_user_data_and_models_that_cannot_train(dataset, model, message, user_spec):
    spec = model if model == "mlp" else user_spec(model)
    with pytest.raises((ConfigError, DataError), match=message):
        checked_workload(dataset=user_spec(dataset), model=spec)


def test_a_sparse_label_of_2_40_in_an_npz_file_names_the_classifier_width(tmp_path):
    from hvdtrain.workload import workload_from_config

    path = save_npz(tmp_path / "huge.npz", np.arange(100) % 2 * 2**40)
    workload = workload_from_config(Config.from_overrides(
        {"dataset": "npz", "data_path": path, "sparse_labels": True}).validate())
    with pytest.raises(ConfigError, match=r"--model mlp: its layers for input 8 and "
                                          r"1,099,511,627,777 classes do not fit in memory"):
        workload.build_model()  # was the allocator's traceback


def test_fit_refuses_a_model_with_nothing_to_train():
    import torch

    import hvdtrain

    x, y = torch.randn(32, 4), torch.randint(0, 2, (32,))
    with pytest.raises(ConfigError, match="model Linear: the model has nothing to train"):
        hvdtrain.fit(torch.nn.Linear(4, 2).requires_grad_(False), (x, y), epochs=1)


@pytest.mark.parametrize("name, message", [
    ("timeout_s", r"--timeout-s: got None; give a number \(the default is 300.0\)"),
    ("max_restarts", r"--max-restarts: got None; give a whole number \(the default is 0\)"),
    ("balance_floor", r"--balance-floor: got None; give a number \(the default is 0.25\)"),
    ("slow_rank_factor", r"--slow-rank-factor: got None"),
    ("split_points", r"--split-points: got None; give a list of whole numbers \(the default "
                     r"is ''"),
    ("balance", r"--balance: got None; give True or False")])
def test_fit_names_an_option_given_as_none(name, message):
    # These raised a bare TypeError from the range checks ('>=' between NoneType and int).
    import hvdtrain

    x, y = torch.randn(32, 4), torch.randint(0, 2, (32,))
    with pytest.raises(ConfigError, match=message):
        hvdtrain.fit(torch.nn.Linear(4, 2), (x, y), epochs=1, **{name: None})


def test_none_stays_a_value_where_it_is_the_default():
    assert Config.from_overrides({"run_dir": None, "resume": None}).validate().run.run_dir is None


def test_tensorboard_on_a_full_disk_stops_with_one_message(tmp_path, monkeypatch):
    """TensorBoard writes from a thread, which printed its traceback, and the next write raised
    the same error as a second one; now it is one TrainingError saying what is intact."""
    import errno
    import threading

    from tensorboard.compat.tensorflow_stub.io import gfile

    from hvdtrain.loop import TrainingError
    from hvdtrain.loop.tensorboard import TensorBoardSink

    hooked = []
    monkeypatch.setattr(threading, "excepthook", lambda args: hooked.append(args))
    sink = TensorBoardSink(tmp_path, first_step=1)
    (tmp_path / checkpoint.CHECKPOINT_NAME).write_bytes(b"a checkpoint")

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(gfile.io, "open", full_disk)
    with pytest.raises(TrainingError) as error:
        sink.record("epoch", {"step": 5, "train_loss": 0.5})
        sink.record("epoch", {"step": 6, "train_loss": 0.4})
    assert str(error.value) == (
        f"could not write TensorBoard events to {tmp_path} (No space left on device); "
        f"metrics.jsonl holds every line written so far; the last checkpoint "
        f"{tmp_path / checkpoint.CHECKPOINT_NAME} is intact; free space and continue with "
        f"--resume {tmp_path}")
    sink.record("step", {"step": 7, "loss": 0.3})  # the run is stopping: no second error
    sink.close()  # runs while the error is on its way out: must not replace it
    assert hooked == []  # no traceback from the writer thread


class EndlessStream(torch_data.IterableDataset):
    """Fresh samples for ever, as a generator of synthetic data gives them."""

    def __iter__(self):
        while True:
            yield torch.randn(8), 1


class EndlessStreamOf20(EndlessStream):
    def __len__(self):
        return 20


def test_an_endless_test_stream_is_refused_or_cut_at_its_len():
    # It evaluated for ever, deaf to SIGTERM.
    from hvdtrain.data.loader import LoaderBatches
    from hvdtrain.workload import batch_source, describe_data

    train = (torch.randn(64, 8), torch.randint(0, 3, (64,)))
    with pytest.raises(ConfigError, match=r"the test data is a stream \(EndlessStream\) without "
                                          r"__len__, so an evaluation cannot tell where it ends"):
        describe_data(train, EndlessStream(), "data", "--dataset d.py:data")
    # fit()'s test_data is named as such, not as its train_data
    with pytest.raises(ConfigError, match=r"^test_data: the test data is a stream"):
        describe_data(train, EndlessStream(), "data", "train_data")
    test = describe_data(train, EndlessStreamOf20(), "data", "--dataset d.py:data")["test_data"]
    source = batch_source(test, torch.device("cpu"), Config())
    assert isinstance(source, LoaderBatches) and source.name == "EndlessStreamOf20"
    assert [len(y) for _, y in source.eval_batches(0, 1, 8)] == [8, 8, 4]


def test_nan_in_the_test_data_reports_no_accuracy():
    import math

    from hvdtrain.losses import accuracy
    from hvdtrain.replica import Objective, Replica

    torch.manual_seed(0)
    replica = Replica(torch.nn.Linear(8, 3), torch.device("cpu"),
                      Objective(torch.nn.functional.cross_entropy, {"acc": accuracy}))
    x, y = torch.randn(16, 8), torch.randint(0, 3, (16,))
    x[3, 0] = math.nan
    stats = replica.evaluate([(x[:8], y[:8]), (x[8:], y[8:])])
    assert math.isnan(stats.loss_sum) and stats.count == 16
    correct, count = stats.metrics["acc"]
    assert math.isnan(correct) and count == 16  # argmax over NaN gave a count of "correct" ones


def test_a_model_file_named_by_another_path_is_the_same_setup():
    """A restart from another folder spelled --model by its absolute path, and was refused."""
    saved = {"identity": {"model": "model.py:build", "mode": "sync"}}
    checkpoint.check_compatible(saved, {"model": "/jobs/w/model.py:build", "mode": "sync"}, "c")
    checkpoint.check_compatible(saved, {"model": "./model.py:build", "mode": "sync"}, "c")
    for other in ("other.py:build", "model.py:make", "pkg.model:build"):
        with pytest.raises(checkpoint.CheckpointError, match="was written for a different setup"):
            checkpoint.check_compatible(saved, {"model": other, "mode": "sync"}, "c")


def test_every_error_fit_raises_is_importable_from_the_package():
    """fit()'s docstring names DataError and CheckpointError, which only their own modules
    exported: a user could not catch them from hvdtrain."""
    import hvdtrain
    from hvdtrain.checkpoint import CheckpointError
    from hvdtrain.config import ConfigError as Config_error
    from hvdtrain.data.builtin import DataError
    from hvdtrain.errors import TrainingError

    assert (hvdtrain.CheckpointError, hvdtrain.DataError, hvdtrain.TrainingError,
            hvdtrain.ConfigError) == (CheckpointError, DataError, TrainingError, Config_error)
    assert set(hvdtrain.__all__) >= {"CheckpointError", "DataError", "TrainingError",
                                     "ConfigError"}
    with pytest.raises(AttributeError):
        hvdtrain.NoSuchError


def test_a_run_folder_on_a_read_only_file_system_is_not_told_to_change_permissions(
        tmp_path, monkeypatch):
    import os
    from types import SimpleNamespace

    from hvdtrain.config.values import check_writable_folder

    monkeypatch.setattr(os, "statvfs", lambda path: SimpleNamespace(f_flag=os.ST_RDONLY))
    with pytest.raises(ConfigError, match=r"where it would be created, is on a read-only file "
                                          r"system; pass a folder on a writable one"):
        check_writable_folder(str(tmp_path / "run"), "--run-dir")
