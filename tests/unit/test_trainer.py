"""The training loop in one process, driven by a scheme that needs no MPI: resume slicing,
rescaling to another number of workers, checkpoint cadence, and step hooks."""

from __future__ import annotations

import pytest
import torch

from hvdtrain import checkpoint
from hvdtrain.config import Config, ConfigError
from hvdtrain.loop import StepHook, Trainer, TrainingError
from hvdtrain.loop.epoch_plan import EpochPlan
from hvdtrain.loop.preemption import StopSignals
from hvdtrain.run_output import latest_attempt, read_jsonl
from hvdtrain.replica import Replica
from hvdtrain.runtime import Runtime
from hvdtrain.scheme import Batches, Progress, UpdateScheme
from hvdtrain.data.in_memory import InMemoryBatches
from hvdtrain.workload import workload_from_objects
from fake_group import OneProcess

CPU = torch.device("cpu")


class LocalScheme(UpdateScheme):
    """Plain SGD in this process: the smallest scheme the trainer accepts."""

    lr_scale = 1.0

    def __init__(self):
        self.started_with: tuple[dict | None, bool] | None = None
        self.group = OneProcess()

    def attach(self, replica):
        self.replica = replica
        self.optimizer = torch.optim.SGD(replica.parameters(), lr=0.1, momentum=0.9)

    def start(self, state, resuming):
        self.started_with = (state, resuming)
        if state is not None:
            self.replica.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])

    def step(self, x, y, lr):
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.zero_grad()
        stats = self.replica.forward_backward(x, y, 1.0)
        self.optimizer.step()
        return stats

    def state_dict(self):
        return {"model": self.replica.model.state_dict(),
                "optimizer": self.optimizer.state_dict()}


def data(n=256, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 12, generator=g)
    return x, (x[:, :3].sum(1) > 0).long()


def make_trainer(tmp_path, hooks=(), x=None, scheme=None, dropout=0.0, **options):
    opts = {"epochs": 2, "batch_size": 16, "progress": False, "warmup_epochs": 0,
            "run_dir": str(tmp_path), "seed": 4, **options}
    cfg = Config.from_overrides(opts).validate()
    x, y = data() if x is None else x
    torch.manual_seed(cfg.run.seed)
    workload = workload_from_objects(lambda: torch.nn.Sequential(
        torch.nn.Linear(12, 16), torch.nn.ReLU(),
        *([torch.nn.Dropout(dropout)] if dropout else []), torch.nn.Linear(16, 2)),
        (x[:200], y[:200]), (x[200:], y[200:]), "cross_entropy", None)
    workload.bind(CPU, cfg)
    model = workload.build_model()
    runtime = Runtime(0, 1, 0, 1, CPU, "none")
    trainer = Trainer(cfg, runtime, scheme or LocalScheme(), workload,
                      Replica(model, CPU, workload.objective()))
    trainer.hooks += list(hooks)
    return trainer


class CrashAt(StepHook):
    """Stands in for a killed job: raises after the given global step."""

    def __init__(self, global_step):
        self.global_step = global_step
        self.seen: list[tuple[int, int]] = []

    def after_step(self, step):
        self.seen.append((step.progress.epoch, step.progress.step))
        if step.progress.global_step + 1 == self.global_step:
            raise KeyboardInterrupt


@pytest.mark.parametrize("dropout", [0.0, 0.3])  # the dropout masks replay too (seed_step)
def test_a_step_checkpoint_resumes_at_its_step_with_the_same_weights(tmp_path, dropout):
    straight = make_trainer(tmp_path / "straight", dropout=dropout)
    straight.fit()
    steps = straight.plan.steps_per_epoch
    assert steps == 200 // 16
    # 12 steps an epoch: a checkpoint every 5 steps leaves (epoch 1, step 3) at global step 15
    crash = CrashAt(17)
    first = make_trainer(tmp_path / "crashed", hooks=[crash], checkpoint_steps=5,
                         dropout=dropout)
    with pytest.raises(KeyboardInterrupt):
        first.fit()
    saved = checkpoint.load(tmp_path / "crashed")
    assert (saved["epoch"], saved["step"], saved["global_step"]) == (1, 3, 15)
    hook = CrashAt(-1)
    resumed = make_trainer(tmp_path / "crashed", hooks=[hook], checkpoint_steps=5,
                           auto_resume=True, dropout=dropout)
    resumed.fit()
    assert resumed.scheme.started_with[1] is True
    assert hook.seen[0] == (1, 3) and len(hook.seen) == steps - 3  # only the rest of epoch 2
    a, b = straight.replica.model.state_dict(), resumed.replica.model.state_dict()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    header = [r for r in read_jsonl(tmp_path / "crashed" / "metrics.jsonl")
              if r["type"] == "header"][-1]
    assert (header["resumed_from_epoch"], header["resumed_from_step"]) == (1, 3)


