"""--collective torch under a real mpirun: the same engine over torch.distributed ends on the
parameters that it ends on over Horovod, in sync and in DiLoCo (issue 42). The port's own logic
is tests/unit/test_torch_collective.py's."""

import pytest

from launch import SYNC_REFERENCE, final_model, hvdtrain, mpirun, records, run

pytestmark = pytest.mark.multiproc
WORKERS = 2
# digits, 8 steps of one epoch: two DiLoCo rounds of 4; a checkpoint at the end to compare
SHORT = ["--dataset", "digits", "--epochs", "1", "--max-steps-per-epoch", "8", "--seed", "3",
         "--eval-every", "1", "--checkpoint-every", "1", "--no-progress"]
# (flags, steps in the first epoch). Sync trains conftest's sync_reference (2 epochs of digits,
# 1437 // (32 x 2) = 22 steps each), whose run over Horovod it shares instead of a launch.
SCHEMES = {"sync": (SYNC_REFERENCE, 22),
           "diloco": ([*SHORT, "--local-steps", "4", "--outer-lr", "0.7"], 8)}


@pytest.mark.parametrize("scheme", ["sync", "diloco"])
def test_torch_and_horovod_end_on_the_same_parameters(tmp_path, request, scheme):
    flags, steps = SCHEMES[scheme]
    models = {}
    for collective in ("horovod", "torch"):
        run_dir = tmp_path / collective
        if scheme == "sync" and collective == "horovod":  # the default collective
            run_dir = request.getfixturevalue("sync_reference") / "run"
        else:
            run(mpirun(WORKERS, *hvdtrain("train", *flags, "--collective", collective,
                                          "--run-dir", str(run_dir))), timeout=120)
        models[collective] = final_model(run_dir)
        assert records(run_dir, "epoch")[0]["step"] == steps
        launcher = records(run_dir, "header")[0]["launcher"]
        assert ("torch.distributed gloo" in launcher) == (collective == "torch"), launcher
    horovod, torch_ = models["horovod"], models["torch"]
    assert horovod.keys() == torch_.keys()
    worst = max((horovod[k].double() - torch_[k].double()).abs().max().item() for k in horovod)
    assert worst < 1e-5, worst
