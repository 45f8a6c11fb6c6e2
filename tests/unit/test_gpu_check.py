"""The GPU check (scripts/gpu/check.sh) runs only on a device machine, so its pieces are checked
here, where they can drift: its shell is valid, every step it runs is defined and exported, the
tests it runs are every CUDA-gated test, the scripts it names exist, and the bundle it carries
pins the Horovod version that scripts/setup builds."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GPU = REPO / "scripts" / "gpu"
SHELL = [GPU / "check.sh", GPU / "check_steps.sh", GPU / "make_bundle.sh"]


def load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("script", SHELL, ids=lambda p: p.name)
def test_shell_parses(script):
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_every_step_is_defined_and_exported():
    check = (GPU / "check.sh").read_text()
    defined = set(re.findall(r"^(\w+)\(\) \{", (GPU / "check_steps.sh").read_text(), re.M))
    exported = set(re.search(r"export -f ((?:[^\n]*\\\n)*[^\n]*)", check).group(1)
                   .replace("\\", " ").split())
    assert defined == exported, "check.sh's `export -f` must list check_steps.sh's functions"
    called = set(re.findall(r"^\s*(?:if ! )?step [\w-]+ \S+ (\w+)", check, re.M))
    assert called and called <= defined | {"python"}, called - defined


def test_named_files_exist():
    text = "\n".join(p.read_text() for p in SHELL)
    named = set(re.findall(r"\$repo/((?:scripts|tests)/[\w./-]+\.(?:py|sh))", text))
    assert {"scripts/bench_gpu.py", "scripts/setup/build_horovod.sh"} <= named
    assert [n for n in named if not (REPO / n).is_file()] == []
    assert (GPU / "hand_loop.py").is_file()


def test_cuda_tests_lists_every_gated_test_file():
    ids = load(GPU / "cuda_tests.py", "cuda_tests").cuda_test_ids(REPO / "tests")
    gated_files = {p.relative_to(REPO).as_posix() for p in (REPO / "tests").rglob("test_*.py")
                   if "not torch.cuda.is_available()" in p.read_text()}
    assert gated_files, "no CUDA-gated test found: the check would run none"
    assert {i.split("::")[0] for i in ids} == gated_files
    for node in ids:
        path, *names = node.split("::")
        assert f"def {names[-1]}(" in (REPO / path).read_text(), node


def test_bundle_pins_the_setup_horovod_version():
    build = (REPO / "scripts" / "setup" / "build_horovod.sh").read_text()
    pinned = re.search(r"^HOROVOD_VERSION=([\d.]+)$", build, re.M).group(1)
    pyproject = (REPO / "pyproject.toml").read_text()
    assert f'"horovod=={pinned}"' in pyproject
    # make_bundle.sh and check_steps.sh both read the version with this sed expression.
    for script in (GPU / "make_bundle.sh", GPU / "check_steps.sh"):
        assert "sed -n 's/^HOROVOD_VERSION=//p'" in script.read_text(), script.name
    manifest = REPO / "build" / "gpu-bundle" / "MANIFEST.txt"
    if manifest.exists():  # a bundle made here must match today's pin
        assert f"horovod_version={pinned}" in manifest.read_text().splitlines()
        assert f"horovod-{pinned}.tar.gz" in manifest.read_text()


def test_bundle_folder_is_ignored_by_git():
    proc = subprocess.run(["git", "-C", str(REPO), "check-ignore", "-q", "build/gpu-bundle/x"])
    assert proc.returncode == 0, "build/ must be in .gitignore: the bundle is ~50 MB of wheels"


def test_variant_rows_give_ratios_of_medians():
    sys.path.insert(0, str(REPO / "scripts"))
    bench = load(REPO / "scripts" / "bench_gpu.py", "bench_gpu")
    results = {("hand", "cuda"): [100.0, 300.0], ("sync", "cuda"): [190.0],
               ("async", "cuda"): ["failed (output above)"],
               ("sync", "cuda", "--precision", "bf16"): [380.0],
               ("sync", "cuda", "--compile"): [95.0]}
    rows = {row[0]: row for row in bench.variant_rows(results)}
    assert rows["sync / hand loop"][2] == "0.95"
    assert rows["async / hand loop"][1:] == ["failed", "-"]
    assert rows["sync bf16 / float32"][2] == "2.00"
    assert rows["sync compile / eager"][2] == "0.50"


def test_bench_flags_in_check_parse():
    line = re.search(r'bench_gpu\.py"? ([^\n]*)', (GPU / "check.sh").read_text()).group(1)
    sys.path.insert(0, str(REPO / "scripts"))
    args = load(REPO / "scripts" / "bench_gpu.py", "bench_gpu").parse_args(line.split())
    assert args.no_cpu and args.rounds == 1


def test_flops_note_averages_the_timed_epochs_and_is_empty_without_tflops():
    sys.path.insert(0, str(REPO / "scripts"))
    bench = load(REPO / "scripts" / "bench_gpu.py", "bench_gpu")
    epochs = [{"type": "epoch", "tflops": 1.0, "mfu": 0.1},  # warm-up, left out
              {"type": "epoch", "tflops": 2.0, "mfu": 0.2},
              {"type": "epoch", "tflops": 4.0, "mfu": 0.4}]
    assert bench.flops_note(epochs) == " (3 TFLOP/s, MFU 0.300)"
    assert bench.flops_note([{**e, "mfu": None} for e in epochs][:1]) == ""
    no_peak = [{"type": "epoch", "tflops": 5.0}, {"type": "epoch", "tflops": 5.0}]
    assert bench.flops_note(no_peak) == " (5 TFLOP/s)"
    assert bench.flops_note([{"type": "epoch"}, {"type": "epoch"}]) == ""


def test_no_async_skips_the_async_runs_and_says_so(monkeypatch):
    sys.path.insert(0, str(REPO / "scripts"))
    bench = load(REPO / "scripts" / "bench_gpu.py", "bench_gpu")
    launched = []
    monkeypatch.setattr(bench, "pinned_bandwidth", lambda mib, repeats: (1e10, 1e10))
    monkeypatch.setattr(bench, "hand_loop", lambda workers, args, profile=None: 200.0)

    def train(mode, device, workers, args, extra=(), profile=None):
        launched.append((mode, device, *extra))
        return [{"type": "epoch", "samples_per_sec": 100.0}] * 3

    monkeypatch.setattr(bench, "train", train)
    results: dict = {}
    bench.run_round(1, bench.parse_args(["--no-cpu", "--no-async"]), results)
    assert launched == [("sync", "cuda"), ("sync", "cuda", "--precision", "bf16"),
                        ("sync", "cuda", "--compile")]
    rows = {row[0]: row for row in bench.variant_rows(results)}
    assert rows["async / hand loop"][1:] == ["not run", "-"]
    assert rows["sync / hand loop"][2] == "0.50"
    launched.clear()
    bench.run_round(1, bench.parse_args(["--no-cpu"]), {})
    assert ("async", "cuda") in launched and ("async", "cpu") not in launched


def test_the_async_gpu_rows_and_issue_43s_goals(monkeypatch):
    """The async variants run once each (the server on the GPU, async DiLoCo H=32 with the
    server on the GPU and on the CPU); only plain async's copies count against the bound; the
    goal lines say met, NOT met, or no figure."""
    sys.path.insert(0, str(REPO / "scripts"))
    bench = load(REPO / "scripts" / "bench_gpu.py", "bench_gpu")
    launched = []
    monkeypatch.setattr(bench, "pinned_bandwidth", lambda mib, repeats: (4e9, 4e9))
    monkeypatch.setattr(bench, "hand_loop", lambda workers, args, profile=None: 1000.0)
    rates = {(): 100.0, ("--server-device", "cuda"): 400.0}

    def train(mode, device, workers, args, extra=(), profile=None):
        launched.append((mode, device, *extra))
        rate = rates.get(extra, 950.0 if "--local-steps" in extra else 500.0)
        epoch = {"type": "epoch", "samples_per_sec": rate, "epoch_seconds": 1.0,
                 "device_copy_seconds": 0.3, "device_copy_bytes": 1, "device_copy_wait_seconds": 0}
        return [{"type": "header", "steps_per_epoch": 100, "num_parameters": 1_000_000},
                *[epoch] * 3]

    monkeypatch.setattr(bench, "train", train)
    results: dict = {}
    bench.run_round(1, bench.parse_args(["--no-cpu"]), results)
    for flags in bench.ASYNC_VARIANTS.values():
        assert launched.count(("async", "cuda", *flags)) == 1
    assert len(results["copies"]) == 1  # plain async's alone
    rows = {row[0]: row for row in bench.variant_rows(results)}
    assert rows["async, server on the GPU / hand loop"][2] == "0.40"
    assert rows["async DiLoCo H=32, server on the GPU / hand loop"][2] == "0.95"
    goals = bench.goal_lines(results, 1)
    assert goals[0] == "goal: async DiLoCo H=32, server on the GPU / hand loop >= 0.9: 0.95 (met)"
    # bound: 2 x 4 MB at 4 GB/s = 2 ms of a 10 ms step, 0.2; measured 0.3: 1.50
    assert goals[1] == "goal: plain async's copies / their bandwidth bound <= 2: 1.50 (met)"
    assert bench.goal_lines({}, 1)[0].endswith(": - (no figure)")


def test_the_first_round_profiles_the_hand_loop_sync_and_async_diloco(monkeypatch):
    """One DiLoCo round's worth of warm-up steps ending on a round's push; only the first
    round profiles; the last lines give each summary's figures, or say none was written."""
    sys.path.insert(0, str(REPO / "scripts"))
    bench = load(REPO / "scripts" / "bench_gpu.py", "bench_gpu")
    assert bench.profile_window(bench.parse_args([])) == "161:192"  # 200 steps an epoch
    assert bench.profile_window(bench.parse_args(["--steps", "70"])) == "33:64"
    assert bench.profile_window(bench.parse_args(["--steps", "40"])) is None  # 1:32 holds step 1
    monkeypatch.setattr(bench, "pinned_bandwidth", lambda mib, repeats: (4e9, 4e9))
    profiled = []

    def summary(name):
        return f"{name}: steps 32: 1.500 ms a step (wall)\nper step: 80.0 operators\n\ntable"

    def hand_loop(workers, args, profile=None):
        if profile is not None:
            profiled.append("hand")
            profile["text"] = summary("hand")
        return 1000.0

    def train(mode, device, workers, args, extra=(), profile=None):
        if profile is not None:
            profiled.append((mode, *extra))
            if mode == "sync":  # the DiLoCo run wrote none
                profile["text"] = summary("sync")
        return [{"type": "epoch", "samples_per_sec": 500.0}] * 3

    monkeypatch.setattr(bench, "hand_loop", hand_loop)
    monkeypatch.setattr(bench, "train", train)
    results: dict = {}
    args = bench.parse_args(["--no-cpu"])
    bench.run_round(1, args, results)
    assert profiled == [("sync",), ("async", *bench.DILOCO), "hand"]
    bench.run_round(1, args, results)
    assert len(profiled) == 3
    assert bench.profile_lines(results) == [
        "profiles of 32 warm-up steps (first round):",
        "  hand loop: hand: steps 32: 1.500 ms a step (wall)", "    per step: 80.0 operators",
        "  sync: sync: steps 32: 1.500 ms a step (wall)", "    per step: 80.0 operators",
        "  async DiLoCo H=32, server on the CPU: none written"]
