"""--staleness-lr (Zhang et al. 2016): the server scales each gradient's step by 1/max(1, s)."""

import pytest
import torch

from hvdtrain.rules.staleness_lr import staleness_lr_factor
from launch import final_model, hvdtrain, mpirun, records, run

pytestmark = pytest.mark.multiproc
# One worker that pulls every 3rd push: its gradients are 0, 1 and 2 updates stale in turn, the
# same in every run, so the factors the server applies are known in advance.
FLAGS = ["--mode", "async", "--epochs", "1", "--max-steps-per-epoch", "30", "--pull-every", "3",
         "--no-progress", "--seed", "4"]


def scheme_line(run_dir):
    return records(run_dir, "scheme")[0]


def test_the_server_scales_each_step_by_its_staleness(tmp_path):
    plain, scaled = tmp_path / "plain", tmp_path / "scaled"
    run(mpirun(2, *hvdtrain("train", *FLAGS, "--run-dir", str(plain))))
    run(mpirun(2, *hvdtrain("train", *FLAGS, "--staleness-lr", "--run-dir", str(scaled))))
    histogram = {int(s): n for s, n in scheme_line(scaled)["staleness_histogram"].items()}
    assert histogram == {0: 10, 1: 10, 2: 10}, histogram
    expected = sum(n * staleness_lr_factor(s) for s, n in histogram.items()) / 30
    assert scheme_line(scaled)["servers"][0]["mean_lr_factor"] == pytest.approx(expected)
    assert "mean_lr_factor" not in scheme_line(plain)["servers"][0]
    a, b = final_model(plain), final_model(scaled)
    assert any(not torch.equal(a[k], b[k]) for k in a), "the scaled steps changed nothing"


def test_the_factor_and_its_rule_against_bsp(tmp_path):
    assert [staleness_lr_factor(s) for s in (0, 1, 2, 4)] == [1.0, 1.0, 0.5, 0.25]
    proc = run(hvdtrain("train", "--mode", "async", "--bsp", "--staleness-lr"), check=False)
    assert proc.returncode == 2 and "--staleness-lr" in proc.stderr, proc.stderr
