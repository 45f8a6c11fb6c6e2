"""Multi-host training over a real network path: two network namespaces joined by a veth pair
stand in for two hosts, and mpirun and horovodrun launch across them over TCP
(scripts/netns/two_hosts.py). Results must equal the same training on one host."""

import os
import shlex
import sys

import pytest

from launch import BIN, REPO, final_model, horovodrun, hvdtrain, mpirun, run

sys.path.insert(0, str(REPO / "scripts" / "netns"))
from two_hosts import TwoHosts, unavailable_reason  # noqa: E402

REASON = unavailable_reason()
pytestmark = [pytest.mark.multiproc,
              pytest.mark.skipif(REASON is not None, reason=f"no network namespaces: {REASON}")]
FLAGS = ["--no-progress", "--seed", "3", "--epochs", "2", "--momentum", "0.9"]


@pytest.fixture(scope="module")
def hosts():
    with TwoHosts() as two:
        yield two


@pytest.fixture(scope="module")
def one_host_sync(tmp_path_factory):
    """The reference: the same sync training with both ranks on this host."""
    run_dir = tmp_path_factory.mktemp("one-host")
    run(mpirun(2, *hvdtrain("train", *FLAGS, "--run-dir", str(run_dir))))
    return final_model(run_dir)


def assert_same(a, b, tol):
    for name in a:
        worst = (a[name] - b[name]).abs().max().item()
        assert worst <= tol, f"{name} differs by {worst}"


def across(hosts, tmp_path, slots, *command):
    """mpirun started on host A, with ranks on both hosts, talking TCP over the veth pair."""
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("".join(f"{a} slots={n}\n" for a, n in zip(hosts.addresses, slots)))
    env = {**hosts.env, "PATH": f"{hosts.env['PATH']}{os.pathsep}{BIN}"}
    return run(hosts.on(0, ["mpirun", "-np", str(sum(slots)), "--hostfile", str(hostfile),
                            *hosts.mpirun_flags(), "-x", "PATH", "-x", "PYTHONUNBUFFERED",
                            "-x", "OMPI_ALLOW_RUN_AS_ROOT", "-x", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM",
                            *command]), env=env)


def test_sync_training_across_two_hosts_with_mpirun(hosts, one_host_sync, tmp_path):
    proc = across(hosts, tmp_path, (1, 1), *hvdtrain("train", *FLAGS, "--run-dir",
                                                     str(tmp_path / "run")))
    assert "done: test accuracy" in proc.stdout
    assert_same(final_model(tmp_path / "run"), one_host_sync, 1e-6)


def test_async_training_across_two_hosts_with_mpirun(hosts, one_host_sync, tmp_path):
    # Workers on host A, the parameter server alone on host B: every push and pull crosses the
    # network (message path; the shared-memory window only joins processes of one host).
    # Lock-step averaging through the server must reproduce sync training.
    across(hosts, tmp_path, (2, 1), *hvdtrain("train", *FLAGS, "--mode", "async", "--bsp",
                                              "--run-dir", str(tmp_path / "bsp")))
    assert_same(final_model(tmp_path / "bsp"), one_host_sync, 1e-5)
    # and fully asynchronous training completes across the hosts too
    proc = across(hosts, tmp_path, (2, 1), *hvdtrain("train", "--no-progress", "--mode", "async",
                                                     "--epochs", "2", "--run-dir",
                                                     str(tmp_path / "async")))
    assert "done: test accuracy" in proc.stdout


def test_sync_training_across_two_hosts_with_horovodrun(hosts, one_host_sync, tmp_path):
    env = {**hosts.env, "PATH": f"{hosts.env['PATH']}{os.pathsep}{BIN}"}
    command = horovodrun(2, *hvdtrain("train", *FLAGS, "--run-dir", str(tmp_path / "run")))
    command[3:3] = ["-H", ",".join(f"{a}:1" for a in hosts.addresses),
                    "--network-interface", "hvd0"]
    proc = run(hosts.on(0, command), env=env)
    assert "launcher: horovodrun --gloo" in proc.stdout
    assert_same(final_model(tmp_path / "run"), one_host_sync, 1e-6)


def test_compare_runs_its_plan_across_two_hosts(hosts, tmp_path):
    """compare --hostfile/--launcher-args: every run of the plan is launched across both hosts
    (mpirun --display-map shows where each rank went) and read into the report."""
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("".join(f"{a} slots=2\n" for a in hosts.addresses))
    launcher = [*hosts.mpirun_flags(), "--map-by", "node", "--display-map", "-x", "PATH",
                "-x", "PYTHONUNBUFFERED", "-x", "OMPI_ALLOW_RUN_AS_ROOT",
                "-x", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"]
    env = {**hosts.env, "PATH": f"{hosts.env['PATH']}{os.pathsep}{BIN}"}
    out = tmp_path / "compare"
    proc = run(hosts.on(0, hvdtrain("compare", "--out", str(out), "--modes", "sync,async",
                                    "--seeds", "1", "--stragglers", "none", "--epochs", "1",
                                    "--model", "mlp", "--train-args=", "--target", "0.3",
                                    "--hostfile", str(hostfile),
                                    # netns_ssh, like ssh, hands a shell one line
                                    "--launcher-args=" + shlex.quote(" ".join(launcher)))),
               env=env, timeout=600)
    assert "0 failed run(s)" in proc.stdout, proc.stdout
    for name in ("sync-seed0", "async-seed0"):
        output = (out / "runs" / name / "output.txt").read_text()
        # --map-by node puts consecutive ranks on alternating hosts: both hosts hold a rank.
        assert all(address in output for address in hosts.addresses), output[:2000]
    assert "across the hosts of" in (out / "report.md").read_text()