def test_a_resume_inside_an_epoch_with_another_batch_size_goes_on_where_its_samples_end(
        tmp_path):
    """Its steps count global batches of the old size, so the position is the samples they
    took: converted where they are a whole number of the new global batches (the rest of the
    epoch had trained samples twice, or skipped some, without a word), else refused."""
    crashed = make_trainer(tmp_path, hooks=[CrashAt(17)], checkpoint_steps=5)
    with pytest.raises(KeyboardInterrupt):
        crashed.fit()  # a checkpoint at epoch 1, step 3 (global step 15): 48 samples of epoch 2
    with pytest.raises(ConfigError, match=r"--batch-size 32: the checkpoint .* stopped inside an "
                                          r"epoch \(1 epoch\(s\) and 3 step\(s\) of epoch 2\) "
                                          r"trained with --batch-size 16 x 1 workers, 48 samples, "
                                          r"no whole number of this run's global batches of 32; "
                                          r"finish that epoch with --batch-size 16 \(and --epochs "
                                          r"2\)"):
        make_trainer(tmp_path, batch_size=32, auto_resume=True).fit()
    with pytest.raises(ConfigError, match=r"has trained 1 epoch\(s\) and 3 step\(s\) of "
                                          r"epoch 2 already"):
        make_trainer(tmp_path, epochs=1, auto_resume=True).fit()
    hook = CrashAt(-1)
    make_trainer(tmp_path, batch_size=8, hooks=[hook], auto_resume=True).fit()
    assert hook.seen[0] == (1, 6) and len(hook.seen) == 25 - 6  # 48 of 200 samples: 6 of 25


class SignalAt(StepHook):
    """Stands in for a SIGTERM that arrives during the given global step."""

    def __init__(self, trainer, global_step):
        self.trainer, self.global_step = trainer, global_step

    def after_step(self, step):
        if step.progress.global_step + 1 == self.global_step:
            self.trainer.stopping.signals = StopSignals()
            self.trainer.stopping.signals.received = "SIGTERM"


@pytest.mark.parametrize("stop_at", [12, 17])  # the last step of epoch 1, and inside epoch 2
def test_an_epoch_resumed_inside_says_so_and_one_resumed_at_its_end_has_no_training_figures(
        tmp_path, stop_at, capsys):
    stopped = make_trainer(tmp_path)
    stopped.hooks.append(SignalAt(stopped, stop_at))
    stopped.fit()
    assert stopped.stopping.verdict.at_step
    resumed = make_trainer(tmp_path, auto_resume=True)
    resumed.fit()
    lines = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if r["type"] == "epoch"]
    assert [line["epoch"] for line in lines] == [1, 2]  # each once: the stop wrote none
    epoch, first_step = divmod(stop_at, 12)
    if not first_step:  # the stop came after epoch 1's last step: none of it is left
        epoch, first_step = epoch - 1, 12
    resumed, other = lines[epoch], lines[1 - epoch]
    assert resumed["from_step"] == first_step and "from_step" not in other
    assert resumed["samples"] == (12 - first_step) * 16 and other["samples"] == 12 * 16
    assert (resumed["train_loss"] is None) == (first_step == 12)  # not 0.0, as before
    out = capsys.readouterr().out
    assert ("epoch 1/2 - trained before the resume - test_loss: " in out) == (stop_at == 12)
    assert "loss: 0.0000" not in out


def test_checkpoints_follow_the_epoch_cadence(tmp_path, monkeypatch):
    trainer = make_trainer(tmp_path, epochs=5, checkpoint_every=2)
    written = []
    save = trainer.checkpointer.save
    monkeypatch.setattr(trainer.checkpointer, "save",
                        lambda p: written.append((p.epoch, p.step)) or save(p))
    trainer.fit()
    assert written == [(2, 0), (4, 0), (5, 0)]  # every 2 epochs, and always the last


@pytest.mark.parametrize("step, workers, now, expected", [
    (20, 1, 2, 10), (43, 1, 3, 14), (5, 2, 1, 10), (7, 3, 3, 7), (30, 1, 2, 12)])
