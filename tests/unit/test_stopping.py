"""The stopping component (loop/stopping.py) on its own: each verdict, who wins when two reasons
meet, what each means for the exit, and the stop line each writes. No trainer, no MPI: a scheme
that answers the stop agreement as told."""

from __future__ import annotations

import errno
import io
import pickle
import signal
import sys

import pytest

from hvdtrain.config import ConfigError, RunConfig
from hvdtrain.loop import TrainingError, preemption
from hvdtrain.loop.clock import TrainingClock
from hvdtrain.loop.divergence import RISE, DivergenceWatch
from hvdtrain.loop.hooks import StepResult
from hvdtrain.loop.preemption import StopSignals
from hvdtrain.loop.stopping import (EARLY_STOP, NON_FINITE_LOSS, SIGNAL, TARGET, Stopping,
                                    Verdict)
from hvdtrain.loop.target import TargetStop
from hvdtrain.run_output import ProgressBar
from hvdtrain.scheme import Progress

from fake_group import OwnGroup

REACHED = (0.1, {"acc": 0.95})  # an evaluation that reaches test_acc>=0.9
SHORT = (0.1, {"acc": 0.5})


class Scheme(OwnGroup):
    """Two workers. others_stop: another worker has a stop signal (the agreement says stop, and
    at the end of training another worker was stopped); partition: who scored the evaluation."""

    lead = True

    def __init__(self, others_stop=False, partition=(0, 2)):
        self.others_stop, self.eval_partition = others_stop, partition

    def workers(self):  # lead: this process is worker 0
        return (0 if self.lead else 1), 2

    def leads(self):
        return self.lead

    def agree_to_stop(self, wants):
        return wants or self.others_stop

    def end_of_training(self):
        return self.others_stop


class Signals:
    received = None


class Best:
    stop_reason = None
    metric = None  # no --keep-best
    path = "run/best.pt"
    best = 0.9  # an evaluation gave a number, so best.pt was written


class Checkpointer:
    path, run_dir = "run/checkpoint.pt", "run"
    finished_target = None  # the resumed run's target reached (none: a fresh run)
    resumed_from = None

    def __init__(self):
        self.components = {}

    def finish_writes(self):  # nothing in flight: this one writes nothing
        pass


class Log:
    is_main = True

    def __init__(self):
        self.lines = []

    def write(self, kind, **fields):
        self.lines.append((kind, fields))


def stopping(scheme=None, epochs=4, stop_at="test_acc>=0.9"):
    run = RunConfig(epochs=epochs, stop_at=stop_at)
    clock = TrainingClock()
    clock.start()
    return Stopping(run, scheme or Scheme(), Checkpointer(), Best(),
                    TargetStop(run, ["acc"], has_test_split=True), clock, signals=Signals())


def test_nothing_to_stop_for_goes_on():
    s = stopping()
    s.evaluated(SHORT, 4)
    assert s.decide_at_step() == Verdict()
    assert s.decide_at_epoch_end(Progress(epoch=1), num_workers=2) == Verdict()
    assert not Verdict().stop and not Verdict().requeue


def test_a_signal_stops_at_the_step_and_requeues():
    s = stopping()
    s.signals.received = "SIGTERM"
    verdict = s.decide_at_step()
    assert (verdict.why, verdict.detail, verdict.at_step, verdict.agreed) == (
        SIGNAL, "SIGTERM", True, True)
    assert verdict.stop and verdict.requeue  # exit 75
    assert (verdict.preempted, verdict.target) == ("SIGTERM", None)


def test_another_workers_signal_stops_this_one_too():
    verdict = stopping(Scheme(others_stop=True)).decide_at_step()
    assert verdict.preempted == "a stop signal on another worker" and verdict.requeue


def test_a_target_reached_at_a_step_stops_there_for_good():
    s = stopping()
    s.evaluated(REACHED, 12)
    verdict = s.decide_at_step()
    assert (verdict.why, verdict.at_step, verdict.agreed, verdict.requeue) == (
        TARGET, True, True, False)  # exit 0
    assert verdict.target == "test_acc 0.95 >= 0.9 at step 12" and verdict.preempted is None
    wall, train = verdict.clock
    assert 0 <= train <= wall < 60


