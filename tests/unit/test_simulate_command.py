"""``hvdtrain compare --simulate`` as a user runs it: many virtual workers in one process, with
--global-batch keeping the global batch fixed, and the sweep over workers beside it (the
simulator's rules are tested in test_simulate.py). No mpirun is involved."""

import pytest
from helpers.forked_cli import run_forked

from hvdtrain.compare.report import parse_table

SMALL_PLAN = ["--modes", "sync,backup", "--backup-workers", "1", "--stragglers", "3x",
              "--seeds", "1", "--epochs", "3", "--model", "mlp", "--train-args=",
              "--eval-every-steps", "5", "--target", "0.5"]
# --sim-step-ms / --sim-apply-ms: given figures, and what they must go with.
GIVEN = ["--simulate", "--workers", "4", "--global-batch", "64", "--sim-step-ms", "10",
         "--sim-apply-ms", "0.5", *SMALL_PLAN]
NEED_SIMULATE = ((["--sim-step-ms", "5"], "add --simulate"),
                 (["--simulate", "--sweep-workers", "2,4", "--sim-step-ms", "5"],
                  "drop one of them"),
                 (["--simulate", "--sim-apply-ms", "-1"], "use 0 or more"))


@pytest.fixture(scope="module")
def compares(tmp_path_factory):
    """Every compare below, forked from one process that imports torch once (one launch, where
    each took its own: seven). Each has its own --out."""
    out = tmp_path_factory.mktemp("compares")
    argvs = {
        "sixteen": ["compare", "--simulate", "--workers", "16", "--global-batch", "64",
                    "--sweep-workers", "4,16", "--sweep-seeds", "1", "--out",
                    str(out / "sixteen"), *SMALL_PLAN],
        "uneven": ["compare", "--simulate", "--workers", "16", "--global-batch", "60",
                   "--out", str(out / "uneven"), *SMALL_PLAN],
        "a": ["compare", *GIVEN, "--out", str(out / "a")],
        "b": ["compare", *GIVEN, "--out", str(out / "b")],
        **{f"need{i}": ["compare", *extra, "--out", str(out / f"need{i}"), *SMALL_PLAN]
           for i, (extra, _) in enumerate(NEED_SIMULATE)}}
    procs = dict(zip(argvs, run_forked(list(argvs.values()), out / "cli", timeout=600)))
    return {"out": out, **procs}


def test_sixteen_simulated_workers_share_the_global_batch_and_the_sweep_runs_beside(compares):
    proc, out = compares["sixteen"], compares["out"] / "sixteen"
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "16 virtual workers, 4 samples a step each, sharing a global batch of 64" in \
        proc.stdout
    report = (out / "report.md").read_text()
    assert "SIMULATED" in report and "sharing a global batch of 64" in report
    table = [row for row in parse_table(report) if "/" in row["runs ok"]]  # not the sweep's
    assert [(row["straggler"], row["mode"], row["runs ok"], row["reached target"])
            for row in table] == [("3x", "sync", "1/1", "1/1"), ("3x", "backup1", "1/1", "1/1")]
    # each run stops at its target, as a real run of the plan does
    assert all(0.5 <= float(row["final test acc"]) < 0.9 for row in table)
    assert "simulated sweep over 4,16 workers sharing a global batch of 64" in proc.stdout
    assert (out / "sweep.png").stat().st_size > 0
    assert not (out / "runs").exists()  # nothing was launched


def test_a_global_batch_that_the_workers_cannot_share_is_refused(compares):
    proc = compares["uneven"]
    assert proc.returncode == 2
    assert "--global-batch 60 cannot be split evenly over --workers 16" in proc.stderr


def summary_times(out) -> dict[str, float]:
    import csv
    with open(out / "summary.csv", newline="") as f:
        return {row["name"]: float(row["time_to_target"]) for row in csv.DictReader(f)}


def test_given_step_and_server_figures_put_two_invocations_on_one_clock(compares):
    """--sim-step-ms / --sim-apply-ms replace the figures measured in this process (which drift
    with the machine's load), so two invocations give the same virtual times; with a 3x
    straggler and free communication a sync round is then exactly 3 x 10 ms. (The two run side
    by side, each in its own process, forked.)"""
    first, second = compares["a"], compares["b"]
    for proc in (first, second):
        assert proc.returncode == 0, proc.stdout + proc.stderr
    # a given step grows in proportion to its samples (a --balance share's compute)
    assert "a step computes in 10.0 ms (--sim-step-ms, in proportion to its samples)" \
        in first.stdout
    assert "0.50 ms (--sim-apply-ms)" in first.stdout
    times = summary_times(compares["out"] / "a")
    assert times == summary_times(compares["out"] / "b")
    sync = next(t for name, t in times.items() if name.startswith("sync"))
    rounds = sync / 0.030
    assert rounds >= 1 and abs(rounds - round(rounds)) < 1e-6, sync  # whole 30 ms rounds


def test_given_figures_need_simulate_and_no_sweep(compares):
    for i, (extra, message) in enumerate(NEED_SIMULATE):
        proc = compares[f"need{i}"]
        assert proc.returncode == 2, (extra, proc.stderr)
        assert message in proc.stderr, (extra, proc.stderr)