def test_a_position_inside_an_epoch_rescales_to_another_number_of_workers(step, workers, now,
                                                                         expected):
    x, y = data(400)
    plan = EpochPlan(Config.from_overrides({"batch_size": 16}).validate().run,
                     InMemoryBatches(x, y))
    plan.bind_world(0, now)
    progress = Progress(epoch=1, step=step, global_step=99, workers=workers)
    plan.rescale(progress)
    assert progress.step == min(expected, plan.steps_per_epoch)
    assert progress.workers == now


def test_a_resume_past_this_runs_epoch_is_refused_and_a_feeds_step_goes_on_from_its_own():
    """A step checkpoint at step 20 resumed with --max-steps-per-epoch 15 ended in a traceback
    (ValueError: steps 20..15 out of range); an async resume with more workers (fewer steps an
    epoch) counted its global step afresh in the new epochs, below the steps already logged."""
    x, y = data(400)
    run = Config.from_overrides({"batch_size": 16, "max_steps_per_epoch": 15}).validate().run
    plan = EpochPlan(run, InMemoryBatches(x, y))
    plan.bind_world(0, 1)
    with pytest.raises(ConfigError, match=r"stopped at step 20 of epoch 2, past this run's 15 "
                                          r"steps per epoch .*--max-steps-per-epoch 20 or more"):
        plan.rescale(Progress(epoch=1, step=20, global_step=45, workers=1))
    plan = EpochPlan(Config.from_overrides({"batch_size": 16}).validate().run,
                     InMemoryBatches(x, y))
    plan.bind_world(0, 4)  # 6 steps an epoch, where 2 workers had 12
    resumed = Progress(epoch=2, step=0, global_step=24, workers=2)
    plan.rescale(resumed)
    plan.feed = object()  # the job's batch plan (async): its place sets the global step
    plan.finish_epoch(resumed)
    assert (resumed.epoch, resumed.global_step) == (3, 30)  # 24 + 6, not 3 x 6 = 18


def test_workers_that_hold_different_numbers_of_samples_are_refused_before_training():
    """Ranks that each passed their own data (hvdtrain.fit under mpirun, 100 and 200 samples)
    ran different numbers of steps, and the sync job hung until the stall timeout."""
    class TwoWorkers(OneProcess):  # this worker is worker 1; worker 0's count is ``lead``
        def __init__(self, lead):
            self.lead = lead

        def workers(self):
            return 1, 2

        def broadcast_object(self, obj):
            return self.lead  # the sum is this worker's alone: worker 0 agrees with itself

    run = Config.from_overrides({"batch_size": 16}).validate().run
    x, y = data(200)
    with pytest.raises(ConfigError, match=r"the training data: 1 worker\(s\) hold another number "
                                          r"of samples than worker 0's 100 \(this one, worker 1, "
                                          r"200\); every worker must pass the same whole dataset"):
        EpochPlan(run, InMemoryBatches(x, y)).bind_world(1, 2, TwoWorkers(100))
    EpochPlan(run, InMemoryBatches(x, y)).bind_world(1, 2, TwoWorkers(200))  # the same: on


@pytest.mark.parametrize("schedule", ["cosine", "constant"])
def test_the_schedule_follows_the_epochs_in_this_worlds_steps_after_a_change_of_workers(schedule):
    """A resume from 2 sync workers onto 3: the global step counts the earlier epochs in the
    old world's (more) steps. The rate is the plan's at this world's epoch and step, so cosine
    reaches 0 at the end and not epochs before it (it trained the last two of 6 at lr 0)."""
    x, y = data(960)
    run_config = Config.from_overrides({"batch_size": 16, "epochs": 6, "lr": 0.1,
                                        "lr_schedule": schedule}).validate()
    plan = EpochPlan(run_config.run, InMemoryBatches(x, y))
    plan.bind_world(0, 3)  # 20 steps an epoch; with 2 workers 30
    resumed = Progress(epoch=4, step=0, global_step=4 * 30, workers=2)
    plan.rescale(resumed)
    fresh = Progress(epoch=4, step=0, global_step=4 * 20, workers=3)
    rate = plan.learning_rate(resumed, run_config.optim, 3.0)
    assert rate == plan.learning_rate(fresh, run_config.optim, 3.0)
    assert rate > 0.05 if schedule == "cosine" else rate == pytest.approx(0.3)
    last = Progress(epoch=5, step=19, global_step=4 * 30 + 39, workers=3)
    assert 0 < plan.learning_rate(last, run_config.optim, 3.0) < 0.01 or schedule == "constant"