def test_a_signal_wins_over_a_target_at_the_same_step():
    s = stopping()
    s.evaluated(REACHED, 12)
    s.signals.received = "SIGUSR1"
    verdict = s.decide_at_step()
    assert (verdict.why, verdict.preempted, verdict.requeue) == (SIGNAL, "SIGUSR1", True)


def test_a_target_every_worker_judged_stops_after_the_epoch_without_an_agreement():
    s = stopping(Scheme(partition=(1, 2)))  # sync: every worker scored a share
    s.evaluated(REACHED, 8)
    verdict = s.decide_at_epoch_end(Progress(epoch=2, global_step=8), num_workers=2)
    assert (verdict.why, verdict.at_step, verdict.agreed, verdict.requeue) == (
        TARGET, False, False, False)
    assert s.decide_at_epoch_end(Progress(epoch=3), num_workers=2) is verdict  # it stays


@pytest.mark.parametrize("partition", [(0, 1), None])
def test_a_target_judged_by_one_worker_waits_for_the_next_steps_agreement(partition):
    s = stopping(Scheme(partition=partition))  # async: worker 0 scored it all, worker 1 nothing
    s.evaluated(REACHED if partition else None, 8)
    assert not s.decide_at_epoch_end(Progress(epoch=2), num_workers=2).stop
    assert s.decide_at_step().why == (TARGET if partition else None)


@pytest.mark.parametrize("partition", [(0, 1), (0, 2)])
def test_a_target_at_the_last_epoch_is_said_by_whoever_judged_it(partition):
    """After the last epoch nobody is left to tell: worker 0 of async says it alone."""
    s = stopping(Scheme(partition=partition), epochs=2)
    s.evaluated(REACHED, 8)
    verdict = s.decide_at_epoch_end(Progress(epoch=2), num_workers=2)
    assert (verdict.why, verdict.at_step, verdict.agreed, verdict.ran_to_end) == (
        TARGET, False, False, True)
    other = stopping(Scheme(partition=None), epochs=2)  # an async worker that scored nothing
    other.evaluated(None, 8)
    assert not other.decide_at_epoch_end(Progress(epoch=2), num_workers=2).stop


def test_patience_that_ran_out_stops_after_the_epoch():
    s = stopping()
    s.best.stop_reason = "test_acc has not improved in 2 evaluations"
    verdict = s.decide_at_epoch_end(Progress(epoch=2), num_workers=2)
    assert (verdict.why, verdict.detail, verdict.at_step, verdict.requeue) == (
        EARLY_STOP, "test_acc has not improved in 2 evaluations", False, False)


def test_where_the_epochs_start_only_patience_that_ran_out_stops():
    s = stopping(Scheme(partition=(1, 2)))
    s.evaluated(REACHED, 8)  # (an elastic reset after a step evaluation): the agreement stops it
    assert not s.decide_before_epochs().stop and s.decide_at_step().at_step
    s = stopping()
    s.best.stop_reason = "test_acc has not improved in 3 evaluations"  # read from the checkpoint
    assert s.decide_before_epochs().why == EARLY_STOP


def test_a_target_wins_over_patience_at_the_same_epoch_end():
    s = stopping(Scheme(partition=(0, 1)))
    s.best.stop_reason = "test_loss has not improved in 2 evaluations"
    s.evaluated(REACHED, 8)
    assert s.decide_at_epoch_end(Progress(epoch=2), num_workers=1).why == TARGET


def test_a_worker_that_finished_learns_another_was_stopped():
    s = stopping(Scheme(others_stop=True))
    s.before_last_evaluation()
    s.evaluated(REACHED, 16)  # the last evaluation stopped nobody
    verdict = s.decide_at_epoch_end(Progress(epoch=4), num_workers=2)
    assert (verdict.why, verdict.at_step, verdict.agreed) == (SIGNAL, False, True)
    alone = stopping()  # nobody else was stopped
    alone.before_last_evaluation()
    assert not alone.verdict.stop


