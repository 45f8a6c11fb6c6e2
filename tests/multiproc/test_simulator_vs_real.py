"""The simulated cluster (hvdtrain/compare/simulate.py) against real runs at N=2 (issue 16): with
the same 3x straggler, the simulated time to target of real sync runs' seeds lies within the
real runs' 95% interval (the simulator's rules are unit-tested in tests/unit/test_simulate.py).

What the simulator takes as given is the length of one worker's step: its compute, measured
here, the rest of the update that a straggler stretches (the allreduce, the optimizer step),
which it lumps into Timing.allreduce_seconds, and the loop's own time around the update, which a
straggler does not stretch (Timing.loop_seconds). Both are calibrated in the test from other
real runs with a fixed delay and with 2x instead of 3x: their steps are the 3x runs' steps (each
rank computes while the other sleeps or waits, where a run without a straggler has both compute
at once, which on a machine with no core to spare is another step), and their sleeps are known.
The 3x runs then test what the simulator claims: the same steps to the target, and rounds of the
loop's time and three steps.

It passes on a quiet machine (twice out of two runs at the last change: simulated 1.51 s in the
real [1.49, 1.79], and 2.08 s in [1.63, 2.12]; the steps to target agree exactly), but the
calibration is a difference of two short runs' rounds and swings with the machine's load
(calibrated steps of 3.7 and 10.0 ms in one run). Calibrating over 4 epochs instead of 2 passed
once in three runs: the two misses were 7% and 16% short of the real mean, against real
intervals as narrow as +-2%. So it runs only when asked
(HVDTRAIN_VALIDATE_SIMULATOR=1; about a minute), not in CI on a shared machine."""

import os
from pathlib import Path

import pytest

from hvdtrain.compare.plan import Mode
from hvdtrain.compare.results import curve, time_to_target
from hvdtrain.compare.simulate import Timing, measure_timing, simulate_run
from hvdtrain.compare.stats import bootstrap_ci
from hvdtrain.metrics import read_jsonl
from launch import hvdtrain, mpirun, run

pytestmark = [pytest.mark.multiproc, pytest.mark.skipif(
    not os.environ.get("HVDTRAIN_VALIDATE_SIMULATOR"),
    reason="timing against real runs needs a quiet machine (see the module docstring); set "
           "HVDTRAIN_VALIDATE_SIMULATOR=1 to run this validation")]

SYNC = Mode("sync", scheme="sync")
TARGET = 0.95
SEEDS = range(5)
# A CNN whose step computes in ~5 ms on one thread. At epoch ends (22 steps) the seeds reach 95%
# after 4 or 5 epochs; 6 leave a margin. One thread per rank, as two ranks on two cores get by
# default and as the compute is timed here.
WORKLOAD = ["--dataset", "digits", "--model", "cnn", "--channels", "64,128", "--threads", "1",
            "--eval-every-steps", "0", "--checkpoint-every", "0"]
REAL_3X = [*WORKLOAD, "--epochs", "6"]
# The calibration runs evaluate only at their end: no straggler sleep hides in evaluations.
CALIBRATION = [*WORKLOAD, "--epochs", "2", "--eval-every", "100"]
CALIBRATION_DELAY = 0.02  # about the 3x straggler's sleep, twice a step
# Two calibration runs among the others: the speed of a shared machine drifts over a minute.
CALIBRATE_BEFORE = (1, 4)
# A rank waiting in MPI busy-polls by default, so on a machine with no core to spare it takes
# the straggler's core while it waits for it; yielding leaves each rank's compute to itself, as
# on a cluster with a core per worker, which is what the simulator models.
YIELDING_MPI = {"OMPI_MCA_mpi_yield_when_idle": "1"}


def real_curve(run_dir: Path, flags: list[str], straggler: str, seed: int) -> list[dict]:
    """A real 2-worker sync run's epochs and evaluations, timed as compare reads them
    (train_seconds)."""
    run(mpirun(2, *hvdtrain("train", *flags, "--straggler", straggler, "--seed", str(seed),
                            "--no-progress", "--run-dir", str(run_dir))),
        env=YIELDING_MPI)
    return curve(read_jsonl(run_dir / "metrics.jsonl"))


def step_at_target(points: list[dict]) -> int | None:
    return next((p["step"] for p in points
                 if p["test_acc"] is not None and p["test_acc"] >= TARGET), None)


def calibration_round(run_dir: Path, straggler: str) -> float:
    """Rank 0's time per step in a calibration run, over the whole run (start-up included, as
    in time to target)."""
    last = real_curve(run_dir, CALIBRATION, straggler, 0)[-1]
    return last["wall_seconds"] / last["step"]


def calibrated_step(run_dir: Path) -> tuple[float, float]:
    """A real step as the straggler takes it (what it multiplies), and the loop's own time
    around it (what it does not), from two calibration rounds: with a fixed delay D a round is
    loop + step + D, with 2x it is loop + 2 step. (Rank 0's own split of its time cannot tell
    them apart: it waits for the straggler partly inside its update and partly in the stop
    vote that follows it.)"""
    fixed = calibration_round(run_dir / "fixed", f"{CALIBRATION_DELAY * 1000:g}ms")
    double = calibration_round(run_dir / "2x", "2x")
    step = double - fixed + CALIBRATION_DELAY
    return step, max(0.0, fixed - step - CALIBRATION_DELAY)


def test_simulated_time_to_target_lies_in_the_real_runs_interval(tmp_path):
    real, real_steps, steps, loops = [], [], [], []
    for seed in SEEDS:
        if seed in CALIBRATE_BEFORE:
            step, loop = calibrated_step(tmp_path / f"calibration-{seed}")
            steps.append(step)
            loops.append(loop)
        points = real_curve(tmp_path / f"3x-seed{seed}", REAL_3X, "3x", seed)
        real.append(time_to_target(points, TARGET))
        real_steps.append(step_at_target(points))
    assert None not in real, f"a real run missed {TARGET:.0%}: {real_steps}"

    # What a real step has beyond the compute measured here is the simulator's
    # allreduce_seconds, and the loop's time its loop_seconds. (For sync a simulated round is
    # then the loop's time and three calibrated steps whatever the compute measured here, which
    # the other modes would use.)
    compute = measure_timing(WORKLOAD).step_seconds
    real_step, loop = sum(steps) / len(steps), sum(loops) / len(loops)
    timing = Timing(step_seconds=compute, allreduce_seconds=max(0.0, real_step - compute),
                    loop_seconds=loop)

    simulated = [simulate_run(SYNC, 2, "3x", seed, REAL_3X, TARGET, timing, stop_at_target=True)
                 for seed in SEEDS]
    sim = [r.time_to_target for r in simulated]
    assert None not in sim
    mean, low, high = bootstrap_ci(real)
    sim_mean = sum(sim) / len(sim)
    figures = (f"real time to {TARGET:.0%}: {mean:.3f} s [{low:.3f}, {high:.3f}] (per seed "
               f"{[round(t, 3) for t in real]} at steps {real_steps}); simulated: {sim_mean:.3f} s "
               f"(per seed {[round(t, 3) for t in sim]} at steps "
               f"{[r.curve[-1]['step'] for r in simulated]}); compute {compute * 1000:.2f} ms, "
               f"a real step {real_step * 1000:.2f} ms (calibrated: "
               f"{', '.join(f'{t * 1000:.2f}' for t in steps)}), the loop around it "
               f"{loop * 1000:.2f} ms")
    print(figures)
    assert low <= sim_mean <= high, figures