def test_a_nan_loss_stops_training_and_keeps_the_last_checkpoint(tmp_path):
    make_trainer(tmp_path, epochs=1).fit()
    before = (tmp_path / "checkpoint.pt").read_bytes()
    x, y = data()
    x[150:] = float("nan")
    trainer = make_trainer(tmp_path, x=(x, y), epochs=3, auto_resume=True)
    with pytest.raises(TrainingError, match="loss became nan"):
        trainer.fit()
    assert (tmp_path / "checkpoint.pt").read_bytes() == before
    # the log's last line says the run failed and why (before, it ended at the last epoch line)
    last = read_jsonl(tmp_path / "metrics.jsonl")[-1]
    assert last["type"] == "stop" and last["reason"].startswith("failed: loss became nan at "), last


def test_a_fresh_run_refuses_a_folder_that_holds_a_checkpoint(tmp_path):
    make_trainer(tmp_path, epochs=1).fit()
    with pytest.raises(checkpoint.CheckpointError, match="already holds a checkpoint"):
        make_trainer(tmp_path, epochs=1).fit()


def test_every_hook_sees_every_step_in_order(tmp_path):
    hook = CrashAt(-1)
    trainer = make_trainer(tmp_path, epochs=2, max_steps_per_epoch=4)
    trainer.hooks.append(hook)
    history = trainer.fit()
    assert hook.seen == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1), (1, 2), (1, 3)]
    assert [e.epoch for e in history] == [1, 2]
    lines = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if r["type"] == "epoch"]
    assert [r["step"] for r in lines] == [4, 8]
    assert all(0 <= r["train_acc"] <= 1 and r["test_acc"] is not None for r in lines)


def test_a_new_run_keeps_an_old_log_and_removes_a_dead_writers_temporary(tmp_path):
    # A first attempt killed before its first checkpoint leaves a log and a half-written file.
    make_trainer(tmp_path, epochs=1).fit()
    (tmp_path / "checkpoint.pt").unlink()
    old_log = (tmp_path / "metrics.jsonl").read_text()
    dead = tmp_path / ".checkpoint.pt.tmp999999999"  # no such process
    dead.write_bytes(b"half a checkpoint")
    import os
    alive = tmp_path / f".checkpoint.pt.tmp{os.getppid()}"  # a live process: its file stays
    alive.write_bytes(b"being written")
    make_trainer(tmp_path, epochs=1).fit()
    kept = [p for p in tmp_path.glob("metrics.*.jsonl")]
    assert len(kept) == 1 and kept[0].read_text() == old_log
    new = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["type"] for r in new] == ["header", "epoch"]
    assert not dead.exists() and alive.exists()


class LaggingSums(LocalScheme):
    """The async lead's sums: an epoch's line waits for a slow worker, whose sums come in two
    epochs later; the epoch's checkpoint is written before it."""

    def __init__(self):
        super().__init__()
        self.posted: list[list] = []
        self.group = LaggingGroup(self.posted)


class LaggingGroup(OneProcess):
    def __init__(self, posted):
        self.posted = posted

    def sum_later(self, values):
        from hvdtrain.scheme import PendingSum
        posted = self.posted

        class Lagging(PendingSum):
            def __init__(self):
                super().__init__(list(values))
                self.index = len(posted)
                posted.append(values)

            def ready(self):
                return len(posted) > self.index + 2

        return Lagging()


