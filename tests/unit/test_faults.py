"""--inject-faults: the schedule's text, and the hook that fires each fault once per job."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hvdtrain.config import ConfigError, check_faults
from hvdtrain.faults import actions
from hvdtrain.faults.inject import FaultInjector
from hvdtrain.faults.schedule import Fault, parse_faults
from hvdtrain.loop.hooks import StepResult
from hvdtrain.scheme import Progress


def test_schedule_parses_every_kind_and_several_events():
    faults = parse_faults("kill:rank=2,step=40; stop:rank=1,step=80,seconds=20;"
                          "slow:rank=1,steps=10-40,factor=4;exception:rank=0,step=5")
    assert faults == [Fault("kill", 2, 40), Fault("stop", 1, 80, seconds=20.0),
                      Fault("slow", 1, 10, 40, factor=4.0), Fault("exception", 0, 5)]
    assert [parse_faults(f.text()) for f in faults] == [[f] for f in faults]  # round trip
    assert parse_faults("") == parse_faults("none") == []


@pytest.mark.parametrize("bad", ["kill:rank=2", "boom:rank=1,step=3", "kill:rank=a,step=3",
                                 "kill:rank=1,step=0", "slow:rank=1,steps=5-2,factor=2",
                                 "slow:rank=1,steps=1-2,factor=0.5", "stop:rank=1,step=2,seconds=0",
                                 "kill rank=1 step=2", "kill:rank=1,step=2,extra=1"])
def test_bad_schedule_is_a_config_error_that_says_how_to_write_it(bad):
    with pytest.raises(ConfigError, match=r"--inject-faults: .*write it as kind:rank=R,step=S"):
        check_faults(bad)


def _steps(hook, first, last, seconds=0.0):
    for before in range(first, last):
        hook.after_step(StepResult(Progress(global_step=before), 0.0, seconds))


def test_exception_fires_once_on_its_rank_and_is_recorded(tmp_path):
    other = FaultInjector("exception:rank=1,step=3", tmp_path)
    other.bind_world(0, 2)
    _steps(other, 0, 10)  # rank 0 is not the target
    hook = FaultInjector("exception:rank=1,step=3", tmp_path)
    hook.bind_world(1, 2)
    _steps(hook, 0, 2)
    with pytest.raises(actions.InjectedFault, match="injected fault: exception at rank 1"):
        _steps(hook, 2, 3)  # the third step done
    _steps(hook, 3, 10)  # not again in this process
    assert (tmp_path / actions.RECORD).read_text() == "exception:rank=1,step=3\n"


def test_a_restart_does_not_fire_it_again(tmp_path):
    (tmp_path / actions.RECORD).write_text("exception:rank=0,step=3\n")
    hook = FaultInjector("exception:rank=0,step=3", tmp_path)  # resumed before the step
    hook.bind_world(0, 1)
    _steps(hook, 1, 10)


def test_a_resume_past_the_step_does_not_fire_it(tmp_path):
    hook = FaultInjector("exception:rank=0,step=3", tmp_path)
    hook.bind_world(0, 1)
    _steps(hook, 3, 10)  # resumed from a checkpoint at step 3
    assert not (tmp_path / actions.RECORD).exists()


def test_async_steps_that_skip_the_fault_step_still_fire_it(tmp_path):
    hook = FaultInjector("exception:rank=0,step=4", tmp_path)
    hook.bind_world(0, 2)
    hook.after_step(StepResult(Progress(global_step=0), 0.0, 0.0))
    hook.after_step(StepResult(Progress(global_step=2), 0.0, 0.0))
    with pytest.raises(actions.InjectedFault):
        hook.after_step(StepResult(Progress(global_step=5), 0.0, 0.0))


def test_slow_stretches_only_its_steps(monkeypatch, capsys):
    slept = []
    monkeypatch.setattr("hvdtrain.faults.inject.time.sleep", slept.append)
    hook = FaultInjector("slow:rank=0,steps=2-3,factor=4")
    hook.bind_world(0, 1)
    _steps(hook, 0, 5, seconds=0.5)
    assert slept == [1.5, 1.5]
    # said once as it begins and once as it ends (it left no trace but the longer steps)
    assert capsys.readouterr().err.splitlines() == [
        "hvdtrain: injected fault slow:rank=0,steps=2-3,factor=4 slows this rank's steps",
        "hvdtrain: injected fault slow:rank=0,steps=2-3,factor=4 is over"]


def test_a_rank_without_a_training_process_is_refused():
    hook = FaultInjector("kill:rank=2,step=3")
    with pytest.raises(ConfigError, match="rank 2 is not a training process.*below 2"):
        hook.bind_world(0, 2)


@pytest.mark.parametrize("bad, named", [
    ("kill:rank=1,step=2,step=5", "step is given twice (step=2 and step=5); keep one"),
    ("stop:rank=1,step=5", "missing seconds (stop takes the keys rank, seconds, step)"),
    ("kill:rank=1", "missing step (kill takes"),
    ("kill:rank=1,steps=4", "missing step; unknown steps (kill takes"),
])
def test_a_repeated_or_missing_key_is_named(bad, named):
    with pytest.raises(ConfigError, match=named.replace("(", r"\(").replace(")", r"\)")):
        check_faults(bad)


def test_a_step_past_the_end_of_the_run_is_refused_with_the_last_step():
    hook = FaultInjector("kill:rank=0,step=30;slow:rank=0,steps=31-40,factor=2", None,
                         lambda: 30)
    with pytest.raises(ConfigError, match=r"slow:rank=0,steps=31-40,factor=2 would never fire: "
                                          r"this run's last step is 30"):
        hook.bind_world(0, 1)
    FaultInjector("kill:rank=0,step=30", None, lambda: 30).bind_world(0, 1)  # the last step fires


def test_the_trainer_refuses_a_fault_after_its_last_step(tmp_path):
    from test_trainer import make_trainer
    with pytest.raises(ConfigError, match=r"exception:rank=0,step=25 would never fire: this "
                                          r"run's last step is 24"):
        make_trainer(tmp_path / "run", epochs=2, inject_faults="exception:rank=0,step=25")
    assert not (tmp_path / "run").exists()


def test_a_fault_that_fired_does_not_fire_again_after_a_resume_into_another_folder(tmp_path):
    # 12 steps an epoch: the fault at step 30 ends the first run after its epoch 2 checkpoint.
    from test_trainer import make_trainer
    from hvdtrain import checkpoint
    schedule = "exception:rank=0,step=30"
    with pytest.raises(actions.InjectedFault):
        make_trainer(tmp_path / "old", epochs=3, inject_faults=schedule).fit()
    assert checkpoint.load(tmp_path / "old")["epoch"] == 2
    resumed = make_trainer(tmp_path / "new", epochs=3, inject_faults=schedule,
                           resume=str(tmp_path / "old"))
    assert [e.epoch for e in resumed.fit()] == [3]  # used to raise the fault again at step 30
    assert actions.fired_lines(tmp_path / "new") == [schedule]
    assert checkpoint.load(tmp_path / "new")["faults_fired"] == [schedule]
    # and a resume of NEW into a third folder knows it from NEW's checkpoint
    (tmp_path / "old" / actions.RECORD).unlink()
    again = make_trainer(tmp_path / "third", epochs=4, inject_faults=schedule,
                         resume=str(tmp_path / "new"))
    assert actions.fired_lines(tmp_path / "third") == [] and again.fit()
    assert actions.fired_lines(tmp_path / "third") == [schedule]


def test_a_stopped_rank_still_wakes_when_its_process_group_is_signalled():
    """A `stop` fault freezes the process; a SIGTERM to its process group meanwhile (Ctrl-C, a
    scheduler) must not end the helper that wakes it, or the process stays stopped for good."""
    script = "from hvdtrain.faults.actions import freeze; freeze(1.0); print('woke', flush=True)"
    frozen = subprocess.Popen([sys.executable, "-c", script], start_new_session=True,
                              stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while Path(f"/proc/{frozen.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
            assert time.monotonic() < deadline, "the fault never stopped the process"
            time.sleep(0.01)
        os.killpg(frozen.pid, signal.SIGTERM)
        assert frozen.wait(timeout=20) == -signal.SIGTERM  # woken, then ended by the signal
    finally:
        if frozen.poll() is None:
            os.killpg(frozen.pid, signal.SIGKILL)
            frozen.wait()
