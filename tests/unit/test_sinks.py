"""The run log's sinks (loop/sinks.py): every line reaches every sink, the run log and the loop
name none, and the TensorBoard sink is built only when asked for."""

from __future__ import annotations

import inspect
import json
import sys

import pytest

from hvdtrain.config import RunConfig
from hvdtrain.loop import run_log, trainer
from hvdtrain.loop.run_log import RunLog
from hvdtrain.loop.sinks import JsonlSink, build_sinks
from hvdtrain.run_output import read_jsonl
from test_trainer import make_trainer


class FakeSink:
    """What a tracker (MLflow, W&B) would be: record and close."""

    def __init__(self):
        self.records: list[tuple[str, dict]] = []
        self.closed = False

    def record(self, kind, fields):
        self.records.append((kind, fields))

    def close(self):
        self.closed = True


def test_a_sink_receives_every_line_of_the_log(tmp_path):
    fake = FakeSink()
    calls = []

    def sinks(run_dir, append, first_step):
        calls.append((run_dir, append, first_step))
        return [*build_sinks(RunConfig(), run_dir, append, first_step), fake]

    # reached inside an epoch (test_stop_at_target): a run with a line of every type
    t = make_trainer(tmp_path, epochs=8, log_steps=True, eval_every_steps=4,
                     stop_at="test_acc>=0.85")
    t.log.make_sinks = sinks
    t.fit()
    lines = read_jsonl(tmp_path / "metrics.jsonl")
    assert {r["type"] for r in lines} == {"header", "step", "eval", "epoch", "stop"}
    as_written = [(r.pop("type"), {k: v for k, v in r.items() if k != "time"}) for r in lines]
    assert [(kind, json.loads(json.dumps(fields, default=str))) for kind, fields in
            fake.records] == as_written
    assert fake.closed and calls == [(tmp_path, False, 1)]


def test_the_sinks_come_from_the_config(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # a run without --tensorboard needs none
    sinks = build_sinks(RunConfig(), tmp_path, append=False)
    assert [type(s) for s in sinks] == [JsonlSink]
    sinks[0].close()


def test_tensorboard_is_a_sink_when_asked_for(tmp_path):
    pytest.importorskip("tensorboard")
    from hvdtrain.loop.tensorboard import TensorBoardSink

    sinks = build_sinks(RunConfig(tensorboard=True), tmp_path, append=False, first_step=1)
    assert [type(s) for s in sinks] == [JsonlSink, TensorBoardSink]
    sinks[1].record("header", {"world_size": 2, "num_parameters": 10})  # describes, plots nothing
    sinks[1].record("epoch", {"step": 4, "train_loss": 0.5})
    for sink in sinks:
        sink.close()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    assert events.Tags()["scalars"] == ["train/loss"]


def test_a_new_main_process_continues_the_sinks_and_a_former_one_closes_them(tmp_path, capsys):
    fake, calls = FakeSink(), []
    log = RunLog(1, None, [], is_main=False, progress_bar=False, log_steps=False,
                 sinks=lambda *args: calls.append(args) or [fake])
    log.write("step", step=1)  # not the main process: nowhere to write
    log.follow_main(True, tmp_path, global_step=7)
    log.write("step", step=8)
    assert calls == [(tmp_path, True, 8)] and fake.records == [("step", {"step": 8})]
    assert "this process is rank 0 now" in capsys.readouterr().out
    log.follow_main(False, tmp_path)
    assert fake.closed and log.sinks == []


def test_the_run_log_and_the_loop_name_no_sink():
    for module in (run_log, trainer):
        code = inspect.getsource(module).lower()
        assert "tensorboard" not in code and "jsonl" not in code.replace("metrics.jsonl", "")
