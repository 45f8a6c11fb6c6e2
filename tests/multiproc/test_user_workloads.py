"""Tiers 2 and 3: the user's own model, data and loss (issue 13), from the command line
(--model/--dataset/--loss MODULE:CALLABLE) and through hvdtrain.fit, in real mpirun / horovodrun
jobs, sync and async, each with a timeout. The user's code lives in tests/helpers/user/.

Every job runs from the repository root, so the specs are the relative paths a user would type.
"""

import hashlib
import json
import math
import os
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers.forked_cli import run_forked

from hvdtrain import checkpoint
from hvdtrain.run_output import read_jsonl
from hvdtrain.user_code import resolve_callable
from launch import REPO, horovodrun, hvdtrain, mpirun, run

pytestmark = pytest.mark.multiproc
USER = REPO / "tests" / "helpers" / "user"
MODELS = "tests/helpers/user/residual_net.py"  # relative to REPO, as a user would type it
DATA = "tests/helpers/user/user_data.py"
LOSSES = "tests/helpers/user/user_loss.py"
MODEL = f"{MODELS}:build"
FIT = str(USER / "fit_script.py")
QUIET = ["--no-progress", "--seed", "1"]
DIGITS_STEPS = 1437 // 2 // 32  # steps per epoch of 2 workers on the digits' training split


def logged(run_dir: Path) -> tuple[dict, list[dict], list[dict]]:
    """(the header, the epoch lines, the step lines) of a run's metrics log."""
    log = read_jsonl(run_dir / "metrics.jsonl")
    assert log[0]["type"] == "header", log[0]
    return (log[0], [r for r in log if r["type"] == "epoch"],
            [r for r in log if r["type"] == "step"])


def digits_test_accuracy(model: torch.nn.Module) -> float:
    sys.path.insert(0, str(USER))
    try:
        from user_data import digits_arrays
    finally:
        sys.path.remove(str(USER))
    _, _, x_test, y_test = digits_arrays()
    model.eval()
    with torch.no_grad():
        return (model(x_test).argmax(1) == y_test).float().mean().item()


# --- 1. a residual net from a .py file reaches 95 % on digits, sync and async -------------------

@pytest.mark.parametrize("mode", ["sync", "async"])
def test_residual_net_from_a_file_reaches_95_percent(tmp_path, mode):
    flags = [*QUIET, "--epochs", "6", "--lr-schedule", "cosine", "--run-dir", str(tmp_path)]
    if mode == "sync":  # the .py file's path
        proc = run(horovodrun(2, *hvdtrain("train", "--model", MODEL, *flags)), cwd=REPO)
        spec = MODEL
    else:  # the dotted module path, found on PYTHONPATH; 2 workers + 1 server
        spec = "residual_net:build"
        proc = run(mpirun(3, *hvdtrain("train", "--mode", "async", "--model", spec, *flags)),
                   cwd=REPO, env={"PYTHONPATH": str(USER)})
    header, epochs, _ = logged(tmp_path)
    assert header["model"] == spec and header["num_workers"] == 2
    assert header["steps_per_epoch"] == DIGITS_STEPS
    assert [e["epoch"] for e in epochs] == [1, 2, 3, 4, 5, 6]
    assert epochs[-1]["test_acc"] >= 0.95, epochs[-1]
    assert epochs[-1]["train_loss"] < epochs[0]["train_loss"] / 3
    assert "done: test accuracy" in proc.stdout

    # BatchNorm's running statistics travelled into the checkpoint, trained: finite, moved
    # from their initial zeros and ones, and updated once per step of this worker (async: the
    # batches of the job that worker 0 was handed, ps/dispatch.py).
    steps = 6 * DIGITS_STEPS
    if mode == "async":
        [scheme] = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if r["type"] == "scheme"]
        steps = scheme["batches_per_worker"]["0"]
        assert steps + scheme["batches_per_worker"]["1"] == 2 * 6 * DIGITS_STEPS
    state = checkpoint.load(tmp_path)
    assert state["identity"]["model"] == spec and state["epoch"] == 6
    weights = state["model"]
    norms = sorted(k[:-len(".running_mean")] for k in weights if k.endswith(".running_mean"))
    assert norms == ["block.bn1", "block.bn2", "stem_bn"]
    for bn in norms:
        mean, var = weights[f"{bn}.running_mean"], weights[f"{bn}.running_var"]
        assert torch.isfinite(mean).all() and torch.isfinite(var).all(), bn
        assert mean.abs().max() > 1e-3, f"{bn}.running_mean is still all zero"
        assert (var - 1).abs().max() > 1e-3, f"{bn}.running_var is still all one"
        assert weights[f"{bn}.num_batches_tracked"].item() == steps, bn

    # The checkpoint holds the trained model: the user's class loads it and scores >= 95 %.
    # (Not exactly the logged test_acc: each worker scored its half of the test split with its
    # own BatchNorm statistics; see test_sync_replicas_end_with_the_same_batchnorm_statistics.)
    model = resolve_callable(f"{USER / 'residual_net.py'}:build", "--model")((1, 8, 8), 10)
    model.load_state_dict(weights)
    assert digits_test_accuracy(model) >= 0.95


