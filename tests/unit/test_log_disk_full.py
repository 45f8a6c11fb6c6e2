"""A full disk while the metrics log is written (issue 14 item 4): the run stops with the file, the
OS error and what is intact, and every line left in metrics.jsonl parses."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import textwrap

import pytest

from hvdtrain import checkpoint, run_output
from hvdtrain.loop import TrainingError
from hvdtrain.loop.run_log import RunLog
from hvdtrain.run_output import JsonlLog, LogWriteError, read_jsonl

from launch import run


def _disk_with_room_for(monkeypatch, room: int) -> None:
    """The log's writes take ``room`` more bytes, the last of them part of a line, then fail
    with ENOSPC as a full disk does."""
    real_write = os.write
    left = [room]

    def write(fd, data):
        if left[0] <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        n = real_write(fd, bytes(data[:left[0]]))
        left[0] -= n
        return n

    monkeypatch.setattr(run_output.os, "write", write)


def _lines_parse(path) -> list[dict]:
    text = path.read_text()
    assert text.endswith("\n"), "the last line is cut short"
    return [json.loads(line) for line in text.splitlines()]


def test_a_line_the_disk_has_no_room_for_is_taken_back_whole(tmp_path, monkeypatch):
    path = tmp_path / "metrics.jsonl"
    log = JsonlLog(path)
    log.write("header", note="x" * 50)
    size = path.stat().st_size
    _disk_with_room_for(monkeypatch, 30)  # not even one more whole line
    with pytest.raises(LogWriteError) as error:
        for step in range(10):
            log.write("step", step=step, loss=0.5)
    log.close()
    assert str(path) in str(error.value) and "No space left on device" in str(error.value)
    assert "cut back to its last whole line" in str(error.value)
    assert path.stat().st_size == size
    assert [r["type"] for r in _lines_parse(path)] == ["header"]


def test_a_real_file_size_limit_leaves_only_whole_lines(tmp_path):
    # RLIMIT_FSIZE makes the kernel take part of a write, then refuse with EFBIG, as a full disk
    # does with ENOSPC. In a child process: the limit would also hold pytest's own files.
    child = textwrap.dedent("""
        import resource, signal, sys
        from hvdtrain.run_output import JsonlLog, LogWriteError
        resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # else the kernel kills the process
        log = JsonlLog(sys.argv[1], append=True)
        try:
            for step in range(100):
                log.write("step", step=step, loss=0.25)
        except LogWriteError as e:
            print(e)
    """)
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"type": "header"}\n')
    proc = subprocess.run([sys.executable, "-c", child, str(path)], capture_output=True,
                          text=True, timeout=60, check=True)
    assert f"could not write to {path} (File too large)" in proc.stdout, proc.stdout + proc.stderr
    records = _lines_parse(path)
    assert records[0] == {"type": "header"}
    assert [r["step"] for r in records[1:]] == list(range(len(records) - 1))
    assert 900 < path.stat().st_size <= 1000


def test_the_run_log_stops_training_with_what_is_intact(tmp_path, monkeypatch):
    log = RunLog(1, None, [], is_main=True, progress_bar=False, log_steps=True)
    log.open(tmp_path, append=False, header={"config": {}})
    _disk_with_room_for(monkeypatch, 10)
    with pytest.raises(TrainingError, match="no checkpoint was written yet"):
        log.write("step", step=1, loss=0.5)
    (tmp_path / checkpoint.CHECKPOINT_NAME).write_bytes(b"a checkpoint")
    with pytest.raises(TrainingError) as error:
        log.write("step", step=1, loss=0.5)
    log.close()
    assert (f"the last checkpoint {tmp_path / checkpoint.CHECKPOINT_NAME} is intact; free space "
            f"and continue with --resume {tmp_path}") in str(error.value)
    assert [r["type"] for r in _lines_parse(tmp_path / "metrics.jsonl")] == ["header"]


def test_a_new_log_still_keeps_the_old_one_aside(tmp_path, capsys):
    path = tmp_path / "metrics.jsonl"
    JsonlLog(path).write("header", run=1)
    second = JsonlLog(path)
    second.write("header", run=2)
    second.close()
    kept = list(tmp_path.glob("metrics.*.jsonl"))
    assert len(kept) == 1 and read_jsonl(kept[0])[0]["run"] == 1
    assert read_jsonl(path)[0]["run"] == 2 and "it is kept as" in capsys.readouterr().out
    appended = JsonlLog(path, append=True)
    appended.write("step", step=1)
    appended.close()
    assert [r["type"] for r in read_jsonl(path)] == ["header", "step"]


# One process trains a run, then resumes it on a full disk (one launch, not two). Horovod starts
# MPI, whose start-up writes files larger than the limit: start MPI first, train the run the
# limited one resumes, keep its log and checkpoint aside, then limit every file the process
# writes and run the command's own entry point again.
LIMITED_COMMAND = """
import resource, shutil, signal, sys
from pathlib import Path
from mpi4py import MPI
from hvdtrain.cli import main
run_dir, flags = Path(sys.argv[1]), sys.argv[2:]
print("FIRST", main([*flags, "--epochs", "1", "--run-dir", str(run_dir)]), flush=True)
before = (run_dir / "metrics.jsonl").read_bytes()
shutil.copy(run_dir / "metrics.jsonl", run_dir.parent / "before.jsonl")
shutil.copy(run_dir / "checkpoint.pt", run_dir.parent / "before.pt")
# Room for the resumed run's header and five and a half step lines: the log fills up in
# epoch 2, part-way through a line, before that epoch's checkpoint (larger) is due.
header, step = before.splitlines(keepends=True)[:2]
limit = len(before) + len(header) + 11 * len(step) // 2
print("LIMIT", limit, flush=True)
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
sys.exit(main([*flags, "--epochs", "3", "--resume", str(run_dir)]))
"""


@pytest.mark.multiproc
def test_train_with_log_steps_on_a_full_disk_exits_1_and_the_log_parses(tmp_path):
    run_dir = tmp_path / "run"
    flags = ["train", "--no-progress", "--log-steps", "--max-steps-per-epoch", "20"]
    proc = run([sys.executable, "-c", LIMITED_COMMAND, str(run_dir), *flags], check=False)
    assert "FIRST 0\n" in proc.stdout, proc.stdout + proc.stderr  # the run it resumes
    limit = int(proc.stdout.split("LIMIT ")[1].split()[0])
    log = run_dir / "metrics.jsonl"
    before = (tmp_path / "before.jsonl").read_bytes()
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert f"could not write to {log} (File too large)" in proc.stderr
    assert "every line in it parses" in proc.stderr
    assert f"the last checkpoint {run_dir / checkpoint.CHECKPOINT_NAME} is intact" in proc.stderr
    records = _lines_parse(log)
    assert log.read_bytes().startswith(before) and len(log.read_bytes()) <= limit
    assert [r["type"] for r in records].count("header") == 2
    assert records[-1]["type"] == "step" and records[-1]["epoch"] == 2
    assert (run_dir / checkpoint.CHECKPOINT_NAME).read_bytes() == (
        tmp_path / "before.pt").read_bytes()


def test_a_failing_workers_stop_line_stays_the_last_line(tmp_path):
    """An async worker that fails appends the stop line, then aborts the job; the lead, still
    at work, wrote an epoch line after it (1 run in 5), and the log no longer ended at its
    stop line. The failing process keeps the log locked until it ends."""
    import threading

    path = tmp_path / "metrics.jsonl"
    lead = JsonlLog(path)
    lead.write("epoch", epoch=1)
    failing = JsonlLog(path, append=True)  # another process's open file, as the worker's is
    failing.write_last("stop", reason="failed: rank 1: boom")
    late = threading.Thread(target=lead.write, args=("epoch",), kwargs={"epoch": 2}, daemon=True)
    late.start()
    late.join(0.5)
    assert late.is_alive()  # held until the failing process ends (its abort ends the lead too)
    assert [r["type"] for r in read_jsonl(path)] == ["epoch", "stop"]
    failing.close()  # here: the lock goes with the process
    late.join(5)
    assert not late.is_alive() and read_jsonl(path)[-1]["epoch"] == 2