@pytest.mark.parametrize("loss", [float("nan"), float("inf"), float("-inf")])
def test_a_non_finite_loss_raises_the_training_error(loss):
    s = stopping()
    step = StepResult(Progress(epoch=1, step=2, global_step=14), loss, 0.01)
    with pytest.raises(TrainingError, match=rf"loss became {loss} at epoch 2, step 3 \(global "
                                            r"step 15\); lower --lr or check the data"):
        s.after_step(step)
    assert (s.verdict.why, s.verdict.at_step, s.verdict.requeue) == (NON_FINITE_LOSS, True, False)
    assert s.verdict.detail.endswith("No checkpoint was written before it.")  # none at run/
    s = stopping()
    s.after_step(StepResult(Progress(), 0.5, 0.01))
    assert s.verdict == Verdict()


def test_a_non_finite_loss_after_a_checkpoint_says_it_is_kept(tmp_path):
    s = stopping()
    s.checkpointer.path = tmp_path / "checkpoint.pt"
    s.checkpointer.path.write_bytes(b"written at an epoch's end")
    with pytest.raises(TrainingError, match=r"The last checkpoint is kept unchanged\.$"):
        s.after_step(StepResult(Progress(epoch=1), float("nan"), 0.01))


def test_the_loss_guard_gives_the_runs_advice_for_its_number_of_workers():
    s = stopping(Scheme())  # two workers
    s.advice = lambda workers: f"weigh each gradient by its staleness ({workers} workers)"
    with pytest.raises(TrainingError, match=r"\(global step 15\); weigh each gradient by its "
                                            r"staleness \(2 workers\)"):
        s.after_step(StepResult(Progress(epoch=1, step=2, global_step=14), float("nan"), 0.01))


@pytest.mark.parametrize("lead", [True, False])
def test_a_test_loss_far_above_the_untrained_models_is_told_once_by_the_lead(lead, capsys):
    scheme = Scheme()
    scheme.lead = lead
    s = stopping(scheme)
    s.advice = lambda workers: f"weigh each gradient by its staleness ({workers} workers)"
    s.decide_before_epochs()
    for step, loss in enumerate([2.3, 2.0, 2.5]):  # the first step's loss is the scale
        s.after_step(StepResult(Progress(global_step=step), loss, 0.01))
    for step, loss in enumerate([3.58, 85.8, 4.8, 300.0], start=1):  # the 8-worker run's
        s.evaluated((loss, {"acc": 0.1}), 22 * step)
    told = ("hvdtrain: warning: the test loss is 85.8 at global step 44, 37.3 times the "
            "untrained model's 2.3 (the first step's training loss): training is diverging; "
            "weigh each gradient by its staleness (2 workers)\n")
    assert capsys.readouterr().out == (told if lead else "")


def test_a_resumed_run_has_no_scale_for_a_divergence():
    """A trained model's loss is no scale: overfitting may multiply it."""
    s = stopping()
    s.checkpointer.resumed_from = "run/checkpoint.pt"
    s.decide_before_epochs()
    s.after_step(StepResult(Progress(global_step=500), 0.05, 0.01))
    s.evaluated((5.0, {"acc": 0.9}), 501)
    assert s.divergence.untrained is None and not s.divergence.warned


def test_a_run_that_trains_or_overfits_is_no_divergence():
    watch = DivergenceWatch()
    assert watch.evaluated((100.0, {}), 1) is None  # no step yet: no scale
    watch.untrained = 2.3
    # falls, then overfits to 3 times its best; NaN has its own messages; up to the bound
    for step, loss in enumerate([2.3, 0.4, 0.12, 0.36, float("nan"), 2.3 * RISE]):
        assert watch.evaluated((loss, {}), step) is None, loss
    assert watch.evaluated(None, 9) is None  # another process scored the test split
    assert watch.evaluated((2.3 * RISE + 0.1, {}), 10) is not None  # the bound can be crossed
    zero = DivergenceWatch()  # a user's loss that starts at 0 gives no scale
    zero.untrained = 0.0
    assert zero.evaluated((5.0, {}), 2) is None