# --- 2. hvdtrain.fit under mpirun: the same result on every rank, servers included --------------

@pytest.fixture(scope="module")
def fit_runs(tmp_path_factory):
    """fit_script.py under mpirun, once per mode: get(np, mode) -> (out folder, each rank's
    result)."""
    done: dict[str, tuple[Path, list[dict]]] = {}

    def get(np: int, mode: str) -> tuple[Path, list[dict]]:
        if mode not in done:
            out = tmp_path_factory.mktemp(f"fit-{mode}")
            run(mpirun(np, sys.executable, FIT, str(out), f"mode={mode}", "epochs=6",
                       "lr_schedule=cosine", "progress=false", "seed=1", f"run_dir={out / 'run'}"))
            done[mode] = out, [json.loads((out / f"rank{r}.json").read_text())
                               for r in range(np)]
        return done[mode]
    return get


@pytest.mark.parametrize("np, mode", [(2, "sync"), (3, "async")])
def test_fit_returns_the_same_result_on_every_rank(fit_runs, np, mode):
    out, results = fit_runs(np, mode)
    run_dir = out / "run"
    first = results[0]
    for rank, result in enumerate(results[1:], start=1):
        for key in ("history", "final", "run_dir", "log_path", "checkpoint_path"):
            assert result[key] == first[key], f"rank {rank}'s {key} differs from rank 0's"
    history = first["history"]
    assert [h["epoch"] for h in history] == [1, 2, 3, 4, 5, 6] and first["final"] == history[-1]
    assert {"epoch", "train_loss", "test_loss", "train_acc", "test_acc", "samples_per_sec",
            "epoch_seconds", "wall_seconds", "lr"} <= set(history[-1])  # FitResult's fields
    assert history[-1]["test_acc"] >= 0.95, history[-1]
    assert history[-1]["train_loss"] < history[0]["train_loss"] / 3
    assert first["run_dir"] == str(run_dir)
    assert first["checkpoint_path"] == str(run_dir / "checkpoint.pt")
    # Every worker has its trained replica (back in training mode); a server has none.
    workers = np - 1 if mode == "async" else np
    assert [r["has_model"] for r in results] == [True] * workers + [False] * (np - workers)
    assert all(r["model_training"] for r in results[:workers])
    assert len(first["parameters"]) == 11 and len(first["buffers"]) == 9  # 3 BatchNorms
    # Worker 0's weights are the checkpoint's: in sync mode every replica's are. (In async
    # mode worker 0 pulled the servers' final parameters to score and save them; another
    # worker keeps the ones it last pulled.)
    state = checkpoint.load(run_dir)
    assert state["epoch"] == 6
    saved = {name: digest(state["model"][name]) for name in first["parameters"]}
    assert first["parameters"] == saved
    if mode == "sync":
        assert all(r["parameters"] == saved for r in results)
        # the returned model trains again (Horovod's hooks from the first fit had failed it)
        assert all(r["again"]["epoch"] == 1 and r["again"]["test_acc"] >= 0.9 for r in results)
    # The history is what the log says.
    _, epochs, _ = logged(run_dir)
    assert [(e["train_loss"], e["test_loss"], e["test_acc"]) for e in epochs] == [
        (h["train_loss"], h["test_loss"], h["test_acc"]) for h in history]


def digest(tensor: torch.Tensor) -> str:
    """As fit_script.py's digests: the sha256 of the tensor's bytes."""
    return hashlib.sha256(tensor.detach().cpu().contiguous().numpy().tobytes()).hexdigest()


# Each rank's BatchNorm statistics come from its own batches; hvdtrain averages them before every
# evaluation and checkpoint, so the replicas end equal and the checkpoint is the model scored.
def test_sync_replicas_end_with_the_same_batchnorm_statistics(fit_runs):
    _, results = fit_runs(2, "sync")
    assert results[0]["buffers"] == results[1]["buffers"]


# --- 3. regression: float targets, --loss mse, no accuracy ------------------------------------

