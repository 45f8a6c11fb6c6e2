"""The simulated cluster (hvdtrain/compare/sim/) against real runs at N=2 (issue 16): with
the same 3x straggler, the simulated times to target agree with the real runs' (the simulator's
rules are unit-tested in tests/unit/test_simulate.py).

What the simulator takes as given is the length of one worker's step: the part that a
straggler stretches (the step's own compute: the hook is given the step's time without the wait
for the allreduce), and the rest of the round, which it does not stretch (the loop's own time,
the allreduce: Timing.loop_seconds). Both are calibrated from real runs with 2x and
4x stragglers (a round is loop + 2 steps, and loop + 4 steps), and the 3x runs test what the
simulator claims from them: the same steps to the target, and rounds of the loop's time and
three steps.

Why this calibration, measured on the 2-core machine:
- A fixed delay instead of 2x (a round of loop + step + 20 ms) slows the step that follows the
  long sleep: the straggler's update took 6.2-8.2 ms after 20 ms asleep and 4.5-4.9 ms after 5 ms
  (printed from Straggler.after_step), so the calibration came out 30% short at 3x.
- Whole runs differ from each other by up to 15% (the same 3x run, five times in a row: 15.0 to
  17.7 ms a step; within a run the epochs agree to 3%), and the machine's speed drifts over
  minutes. So each seed has its own 2x and 4x runs beside its 3x run, and the simulated time
  carries its calibration's spread: the test asks that the simulated and the real 95% intervals
  (bootstrap over the five seeds) overlap. With the real interval alone, a calibration as noisy
  as the runs it predicts would miss it in about one run in five even when exact.

Six runs in a row on the quiet machine all passed (about 100 s each); the simulated mean fell
inside the real interval itself in five of them."""

from pathlib import Path

import pytest

from hvdtrain.compare.plan import Mode
from hvdtrain.compare.results import curve, time_to_target
from hvdtrain.compare.sim.sweep import simulate_run
from hvdtrain.compare.sim.timing import Timing
from hvdtrain.compare.stats import bootstrap_ci
from hvdtrain.run_output import read_jsonl
from launch import hvdtrain, mpirun, run

pytestmark = pytest.mark.multiproc

SYNC = Mode("sync", scheme="sync")
TARGET = 0.95
SEEDS = range(5)
# A CNN whose step computes in ~5 ms on one thread. At epoch ends (22 steps) the seeds reach 95%
# after 4 or 5 epochs; 6 leave a margin. One thread per rank, as two ranks on two cores get by
# default.
WORKLOAD = ["--dataset", "digits", "--model", "cnn", "--channels", "64,128", "--threads", "1",
            "--eval-every-steps", "0", "--checkpoint-every", "0"]
REAL_3X = [*WORKLOAD, "--epochs", "6"]
# The calibration runs evaluate only at their end: no straggler sleep hides in evaluations.
CALIBRATION = [*WORKLOAD, "--epochs", "2", "--eval-every", "100"]
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


def timing_from_rounds(double: float, quadruple: float) -> Timing:
    """A real step as the straggler takes it (what it multiplies) and the loop's own time around
    it (what it does not), from two calibration rounds: with 2x a round is loop + 2 steps, with
    4x loop + 4 steps. (Rank 0's own split of its time cannot tell them apart: it waits for the
    straggler partly inside its update and partly in the stop vote that follows it.) A sync
    round is all the simulator needs, so the whole step goes in step_seconds; a loop that noise
    makes negative is taken as 0 with the step that keeps the 3x round, (2x + 4x) / 2."""
    step, loop = (quadruple - double) / 2, 2 * double - quadruple
    if loop < 0:
        step, loop = (double + quadruple) / 6, 0.0
    return Timing(step_seconds=step, loop_seconds=loop)


def test_simulated_time_to_target_agrees_with_the_real_runs(tmp_path):
    real, real_steps, sim, sim_steps, timings = [], [], [], [], []
    for seed in SEEDS:
        # Each seed's calibration brackets its 3x run: 2x before it, 4x after.
        calibration = tmp_path / f"calibration-{seed}"
        double = calibration_round(calibration / "2x", "2x")
        points = real_curve(tmp_path / f"3x-seed{seed}", REAL_3X, "3x", seed)
        quadruple = calibration_round(calibration / "4x", "4x")
        real.append(time_to_target(points, TARGET))
        real_steps.append(step_at_target(points))
        timing = timing_from_rounds(double, quadruple)
        timings.append(timing)
        simulated = simulate_run(SYNC, 2, "3x", seed, REAL_3X, TARGET, timing,
                                 stop_at_target=True)
        sim.append(simulated.time_to_target)
        sim_steps.append(simulated.curve[-1]["step"])
    assert None not in real, f"a real run missed {TARGET:.0%}: {real_steps}"
    assert sim_steps == real_steps, f"steps to target: simulated {sim_steps}, real {real_steps}"

    mean, low, high = bootstrap_ci(real)
    sim_mean, sim_low, sim_high = bootstrap_ci(sim)
    figures = (f"time to {TARGET:.0%}: real {mean:.3f} s [{low:.3f}, {high:.3f}] (per seed "
               f"{[round(t, 3) for t in real]}), simulated {sim_mean:.3f} s [{sim_low:.3f}, "
               f"{sim_high:.3f}] (per seed {[round(t, 3) for t in sim]}), at steps {real_steps}; "
               "calibrated step and loop (ms): "
               + ", ".join(f"{t.step_seconds * 1000:.2f}+{t.loop_seconds * 1000:.2f}"
                           for t in timings)
               + f"; the simulated mean is {'inside' if low <= sim_mean <= high else 'outside'}"
               " the real interval")
    print(figures)
    assert sim_low <= high and low <= sim_high, figures