@pytest.mark.parametrize("lead", [True, False])
def test_a_run_whose_test_loss_never_left_the_untrained_models_is_told_at_its_end(lead, capsys):
    scheme = Scheme()
    scheme.lead = lead
    s = stopping(scheme)
    s.decide_before_epochs()
    s.after_step(StepResult(Progress(), 2.3, 0.01))
    for step, loss in enumerate([2.41, 3.58, 2.9], start=1):  # at chance, under RISE's bound
        s.evaluated((loss, {"acc": 0.1}), 22 * step)
    assert capsys.readouterr().out == ""  # nothing until the run's end
    s.close()
    told = ("hvdtrain: warning: in 3 evaluations the test loss never fell below 0.95 times the "
            "first step's training loss 2.3 (its lowest: 2.41): if the model started untrained, "
            "it learned nothing (too high a rate sends a run to chance, too low a rate leaves "
            "it where it started); lower --lr or check the data, or raise --lr if the training "
            "loss did not fall either\n")
    assert capsys.readouterr().out == (told if lead else "")


def test_a_run_that_learned_or_was_warned_of_or_evaluated_once_is_not_told_at_its_end():
    def ended(untrained, losses):
        watch = DivergenceWatch()
        watch.untrained = untrained
        for step, loss in enumerate(losses):
            watch.evaluated(None if loss is None else (loss, {}), step)
        return watch.ended()

    assert ended(2.3, [2.3, 2.18]) is None  # below FLAT once is learning
    assert ended(2.3, [2.3, 2.2, 2.4])[1] is True  # 2.2 is not below 0.95 x 2.3: never learned
    assert ended(2.3, [0.4, 2.3, 1.2]) is None  # learned, got worse, and ends below FLAT
    assert ended(2.3, [1.3, 2.3, 2.5]) is None  # 1.3 is not clearly learned (LEARNED x 2.3)
    assert ended(2.3, [2.3]) is None  # one evaluation is no trend
    assert ended(2.3, [2.3, float("nan"), None]) is None  # NaNs and other processes' are none
    assert ended(2.3, [2.3, 100.0, 2.3]) is None  # warned of already, as a divergence
    assert ended(None, [2.3, 2.3, 2.3]) is None  # a resumed run has no scale


@pytest.mark.parametrize("keep_best", [False, True])
def test_a_run_that_learned_and_ended_back_at_chance_is_told_at_its_end(keep_best, capsys):
    s = stopping()
    if keep_best:
        s.best.metric = "test_loss"
    s.decide_before_epochs()
    s.after_step(StepResult(Progress(), 2.3, 0.01))
    for step, loss in enumerate([0.3, 0.12, 1.9, 2.31], start=1):  # learned, then lost it
        s.evaluated((loss, {"acc": 0.9}), 22 * step)
    s.close()
    told = ("hvdtrain: warning: the last evaluation's test loss 2.31 is back near the first "
            "step's training loss 2.3, after falling to 0.12 at global step 44: training "
            "diverged after it had learned, and the final model is no better than an untrained "
            "one; lower --lr or check the data; ")
    assert capsys.readouterr().out == told + (
        "the best evaluation's model is in run/best.pt\n" if keep_best else
        "--keep-best test_loss keeps the best evaluation's model as best.pt\n")


def test_the_verdict_travels_to_every_rank():
    verdict = Verdict(TARGET, "test_acc 0.95 >= 0.9 at step 12", True, True, (1.5, 1.0))
    assert pickle.loads(pickle.dumps(verdict)) == verdict


