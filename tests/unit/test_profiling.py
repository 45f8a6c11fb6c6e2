"""--profile-steps: torch.profiler over a window of a worker's steps (loop/profiling.py), in the
training loop of one process (test_trainer.py's scheme)."""

from __future__ import annotations

import json

import pytest

from hvdtrain.config import Config, ConfigError
from hvdtrain.config.values import parse_profile_steps
from test_trainer import make_trainer

# 200 training samples, --batch-size 16: 12 whole steps an epoch


def window_files(folder):
    return sorted(p.name for p in folder.glob("profile-*"))


def test_a_window_is_written_with_its_steps_operators_and_timeline(tmp_path):
    trainer = make_trainer(tmp_path, profile_steps="3:6")
    trainer.fit()
    assert window_files(tmp_path) == ["profile-rank0-steps3-6.json", "profile-rank0-steps3-6.txt"]
    text = (tmp_path / "profile-rank0-steps3-6.txt").read_text()
    assert text.startswith("hvdtrain profile: rank 0, steps 4: ")
    operators = float(text.split("per step: ")[1].split(" operators")[0])
    # a forward, a backward and an SGD step of a two-layer MLP: dozens of operators, and the
    # same in every step, so that a window of 4 steps counts 4 times one step's
    assert 20 < operators < 400 and operators * 4 == int(operators * 4)
    assert "aten::addmm" in text and "operators by their own CPU time" in text
    assert "GPU" not in text  # a CPU run records no GPU activity
    trace = json.loads((tmp_path / "profile-rank0-steps3-6.json").read_text())
    assert any(e.get("name") == "aten::addmm" for e in trace["traceEvents"])


def test_a_window_that_crosses_an_epoch_holds_the_epoch_end_and_counts_each_step_once(tmp_path):
    trainer = make_trainer(tmp_path, profile_steps="11:14", epochs=2)  # epoch 1 ends after 12
    trainer.fit()
    text = (tmp_path / "profile-rank0-steps11-14.txt").read_text()
    assert "steps 4: " in text


def test_a_run_that_ends_inside_the_window_writes_the_steps_it_recorded(tmp_path):
    trainer = make_trainer(tmp_path, profile_steps="20:40", epochs=2)  # 24 steps in all
    trainer.fit()
    assert window_files(tmp_path) == ["profile-rank0-steps20-24.json",
                                      "profile-rank0-steps20-24.txt"]
    assert "steps 5: " in (tmp_path / "profile-rank0-steps20-24.txt").read_text()


def test_a_window_past_the_run_writes_nothing_and_says_so(tmp_path, capsys):
    make_trainer(tmp_path, profile_steps="30:40", epochs=2).fit()
    assert window_files(tmp_path) == []
    assert "hvdtrain: --profile-steps 30:40: this process took 24 steps, so nothing was " \
           "profiled" in capsys.readouterr().out


def test_a_second_profile_of_the_same_window_keeps_the_first(tmp_path):
    make_trainer(tmp_path / "a", profile_steps="2:3", epochs=1).fit()  # then resumed
    first = (tmp_path / "a" / "profile-rank0-steps2-3.txt").read_text()
    make_trainer(tmp_path / "a", profile_steps="2:3", epochs=2,
                 resume=str(tmp_path / "a")).fit()
    assert (tmp_path / "a" / "profile-rank0-steps2-3.txt").read_text() == first
    assert (tmp_path / "a" / "profile-rank0-steps2-3-2.txt").exists()
    assert (tmp_path / "a" / "profile-rank0-steps2-3-2.json").exists()


@pytest.mark.parametrize("spec", ["1:5", "5:4", "x:5", "5:", ":5", "0", "3:5:7"])
def test_a_bad_window_is_refused_with_what_to_pass(spec):
    with pytest.raises(ConfigError, match="--profile-steps.*FIRST:LAST.*2 <= FIRST <= LAST"):
        Config.from_overrides({"profile_steps": spec}).validate()


def test_a_single_step_window_reads_as_that_step():
    assert parse_profile_steps("7") == (7, 7)
    assert parse_profile_steps("2:9") == (2, 9)


def test_a_profiler_that_fails_costs_the_profile_not_the_run(tmp_path, monkeypatch, capsys):
    import torch.profiler

    class Broken:
        def __init__(self, **kwargs):
            pass

        def start(self):
            raise RuntimeError("CUPTI is not available")

    monkeypatch.setattr(torch.profiler, "profile", Broken)
    history = make_trainer(tmp_path, profile_steps="3:6").fit()
    assert len(history) == 2 and window_files(tmp_path) == []
    assert "--profile-steps: profiling failed on rank 0 (RuntimeError: CUPTI is not available); " \
        "training goes on without it" in capsys.readouterr().err


def test_the_gpu_lines_read_a_profile_with_no_gpu_activity_as_zeros():
    """The CUDA branch's own code, run on a CPU profile (a GPU's activity needs a device): the
    counts by name and the device events' busy time come out as zeros, not as an error."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from hvdtrain.loop.profiling import summarize

    model = torch.nn.Linear(8, 2)
    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        for _ in range(2):
            model(torch.randn(4, 8)).sum().backward()
    text = summarize(profiler, 2, 0.01, cuda=True)
    assert "per step on the GPU: 0.0 kernel launches, 0.0 synchronizations with the GPU, " \
        "0.0 copies" in text
    assert "GPU busy 0.000 ms a step (0% of the wall time" in text
    assert "operators by their own GPU time:" in text and "aten::addmm" in text


def test_a_loop_of_its_own_drives_the_window_as_the_gpu_hand_loop_does(tmp_path, capsys):
    """scripts/gpu/hand_loop.py profiles its warm-up with this hook: after_step per step, close
    at the end, its own name in the text."""
    import torch

    from hvdtrain.loop.profiling import ProfileWindow

    window = ProfileWindow("2:3", lambda: tmp_path, 0, cuda=False, who="hand loop")
    model = torch.nn.Linear(8, 2)
    for _ in range(5):
        model(torch.randn(4, 8)).sum().backward()
        window.after_step(None)
    window.close()
    assert window_files(tmp_path) == ["profile-rank0-steps2-3.json", "profile-rank0-steps2-3.txt"]
    assert (tmp_path / "profile-rank0-steps2-3.txt").read_text().startswith(
        "hand loop profile: rank 0, steps 2: ")
    assert "hand loop: profile of 2 steps written to" in capsys.readouterr().out