def test_regression_with_mse_on_the_users_data(tmp_path):
    proc = run(mpirun(2, *hvdtrain("train", "--dataset", f"{DATA}:regression",
                                   "--model", f"{MODELS}:regressor", "--loss", "mse",
                                   "--epochs", "4", *QUIET, "--run-dir", str(tmp_path))), cwd=REPO)
    header, epochs, _ = logged(tmp_path)
    assert header["dataset"].startswith(f"{DATA}:regression: 768 train / 256 test samples, "
                                        "input 8")
    assert "classes" not in header["dataset"]  # float targets: no class count
    losses = [e["train_loss"] for e in epochs]
    assert len(losses) == 4 and all(math.isfinite(v) for v in losses)
    assert all(b < a for a, b in zip(losses, losses[1:])), losses
    assert losses[-1] < losses[0] / 4
    assert epochs[-1]["test_loss"] < epochs[0]["test_loss"] / 2
    for e in epochs:
        assert "train_loss" in e and e["test_loss"] is not None
        assert not [k for k in e if "acc" in k], e
    assert "done: test loss" in proc.stdout and "acc" not in proc.stdout


# --- 4. an IterableDataset without __len__: every worker runs the same number of steps ---------

def test_a_stream_without_len_gives_every_worker_the_same_steps(tmp_path):
    """The steps come from --max-steps-per-epoch; the loss is the user's own (by file path), so the
    log has no accuracy. The test split is a stream with __len__."""
    steps = 10
    run(mpirun(2, *hvdtrain("train", "--dataset", f"{DATA}:digits_stream",
                            "--max-steps-per-epoch", str(steps),
                            "--loss", f"{LOSSES}:smoothed_cross_entropy", "--epochs", "2",
                            "--log-steps", *QUIET, "--run-dir", str(tmp_path))), cwd=REPO)
    header, epochs, step_lines = logged(tmp_path)
    assert header["steps_per_epoch"] == steps and header["num_workers"] == 2
    assert header["dataset"].startswith(f"{DATA}:digits_stream: ")
    assert "input 1x8x8, 10 classes" in header["dataset"]  # from the stream's attributes
    assert [(e["epoch"], e["step"]) for e in epochs] == [(1, steps), (2, 2 * steps)]
    assert [s["step"] for s in step_lines] == list(range(1, 2 * steps + 1))
    assert [s["epoch"] for s in step_lines] == [1] * steps + [2] * steps
    assert epochs[-1]["train_loss"] < epochs[0]["train_loss"]
    assert epochs[-1]["test_loss"] is not None  # the sized test stream was scored
    assert not [k for e in epochs for k in e if "acc" in k]  # a user's loss: no accuracy


# --- 5 and 6. a map-style Dataset through the DataLoader, with loader processes (forkserver) ----

LOADER_FLAGS = ["--epochs", "2", "--log-steps", *QUIET]


@pytest.fixture(scope="module")
def loader_run(tmp_path_factory):
    """The digits as the user's map-style Dataset, read by 2 loader processes per worker under
    mpirun -np 2: (the run folder, the folder where each reading process left a file)."""
    root = tmp_path_factory.mktemp("loader")
    readers = root / "readers"
    readers.mkdir()
    run(mpirun(2, *hvdtrain("train", "--dataset", f"{DATA}:digits_recording",
                            "--dataset-args", json.dumps({"folder": str(readers)}),
                            "--data-workers", "2", *LOADER_FLAGS, "--run-dir", str(root / "run"))),
        cwd=REPO, timeout=180)  # a hung loader process fails here
    return root / "run", readers


def test_loader_processes_read_a_map_style_dataset_and_end(loader_run):
    run_dir, readers = loader_run
    header, epochs, _ = logged(run_dir)
    assert [e["epoch"] for e in epochs] == [1, 2] and header["steps_per_epoch"] == DIGITS_STEPS
    assert header["dataset"].startswith(f"{DATA}:digits_recording: 1437 train / 360 test samples, "
                                        "input 1x8x8, 10 classes")
    assert epochs[-1]["train_loss"] < epochs[0]["train_loss"]
    # The loader processes read the samples, the same ones in both epochs (persistent): for
    # training, 2 ranks x 2 processes; for the test split, whose 180-sample share per rank is
    # one evaluation batch, the first process of each rank's test loader.
    by_kind: dict[tuple[str, str], set[int]] = {}
    parents: dict[int, int] = {}
    for file in readers.iterdir():
        tag, pid, kind, parent = file.name.split("-")
        by_kind.setdefault((tag, kind), set()).add(int(pid))
        parents[int(pid)] = int(parent)
    listing = sorted(f.name for f in readers.iterdir())
    assert len(by_kind.get(("train", "loader"), ())) == 4, listing
    assert len(by_kind.get(("test", "loader"), ())) == 2, listing
    # Started by a forkserver, not forked from a training process (MPI is running there).
    trainers = by_kind[("train", "main")]
    assert len(trainers) == 2, listing
    assert not {parents[pid] for pid in by_kind[("train", "loader")]} & trainers, listing
    # The job ended, and with it every loader process.
    loaders = by_kind[("train", "loader")] | by_kind[("test", "loader")]
    deadline = time.monotonic() + 15
    while (alive := [pid for pid in loaders if _running(pid)]) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not alive, f"loader processes {alive} outlived the job"