# --- the stop lines ----------------------------------------------------------------------------
def test_each_verdict_writes_its_stop_line(capsys):
    s, log = stopping(), Log()
    s.signals.received = "SIGTERM"
    s.decide_at_step()
    s.report(Progress(epoch=1, step=3, global_step=11), log)
    # every stop line's step is the global step, as the epoch lines' is
    assert log.lines == [("stop", {"epoch": 2, "step": 11, "step_in_epoch": 3, "global_step": 11,
                                   "reason": "preempted: SIGTERM"})]
    assert ("hvdtrain: stopped by SIGTERM after epoch 2, step 3 (global step 11); checkpoint "
            "run/checkpoint.pt; continue with --auto-resume --run-dir run") in capsys.readouterr().out

    s, log = stopping(), Log()
    s.evaluated(REACHED, 12)
    s.decide_at_step()
    s.report(Progress(epoch=1, step=4, global_step=12), log)
    [(kind, fields)] = log.lines
    assert (fields["epoch"], fields["step"], fields["global_step"], fields["target"],
            fields["reason"]) == (2, 12, 12, "test_acc>=0.9",
                                  "reached the target: test_acc 0.95 >= 0.9 at step 12")
    assert fields["train_seconds"] <= fields["wall_seconds"]
    assert "hvdtrain: reached the target test_acc>=0.9" in capsys.readouterr().out

    s, log = stopping(), Log()
    s.best.stop_reason = "no better"
    s.decide_at_epoch_end(Progress(epoch=2), num_workers=2)
    s.report(Progress(epoch=2, global_step=40), log)
    assert log.lines == [("stop", {"epoch": 2, "step": 40, "global_step": 40,
                                   "reason": "stopped early after epoch 2: no better"})]
    assert "the best model is in run/best.pt" in capsys.readouterr().out

    s, log = stopping(), Log()
    s.report(Progress(epoch=4), log)
    assert log.lines == [] and capsys.readouterr().out == ""


def test_sync_stop_vote_at_np1_is_the_ranks_own_flag_without_a_collective():
    from hvdtrain.sync.collective_group import CollectiveGroup
    from hvdtrain.sync.horovod import HorovodSync
    from hvdtrain.sync.horovod_port import HorovodPort

    class Alone:
        def size(self):
            return 1

        def allreduce_async(self, *args, **kwargs):
            raise AssertionError("a collective at np=1")

    scheme = HorovodSync.__new__(HorovodSync)
    scheme.group = CollectiveGroup(HorovodPort(Alone()), stall_timeout_s=0.0)
    assert scheme.group.agree_to_stop(True) is True
    assert scheme.group.agree_to_stop(False) is False


@pytest.mark.parametrize("announce", [True, False])
def test_a_parameter_server_records_a_stop_signal_without_a_line_of_its_own(announce, capfd):
    """A worker says what a stop signal does; a server (announce False, launch.py) only
    records it: when mpirun ends an async job because a worker failed, its line "a checkpoint
    and exit 75" came after the worker's real error and was untrue."""
    signals = StopSignals()
    signals.announce = announce
    signals._handle(signal.SIGTERM, None)
    assert signals.received == "SIGTERM"
    said = capfd.readouterr().err
    assert ("SIGTERM received by PID" in said) == announce, said


def test_a_stop_signal_before_training_started_says_so_without_the_recovery_advice(
        capfd, monkeypatch):
    """Under mpirun, a SIGTERM before the first step is most often mpirun ending the job because
    another rank failed to start (an unreadable checkpoint): 'launch with recovery' was wrong."""
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "1")
    monkeypatch.setenv("OMPI_MCA_odls_base_sigkill_timeout", "60")
    monkeypatch.delenv("OMPI_MCA_orte_enable_recovery", raising=False)
    early = StopSignals()
    early._handle(signal.SIGTERM, None)
    said = capfd.readouterr().err
    # the likely cause first: the stop's own course only for a scheduler's signal
    assert ("before training started: if mpirun sent it, another rank's error above says why the "
            "job ends, and this rank ends with it; if a scheduler did, it stops within its first "
            "steps, with a checkpoint, and exits 75") in said, said
    assert "orte_enable_recovery" not in said
    s = stopping()
    s.signals = StopSignals()
    s.decide_before_epochs()  # training starts
    s.signals._handle(signal.SIGTERM, None)
    said = capfd.readouterr().err
    assert "finishing the current step, then a checkpoint and exit 75" in said
    assert "orte_enable_recovery 1" in said and "before training" not in said
    monkeypatch.delenv("OMPI_COMM_WORLD_RANK")  # no mpirun: no guess at another rank
    StopSignals()._handle(signal.SIGTERM, None)
    assert "before training started: it stops within its first steps" in capfd.readouterr().err
    in_fit = StopSignals()
    in_fit.in_fit = True  # hvdtrain.fit returns: no exit code, no --auto-resume flag to give
    in_fit._handle(signal.SIGUSR1, None)
    said = capfd.readouterr().err
    assert "fit() then returns with its preempted field set (call it again with " \
           "auto_resume=True to continue)" in said and "exit 75" not in said


