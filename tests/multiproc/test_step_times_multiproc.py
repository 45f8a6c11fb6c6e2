"""Per-worker step times in real jobs: a sync run names its slow rank, a run without one names
none, and an async run records each worker's step times and the servers' view of its pushes."""

import re
import socket

import pytest

from launch import hvdtrain, mpirun, records, run

pytestmark = pytest.mark.multiproc

WARNING = re.compile(r"slow rank (\d+) \(worker (\d+), host (\S+), pid (\d+)\): in epoch (\d+)")


def _train(run_dir, *args, np=2):
    proc = run(mpirun(np, *hvdtrain("train", "--no-progress", "--run-dir", str(run_dir),
                                    *args)))
    return proc.stdout + proc.stderr, records(run_dir, "epoch")


def test_a_sync_run_names_its_slow_rank_once_while_it_stays_slow(tmp_path):
    # 5x: in two full-suite runs on one machine rank 0's own compute per step was 1.6x rank
    # 1's unslowed one (0.8 against 0.49 ms), which brought a 3x straggler to 1.7-1.8x of it.
    # --hidden 1024,1024: a 3.5 ms step, so that the straggler sleeps ~14 ms and worker 0
    # waits 13-15 ms for it here (the straggler ~2 ms). With the default model (0.5 ms a step)
    # a loaded full-suite run saw every allreduce take ~20 ms on both ranks, and the 2.4 ms
    # sleep was lost in that (worker 0 waited 19.3 ms, the straggler 21.2).
    out, epochs = _train(tmp_path / "slow", "--straggler", "5x", "--epochs", "3",
                         "--hidden", "1024,1024")
    warnings = WARNING.findall(out)
    # One warning, in the second epoch (one slow epoch may be a hiccup of the machine), from
    # rank 1 itself: its own host and PID, no message gathered. It stays slow in the third,
    # which its epoch line records (below) without a second warning.
    assert [(rank, worker, epoch) for rank, worker, _, _, epoch in warnings] == \
        [("1", "1", "2")], out
    assert {host for _, _, host, _, _ in warnings} == {socket.gethostname()}
    assert "--balance" in out and "--straggler 5x slows a worker on purpose" in out
    for epoch in epochs:
        times = epoch["step_times"]
        assert times["steps"] == [epoch["step"] // epoch["epoch"]] * 2
        # the straggler computes about 5x as long and waits least; worker 0 waits for it
        assert times["compute_p50"][1] > 2 * times["compute_p50"][0], times
        assert times["wait_p50"][0] > times["wait_p50"][1], times
        if epoch["epoch"] > 1:
            # about 5x, as measured under load: a fresh-clone CI run (stop 49) read 8.49
            assert 2 < epoch["slow_workers"]["1"] < 12 and "0" not in epoch["slow_workers"]


def test_no_false_alarm_and_no_step_evaluation_without_a_straggler(tmp_path):
    # 89 steps an epoch (--batch-size 8): a median over that many is not one hiccup of the
    # scheduler. But two ranks on this 2-core machine share it with pytest and the launcher,
    # and a rank that loses its core for most of a 0.2 s epoch computes 1.5x as long (CI saw
    # it): that is a real, if short, slow rank, so the factor here is 2 (the straggler above
    # is 5x, and the straggler test shows the check names it).
    out, epochs = _train(tmp_path / "even", "--epochs", "3", "--batch-size", "8",
                         "--slow-rank-factor", "2")
    assert "slow rank" not in out, out
    assert len(epochs) == 3
    # A default-evaluation sync job: no step evaluation without --eval-every-steps, and the
    # training clock never ahead of the wall clock (test_eval_steps.py relies on this run).
    assert records(tmp_path / "even", "eval") == []
    assert all(e["train_seconds"] <= e["wall_seconds"] for e in epochs)
    assert all("slow_workers" not in e and len(e["step_times"]["compute_p50"]) == 2
               for e in epochs)


def test_an_async_run_records_worker_step_times_and_push_intervals(tmp_path):
    # 5x, as in the sync test above: 3 processes share 2 cores here, and a full-suite run saw
    # worker 0's own compute at 0.89 ms a step against the 3x straggler's 1.3 ms (1.46x).
    out, epochs = _train(tmp_path / "async", "--mode", "async", "--straggler", "5x",
                         "--epochs", "3", np=3)
    assert re.search(r"slow rank \d+ \(worker 1,", out), out
    last = epochs[-1]["step_times"]
    assert last["compute_p50"][1] > 2 * last["compute_p50"][0] > 0, last
    # async hands the batches to whoever asks: the fast worker trains more of them
    assert last["samples"][0] > last["samples"][1] > 0
    server = records(tmp_path / "async", "scheme")[0]["servers"][0]
    p50 = server["push_interval_p50_seconds"]
    assert len(p50) == 2 and p50[1] > 1.5 * p50[0], server
