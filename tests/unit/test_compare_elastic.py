"""compare --faults --modes ...,elastic (compare/plan.py): elastic sync runs under horovodrun
--gloo elastic on this machine's own host names, in one launch, and its goodput counts the
samples of the epochs it trained with fewer workers at their own size (compare/results.py)."""

import pytest

from hvdtrain.cli import build_parser
from hvdtrain.compare import command
from hvdtrain.compare.plan import ELASTIC, plan
from hvdtrain.compare.results import model_samples
from hvdtrain.config import ConfigError


def _options(tmp_path, *flags):
    return command.validate(build_parser().parse_args(
        ["compare", "--out", str(tmp_path / "out"), "--seeds", "1", *flags]))


def test_elastic_is_planned_beside_sync_async_and_backup_under_faults(tmp_path):
    cfg = _options(tmp_path, "--modes", "sync,elastic,async,backup", "--faults",
                   "kill:rank=1,step=40", "--workers", "2")
    modes = cfg.planned_modes()
    assert [m.name for m in modes] == ["sync", "async", "backup1", "elastic"]
    runs = {r.name: r for r in plan(modes, [0], ["none"], 2, ["--epochs", "3"],
                                    faults=cfg.faults)}
    elastic = runs["elastic-seed0"]
    assert elastic.mode == ELASTIC and elastic.processes == 2 and not elastic.restartable
    assert runs["sync-seed0"].restartable  # sync restarts from its checkpoint instead
    cmd = elastic.command("/venv/bin/python", "/out/runs/elastic-seed0", cores=4)
    assert cmd[0].endswith("horovodrun") and "mpirun" not in cmd
    assert cmd[cmd.index("--host-discovery-script") + 1] == "echo localhost:1; echo 127.0.0.1:1"
    assert cmd[cmd.index("--min-np") + 1] == "1" and cmd[cmd.index("--max-np") + 1] == "2"
    train = cmd[cmd.index("train"):]
    assert "--elastic" in train and "--auto-resume" not in train
    assert train[train.index("--inject-faults") + 1] == "kill:rank=1,step=40"
    assert train[-2:] == ["--epochs", "3"]
    # each worker sees a host of its own: it gets its share of the cores, not all of them
    assert train[train.index("--threads") + 1] == "2"


@pytest.mark.parametrize("flags, fix", [
    (["--modes", "sync,elastic"], "add --faults"),
    (["--modes", "elastic", "--faults", "kill:rank=1,step=4", "--workers", "3"],
     "use --workers 2 or fewer"),
])
def test_elastic_outside_what_it_can_run_is_refused_with_the_fix(tmp_path, flags, fix):
    with pytest.raises(ConfigError, match=f"--modes elastic: .*{fix}"):
        _options(tmp_path, *flags)


def _epoch(epoch, step, workers, samples=1408):
    return {"epoch": epoch, "step": step, "workers": workers, "samples": samples}


def test_goodput_counts_an_elastic_jobs_steps_at_the_size_its_world_had():
    header = {"config": {"run": {"batch_size": 32}}, "num_workers": 2}
    # 22 steps of 2 x 32, then (a worker lost) 44 steps of 32 an epoch; the stop 10 steps on
    epochs = [_epoch(1, 22, 2), _epoch(2, 66, 1), _epoch(3, 110, 1)]
    assert model_samples(header, epochs, {"step": 120}) == 3 * 1408 + 10 * 32
    # a job that kept its workers: its global steps times the global batch, as before
    steady = [_epoch(1, 22, 2), _epoch(2, 44, 2)]
    assert model_samples(header, steady, {"step": 50}) == 50 * 64