def test_a_resume_names_the_epochs_whose_lines_a_kill_lost_and_keeps_their_evaluations(tmp_path):
    # Killed early in epoch 5: checkpoints of epochs 1-4 were written, lines only of 1 and 2.
    first = make_trainer(tmp_path, hooks=[CrashAt(4 * 12 + 2)], epochs=6, scheme=LaggingSums())
    with pytest.raises(KeyboardInterrupt):
        first.fit()
    assert checkpoint.load(tmp_path)["epoch"] == 4
    lines = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["epoch"] for r in lines if r["type"] == "epoch"] == [1, 2]
    resumed = make_trainer(tmp_path, epochs=6, auto_resume=True)
    resumed.fit()
    lines = read_jsonl(tmp_path / "metrics.jsonl")
    after = lines[[i for i, r in enumerate(lines) if r["type"] == "header"][-1]:]
    assert [(r["type"], r["epoch"]) for r in after[1:3]] == [("eval", 3), ("eval", 4)]
    assert after[3]["type"] == "missing" and after[3]["epochs"] == [3, 4]
    assert "stopped before the line(s) of epoch(s) 3-4" in after[3]["reason"]
    assert [r["epoch"] for r in after if r["type"] == "epoch"] == [5, 6]
    # a branch into a new folder has no log of its own yet: nothing is missing there
    make_trainer(tmp_path / "branch", epochs=7, resume=str(tmp_path)).fit()
    assert [r["type"] for r in read_jsonl(tmp_path / "branch" / "metrics.jsonl")] == [
        "header", "epoch"]
    # a second resume of the finished run finds nothing missing
    from hvdtrain.loop.run_log import log_coverage
    assert log_coverage(tmp_path / "metrics.jsonl")[0] == 6


def test_huge_model_args_are_recorded_as_their_size_and_digest(tmp_path):
    # A 20 MB --model-args was copied into every checkpoint and the log's header.
    import hashlib
    big = '{"table": "' + "x" * 200_000 + '"}'
    # a model of the user's (the objects' own here): a built-in one refuses --model-args
    make_trainer(tmp_path, epochs=1, model="own.py:build", model_args=big).fit()
    recorded = [checkpoint.load(tmp_path)["config"]["model"]["model_args"],
                read_jsonl(tmp_path / "metrics.jsonl")[0]["config"]["model"]["model_args"]]
    digest = hashlib.sha256(big.encode()).hexdigest()
    assert all(r.startswith(f"<{len(big)} bytes, sha256 {digest}") for r in recorded)
    small = '{"width": 4}'
    assert Config.from_overrides({"model_args": small}).to_record()["model"]["model_args"] == small


class MeasuringScheme(LocalScheme):
    """Notes, in order, each epoch's plan asking for the shares and each epoch's step times."""

    def __init__(self):
        super().__init__()
        self.events: list[tuple[str, int]] = []
        self.asked = 0
        self.batches = AskTheScheme(self)

    def batch_shares(self):
        self.events.append(("asked", self.asked))
        self.asked += 1
        return None

    def step_times_measured(self, times, epoch):
        self.events.append(("measured", epoch))
        return {"noted_epoch": epoch}


class AskTheScheme(Batches):
    """The epoch plan's questions, passed on to the scheme that notes them."""

    def __init__(self, scheme):
        self.scheme = scheme

    def batch_shares(self):
        return self.scheme.batch_shares()

    def step_times_measured(self, times, epoch):
        return self.scheme.step_times_measured(times, epoch)


def test_the_trainer_asks_the_scheme_for_the_re_plan_before_the_next_epoch_is_planned(tmp_path):
    """The --balance re-plan's order (scheme.batches.step_times_measured): the trainer has each
    epoch's step times reach the scheme once the epoch line's sum is in, before the next
    epoch's batches are planned, and what the scheme returns goes into that epoch line."""
    scheme = MeasuringScheme()
    make_trainer(tmp_path, epochs=2, max_steps_per_epoch=3, scheme=scheme).fit()
    # asked at the start (whether the source can cut shares), then before each epoch
    assert scheme.events == [("asked", 0), ("asked", 1), ("measured", 1),  # epoch 1's times
                             ("asked", 2), ("measured", 2)]  # came before epoch 2's plan
    lines = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if r["type"] == "epoch"]
    assert [r["noted_epoch"] for r in lines] == [1, 2]


@pytest.mark.parametrize("schedule, epochs, told", [("cosine", 4, True), ("cosine", 2, False),
                                                    ("constant", 4, False)])
def test_a_resume_that_stretches_a_decaying_schedule_says_so(tmp_path, capsys, schedule, epochs,
                                                            told):
    with pytest.raises(KeyboardInterrupt):  # killed in epoch 2 of 2, a checkpoint at step 15
        make_trainer(tmp_path, hooks=[CrashAt(17)], checkpoint_steps=5,
                     lr_schedule=schedule).fit()
    capsys.readouterr()
    make_trainer(tmp_path, epochs=epochs, lr_schedule=schedule, auto_resume=True).fit()
    out = capsys.readouterr().out
    assert ("the checkpoint's run planned 2 epoch(s) and this one" in out) == told, out
    if told:
        assert "--lr-schedule cosine follows --epochs, so the rate goes on from epoch 2 along " \
               "the 4-epoch schedule" in out