@pytest.fixture(autouse=True)
def _output_unwrapped():
    """A stop signal handled here wraps the test's output (OutputThatMayBeGone): unwrapped after."""
    yield
    sys.stdout, sys.stderr = preemption.OutputThatMayBeGone.unwrap(sys.stdout, sys.stderr)


class GoneTerminal(io.StringIO):
    """A rank's output once mpirun closed it: every write fails."""

    def write(self, text):
        raise OSError(errno.EIO, "Input/output error")

    def flush(self):
        raise OSError(errno.EIO, "Input/output error")


def test_output_to_a_closed_terminal_no_longer_fails_a_run_that_handles_stop_signals(
        monkeypatch):
    """mpirun told to stop closes the ranks' output before its SIGTERM reaches them: a print
    raised EPIPE in the training loop, and the async run's stop line read "failed: [Errno 32]
    Broken pipe", with no checkpoint."""
    gone = GoneTerminal()
    monkeypatch.setattr(sys, "stdout", gone)
    monkeypatch.setattr(sys, "stderr", gone)
    with pytest.raises(OSError):
        print("outside a run", flush=True)  # not hidden where no run handles the signals
    signals = StopSignals()
    monkeypatch.setattr(signals, "_previous", {})
    monkeypatch.setattr(preemption.signal, "signal", lambda sig, handler: None)
    signals.install()
    print("an epoch line", flush=True)
    ProgressBar(enabled=True).start_epoch(2, 3, 10)  # the epoch bar writes to sys.stderr now
    monkeypatch.setattr(preemption.os, "write", lambda fd, data: gone.write(data))
    signals._handle(signal.SIGTERM, None)  # its own line fails too, and is dropped
    assert signals.received == "SIGTERM"
    print("the stop's message", flush=True)
    signals.restore()
    assert sys.stdout is gone and sys.stderr is gone


def test_a_stop_signal_while_the_process_starts_is_taken_over_by_the_trainer(capfd):
    """It killed the rank while torch loaded (exit 143, or 138 for SIGUSR1): no requeue."""
    import os

    from hvdtrain import exit_codes
    before = {sig: signal.getsignal(sig) for sig in exit_codes.STOP_SIGNALS}
    try:
        exit_codes.record_early_stops()
        os.kill(os.getpid(), signal.SIGUSR1)  # the process lives on: recorded
        assert exit_codes.early_stops == ["SIGUSR1"]
        signals = StopSignals()
        signals.install()
        assert signals.received == "SIGUSR1" and exit_codes.early_stops == []
        assert "SIGUSR1 received by PID" in capfd.readouterr().err
        signals.restore()
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
        exit_codes.early_stops.clear()


