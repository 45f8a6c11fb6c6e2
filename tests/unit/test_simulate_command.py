"""``hvdtrain compare --simulate`` as a user runs it: many virtual workers in one process, with
--global-batch keeping the global batch fixed, and the sweep over workers beside it (the
simulator's rules are tested in test_simulate.py). No mpirun is involved."""

from hvdtrain.compare.report import parse_table
from launch import hvdtrain, run

SMALL_PLAN = ["--modes", "sync,backup", "--backup-workers", "1", "--stragglers", "3x",
              "--seeds", "1", "--epochs", "3", "--model", "mlp", "--train-args=",
              "--eval-every-steps", "5", "--target", "0.5"]


def test_sixteen_simulated_workers_share_the_global_batch_and_the_sweep_runs_beside(tmp_path):
    proc = run(hvdtrain("compare", "--simulate", "--workers", "16", "--global-batch", "64",
                        "--sweep-workers", "4,16", "--sweep-seeds", "1", "--out", str(tmp_path),
                        *SMALL_PLAN), timeout=300)
    assert "16 virtual workers, 4 samples a step each, sharing a global batch of 64" in \
        proc.stdout
    report = (tmp_path / "report.md").read_text()
    assert "SIMULATED" in report and "sharing a global batch of 64" in report
    table = [row for row in parse_table(report) if "/" in row["runs ok"]]  # not the sweep's
    assert [(row["straggler"], row["mode"], row["runs ok"], row["reached target"])
            for row in table] == [("3x", "sync", "1/1", "1/1"), ("3x", "backup1", "1/1", "1/1")]
    # each run stops at its target, as a real run of the plan does
    assert all(0.5 <= float(row["final test acc"]) < 0.9 for row in table)
    assert "simulated sweep over 4,16 workers sharing a global batch of 64" in proc.stdout
    assert (tmp_path / "sweep.png").stat().st_size > 0
    assert not (tmp_path / "runs").exists()  # nothing was launched


def test_a_global_batch_that_the_workers_cannot_share_is_refused(tmp_path):
    proc = run(hvdtrain("compare", "--simulate", "--workers", "16", "--global-batch", "60",
                        "--out", str(tmp_path), *SMALL_PLAN), check=False, timeout=60)
    assert proc.returncode == 2
    assert "--global-batch 60 cannot be split evenly over --workers 16" in proc.stderr


def summary_times(out) -> dict[str, float]:
    import csv
    with open(out / "summary.csv", newline="") as f:
        return {row["name"]: float(row["time_to_target"]) for row in csv.DictReader(f)}


def test_given_step_and_server_figures_put_two_invocations_on_one_clock(tmp_path):
    """--sim-step-ms / --sim-apply-ms replace the figures measured in this process (which drift
    with the machine's load), so two invocations give the same virtual times; with a 3x
    straggler and free communication a sync round is then exactly 3 x 10 ms."""
    fixed = ["--simulate", "--workers", "4", "--global-batch", "64", "--sim-step-ms", "10",
             "--sim-apply-ms", "0.5", *SMALL_PLAN]
    first = run(hvdtrain("compare", *fixed, "--out", str(tmp_path / "a")), timeout=300)
    run(hvdtrain("compare", *fixed, "--out", str(tmp_path / "b")), timeout=300)
    # a given step grows in proportion to its samples (a --balance share's compute)
    assert "a step computes in 10.0 ms (--sim-step-ms, in proportion to its samples)" \
        in first.stdout
    assert "0.50 ms (--sim-apply-ms)" in first.stdout
    times = summary_times(tmp_path / "a")
    assert times == summary_times(tmp_path / "b")
    sync = next(t for name, t in times.items() if name.startswith("sync"))
    rounds = sync / 0.030
    assert rounds >= 1 and abs(rounds - round(rounds)) < 1e-6, sync  # whole 30 ms rounds


def test_given_figures_need_simulate_and_no_sweep(tmp_path):
    for extra, message in ((["--sim-step-ms", "5"], "add --simulate"),
                           (["--simulate", "--sweep-workers", "2,4", "--sim-step-ms", "5"],
                            "drop one of them"),
                           (["--simulate", "--sim-apply-ms", "-1"], "use 0 or more")):
        proc = run(hvdtrain("compare", *extra, "--out", str(tmp_path), *SMALL_PLAN),
                   check=False, timeout=60)
        assert proc.returncode == 2, (extra, proc.stderr)
        assert message in proc.stderr, (extra, proc.stderr)
