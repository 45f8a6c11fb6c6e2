"""hvdtrain's Horovod build starts a collective as soon as it is enqueued when
HVDTRAIN_WAKE_ON_ENQUEUE=1, instead of at the background thread's next cycle
(scripts/setup/horovod-0.28.1-wake-on-enqueue.patch). With a 200 ms cycle the difference is
plain: without the wake each allreduce waits for a cycle, with it none does."""

import json

from launch import REPO, horovodrun, mpirun, run

SCRIPT = REPO / "tests" / "helpers" / "allreduce_latency.py"


def latencies(launch, wake: str) -> dict:
    env = {"HOROVOD_CYCLE_TIME": "200", "HVDTRAIN_WAKE_ON_ENQUEUE": wake}
    proc = run(launch(2, "python", str(SCRIPT)), env=env)
    line = next(line for line in proc.stdout.splitlines() if "LATENCY " in line)
    return json.loads(line.split("LATENCY ", 1)[1])


def test_a_collective_starts_when_enqueued_under_horovodrun_gloo():
    woken = latencies(horovodrun, "1")
    assert woken["single_ms"] < 40 and woken["grouped_ms"] < 40, woken
    # The same job without the wake: each allreduce waits for the next 200 ms cycle.
    cycled = latencies(horovodrun, "0")
    assert cycled["single_ms"] > 60, cycled


def test_a_collective_starts_when_enqueued_under_mpirun():
    woken = latencies(mpirun, "1")
    assert woken["single_ms"] < 40 and woken["grouped_ms"] < 40, woken