def test_a_finished_run_resumed_with_nothing_left_leaves_its_log_as_it_was(tmp_path, capsys):
    make_trainer(tmp_path, epochs=2).fit()
    before = (tmp_path / "metrics.jsonl").read_bytes()
    capsys.readouterr()
    again = make_trainer(tmp_path, epochs=2, auto_resume=True)
    again.fit()
    assert (tmp_path / "metrics.jsonl").read_bytes() == before  # no header of a run not made
    again.log.write("scheme", pushes=0)  # an async server's empty statistics, at the end
    assert (tmp_path / "metrics.jsonl").read_bytes() == before  # no sink was opened for it
    out = capsys.readouterr().out
    assert "has finished all 2 epoch(s); nothing is left to train" in out
    assert "training of" not in out  # the opening line of a run that does not train
    assert "is rank 0 now" not in out  # an elastic hand-over's line: nothing was handed over


def test_an_epoch_logged_by_a_killed_attempt_and_trained_again_is_read_once(tmp_path):
    """A kill after epoch 3's line but before its checkpoint (every 2 epochs): the resume from
    epoch 2 trains and logs epoch 3 again, and the readers (compare, --from-run) took both."""
    make_trainer(tmp_path, epochs=4, checkpoint_every=2).fit()
    lines = read_jsonl(tmp_path / "metrics.jsonl")
    epoch2_step = next(r["step"] for r in lines if r.get("epoch") == 2)
    torch.save({**checkpoint.load(tmp_path), "epoch": 2, "global_step": epoch2_step},
               tmp_path / "checkpoint.pt")  # its checkpoint after epoch 2, with epoch 4's model
    make_trainer(tmp_path, epochs=4, checkpoint_every=2, auto_resume=True).fit()
    lines = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["epoch"] for r in lines if r["type"] == "epoch"] == [1, 2, 3, 4, 3, 4]
    assert lines[-3]["type"] == "header" and lines[-3]["resumed_from_global_step"] == epoch2_step
    assert [r["epoch"] for r in latest_attempt(lines) if r["type"] == "epoch"] == [1, 2, 3, 4]
    kept = latest_attempt(lines)
    assert {k: v for k, v in kept[-1].items() if not k.endswith("_seconds")} == \
        {k: v for k, v in lines[-1].items() if not k.endswith("_seconds")}
    # the attempt's clock, from 0 again, goes on from epoch 2's time
    epoch2 = next(r for r in lines if r.get("epoch") == 2)
    assert kept[-1]["train_seconds"] == pytest.approx(
        lines[-1]["train_seconds"] + epoch2["train_seconds"])


def test_a_resume_onto_another_split_of_the_data_says_so(tmp_path, capsys):
    """--resume with another --data-seed tested on samples the checkpoint had trained on
    (test accuracy 0.93 against 0.91 uninterrupted) without a word."""
    from hvdtrain.config import DataConfig
    from hvdtrain.loop.resume_source import note_data_change

    saved = Config().to_record()["data"]
    note_data_change(saved, DataConfig(), "ck")
    assert capsys.readouterr().out == ""
    note_data_change(saved, DataConfig(data_seed=1, synthetic_shape=(1024,)), "ck")
    said = capsys.readouterr().out
    assert "the checkpoint ck was trained on other data or another split (--data-seed 0 -> 1)" \
        in said and "synthetic" not in said  # a tuple and its record's list are the same
    note_data_change(None, DataConfig(data_seed=1), "ck")  # an old checkpoint: nothing known
    assert capsys.readouterr().out == ""


def test_a_stall_in_an_epochs_first_step_is_told_as_a_step_not_the_epochs_end(tmp_path):
    """The watchdog said "while at the end of an epoch (evaluation, checkpoint)" of a rank
    stuck in the first step of the next epoch: nothing had said the end was done."""
    class Where(StepHook):
        def __init__(self):
            self.doing: list[tuple[int, str]] = []

        def after_step(self, step):  # inside the step, before the loop says it is done
            self.doing.append((step.progress.step, trainer.watchdog.doing_text))

    where = Where()
    trainer = make_trainer(tmp_path, hooks=[where], epochs=2, stall_timeout_s=60)
    trainer.fit()
    per_epoch = trainer.plan.steps_per_epoch
    first_of_second = where.doing[per_epoch]
    assert first_of_second == (0, f"in step {per_epoch + 1}"), first_of_second