def test_a_worker_that_fails_in_async_ends_the_log_with_why(tmp_path, monkeypatch):
    """A worker other than the lead aborted the job, which killed the lead before it wrote a
    stop line: the log ended at an epoch line, as a killed run's does."""
    import json
    from types import SimpleNamespace

    from hvdtrain import launch

    (tmp_path / "metrics.jsonl").write_text('{"type": "epoch", "epoch": 2}\n')
    aborted = []
    monkeypatch.setattr(launch, "abort", lambda world, message, code, collective=False:
                        aborted.append((message, code)))
    worker = SimpleNamespace(is_main=False, run_dir=tmp_path)
    launch._end_async_job(RuntimeError("boom\nsecond line"), None, 1, worker)
    last = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["type"] == "stop" and last["reason"].startswith("failed: rank 1: RuntimeError: "
                                                                "boom")
    assert aborted and aborted[0][1] == 1
    lead = SimpleNamespace(is_main=True, run_dir=tmp_path)  # the lead writes its own
    launch._end_async_job(RuntimeError("again"), None, 0, lead)
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 2
    # a server, which has no trainer: its error (a silent worker) ended the log at an epoch line
    # (another run's folder: the line above keeps its log locked until this process ends)
    served = tmp_path / "served"
    served.mkdir()
    (served / "metrics.jsonl").write_text('{"type": "epoch", "epoch": 2}\n')
    launch._end_async_job(RuntimeError("worker 1 sent nothing"), None, 2, None, str(served))
    last = json.loads((served / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["reason"] == "failed: rank 2: RuntimeError: worker 1 sent nothing"


def test_an_async_workers_refusal_at_start_up_is_raised_on_every_rank():
    """The workers' model and data checks run after MPI started; a refusal there aborted the
    job (fit() could not catch it, the servers died of the abort). Every rank now raises it."""
    from hvdtrain import launch
    from hvdtrain.data import DataError

    class World:  # allgather over this rank and one other
        def __init__(self, other):
            self.other = other

        def allgather(self, mine):
            return [mine, self.other]

    launch._agree_on_input(World(None), None)  # nobody refused: nothing is raised
    told = (launch.BAD_INPUT.index(DataError), "the labels go up to 9", "Traceback: yours\n")
    with pytest.raises(DataError, match="the labels go up to 9") as raised:  # a server
        launch._agree_on_input(World(told), None)
    assert raised.value.raised_on_every_rank and raised.value.user_traceback.startswith("Trace")
    own = ConfigError("--model mine: shapes")
    with pytest.raises(ConfigError) as raised:  # the worker that refused: its own error
        launch._agree_on_input(World(None), own)
    assert raised.value is own and own.raised_on_every_rank


def test_an_async_worker_with_another_model_than_worker_0s_is_refused_on_every_rank():
    """The server holds worker 0's parameters: a worker whose fit() got a narrower model
    trained on them in silence (exit 0), a wider one failed in a numpy copy."""
    from hvdtrain import launch

    class World:  # worker 0, worker 1, a server
        def __init__(self, *every):
            self.every = list(every)

        def allgather(self, mine):
            return self.every

    wide = [("0.weight", (32, 20)), ("0.bias", (32,))]
    launch._same_model_on_every_worker(World(wide, wide, None), None)  # the same: nothing
    for mine in (None, wide):  # the server, worker 0: every rank raises it
        with pytest.raises(ConfigError, match=r"^the model: 1 worker\(s\) built another model "
                                              r"than rank 0's \(rank 1: 0\.weight 16x20 "
                                              r"against 0\.weight 32x20\); every worker must "
                                              r"build the same model") as raised:
            launch._same_model_on_every_worker(
                World(wide, [("0.weight", (16, 20)), ("0.bias", (16,))], None), mine)
        assert raised.value.raised_on_every_rank
    with pytest.raises(ConfigError, match=r"rank 1: 1 parameters against 2"):
        launch._same_model_on_every_worker(World(wide, wide[:1], None), None)


def test_an_error_in_a_loader_process_is_told_by_its_own_message():
    """The one-line error said "Caught DataError in DataLoader worker process 0." alone."""
    from hvdtrain.errors import plain_message

    wrapped = ValueError("Caught DataError in DataLoader worker process 1.\nOriginal Traceback "
                         "(most recent call last):\n  File \"x.py\", line 3, in f\n"
                         "hvdtrain.data.DataError: emu/007.png: cannot read this image\n")
    assert plain_message(wrapped) == "emu/007.png: cannot read this image (in DataLoader " \
                                     "worker process 1)"
    assert plain_message(ValueError("corrupt record 17")) == "corrupt record 17"