def _running(pid: int) -> bool:
    """Whether ``pid`` is a process that has not exited (a zombie has)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def test_a_users_dataset_gives_the_step_losses_of_the_builtin_digits(tmp_path, loader_run):
    """The DataLoader path (the user's Dataset over the same split, loader processes included)
    and the in-memory path (--dataset digits) train on the same batches: the same losses."""
    builtin = tmp_path / "builtin"
    run(mpirun(2, *hvdtrain("train", "--dataset", "digits", *LOADER_FLAGS,
                            "--run-dir", str(builtin))))
    in_memory, loader = logged(builtin), logged(loader_run[0])
    a, b = [s["loss"] for s in in_memory[2]], [s["loss"] for s in loader[2]]
    assert len(a) == len(b) == 2 * DIGITS_STEPS
    worst = max(abs(x - y) for x, y in zip(a, b))
    assert worst < 1e-6, f"per-step losses differ by up to {worst}"
    for mine, theirs in zip(in_memory[1], loader[1]):
        assert mine["test_acc"] == pytest.approx(theirs["test_acc"], abs=1e-9)
        assert mine["test_loss"] == pytest.approx(theirs["test_loss"], abs=1e-6)


# --- 7. bad imports and bad returns: exit 2, one message, no traceback of hvdtrain's ------------

USER_ABS = str(USER)
ERRORS = {
    "missing .py file": (
        ["--model", "tests/helpers/user/no_such_net.py:build"],
        ["--model tests/helpers/user/no_such_net.py:build: no such file",
         f"{USER_ABS}/no_such_net.py", "give the path of a .py file"]),
    "missing module": (
        ["--model", "no_such_package.nets:build"],
        ["--model no_such_package.nets:build: no module named 'no_such_package'",
         "add that folder to PYTHONPATH", "path/to/no_such_package/nets.py:build"]),
    "missing attribute": (
        ["--model", f"{MODELS}:biuld"],
        [f"--model {MODELS}:biuld: ", f"({USER_ABS}/residual_net.py) has no attribute 'biuld'",
         "did you mean 'build'?", "fix the name after the ':'"]),
    "not callable": (
        ["--model", f"{MODELS}:NOT_CALLABLE"],
        [f"--model {MODELS}:NOT_CALLABLE: 'NOT_CALLABLE' is an int, not a function or class",
         "name a function or class after the ':'"]),
    "model factory returns a dict": (
        ["--model", f"{MODELS}:not_a_model"],
        [f"--model {MODELS}:not_a_model returned a dict, expected a torch.nn.Module",
         "return the model instance"]),
    "dataset factory returns one dataset": (
        ["--dataset", f"{DATA}:single_dataset"],
        [f"--dataset {DATA}:single_dataset returned a TaggedDigits, expected a pair "
         "(train, test)", "return (train, test)"]),
    "dataset factory returns a triple": (
        ["--dataset", f"{DATA}:triple"],
        ["--dataset", "the training data is a tuple of 3 item(s)",
         "pass a pair (x, y) of tensors"]),
    "--model-args with a bad keyword": (
        ["--model", MODEL, "--model-args", '{"depth": 3}'],
        [f"--model-args: {MODEL} is build(input_shape, num_classes, width=32), which cannot be "
         "called with input_shape, num_classes, depth", "give only parameters it names"]),
    "mse on class labels": (
        ["--model", MODEL, "--loss", "mse"],
        ["--loss mse: the model's output is (2, 10) torch.float32 and the target (2,) "
         "torch.int64, shapes that differ", "for class labels pass --loss cross_entropy"]),
    "cross_entropy (the default) on real-valued targets": (  # would train nothing, loss 0
        ["--dataset", f"{DATA}:regression", "--model", f"{MODELS}:regressor"],
        ["--loss cross_entropy: the model's output is (2, 1) torch.float32 and the target "
         "(2, 1) torch.float32", "--loss mse"]),
    "--stages 2 with a model that is no Sequential": (
        ["--model", MODEL, "--stages", "2"],
        ["--stages: ResidualNet is not an nn.Sequential and has no `layers` Sequential",
         "use --stages 1"]),
    "a stream without __len__ and no step count": (
        ["--dataset", f"{DATA}:digits_stream"],
        ["DigitsStream is a stream without __len__", "pass --max-steps-per-epoch"]),
    "user module raises on import": (
        ["--model", "tests/helpers/user/raises_on_import.py:build"],
        ["--model tests/helpers/user/raises_on_import.py:build: importing "
         "tests/helpers/user/raises_on_import.py raised KeyError: 'depth' "
         f"(at {USER_ABS}/raises_on_import.py:4, traceback above)"]),
}
USER_TRACEBACK = "user module raises on import"

# Found while writing these tests and fixed in hvdtrain since: the same checks.
GAPS = {
    "a model whose forward raises on the first batch": (
        ["--model", f"{MODELS}:broken_forward"],
        [f"--model {MODELS}:broken_forward", "RuntimeError: shape '[-1, 65]' is invalid"]),
    "--sync-batchnorm on CPU": (
        ["--model", MODEL, "--sync-batchnorm", "--device", "cpu"],
        ["--sync-batchnorm"]),
}


@pytest.fixture(scope="module")
def error_runs(tmp_path_factory):
    """Every case of ERRORS and GAPS as `hvdtrain train ...` of a single process without a
    launcher: {case: (run folder, finished process)}. One launch for all: each case is the console
    script in a process forked from one that has imported torch (tests/helpers/forked_cli.py);
    15 processes of their own spent most of their seconds each importing torch."""
    root = tmp_path_factory.mktemp("errors")
    cases = {**ERRORS, **GAPS}
    run_dirs = [root / str(index) for index in range(len(cases))]
    procs = run_forked([["train", *flags, "--epochs", "1", *QUIET, "--run-dir", str(run_dir)]
                        for (flags, _), run_dir in zip(cases.values(), run_dirs)],
                       root / "cases", cwd=REPO)
    return dict(zip(cases, zip(run_dirs, procs)))


def check_exit_2_with_one_message(run_dir: Path, proc, fragments: list[str],
                                  user_frame: str | None) -> None:
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.count("hvdtrain: error: ") == 1, proc.stderr[-3000:]
    message = proc.stderr[proc.stderr.index("hvdtrain: error: "):]
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    assert not run_dir.exists(), "bad input must fail before the run writes anything"
    if user_frame is None:
        assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
        return
    before = proc.stderr[:proc.stderr.index("hvdtrain: error: ")]
    assert before.startswith("Traceback (most recent call last):"), before
    assert user_frame in before, before
    assert f"{REPO / 'hvdtrain'}{os.sep}" not in before, before  # only the user's frames
    assert "importlib" not in before, before


@pytest.mark.parametrize("case", list(ERRORS))
def test_bad_user_code_exits_2_with_one_message(error_runs, case):
    run_dir, proc = error_runs[case]
    _, fragments = ERRORS[case]
    user_frame = (f'File "{USER_ABS}/raises_on_import.py", line 4, in <module>'
                  if case == USER_TRACEBACK else None)
    check_exit_2_with_one_message(run_dir, proc, fragments, user_frame)
    if case == USER_TRACEBACK:
        assert 'WIDTH = SETTINGS["depth"]' in proc.stderr and "KeyError: 'depth'" in proc.stderr


@pytest.mark.parametrize("case", list(GAPS))
def test_more_bad_inputs_exit_2_with_one_message(error_runs, case):
    run_dir, proc = error_runs[case]
    _, fragments = GAPS[case]
    if case == "--sync-batchnorm on CPU" and proc.returncode == 0:
        return  # also a fix: SyncBatchNorm that works on CPU
    user_frame = (f'File "{USER_ABS}/residual_net.py", line' if "forward" in case else None)
    check_exit_2_with_one_message(run_dir, proc, fragments, user_frame)


@pytest.mark.parametrize("case, spec", [
    ("dataset factory returns a triple", f"--dataset {DATA}:triple"),
    ("a stream without __len__ and no step count", f"--dataset {DATA}:digits_stream"),
])
def test_a_bad_dataset_message_names_the_datasets_spec(error_runs, case, spec):
    _, proc = error_runs[case]
    assert proc.returncode == 2 and spec in proc.stderr, proc.stderr[-3000:]
