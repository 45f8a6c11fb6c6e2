"""``hvdtrain doctor`` on hosts made of network namespaces (scripts/netns/hosts.py): it passes on a
healthy pair, and names each fault of a first multi-host launch with its fix, exit 2: a host left
out of the hostfile's slots, a host whose PATH finds another venv (another hvdtrain), a link
throttled with tc tbf among normal ones (whose rate it measures within 20%), a run folder that is
not the same on every host, a variable the launcher does not forward to the other host.

The hosts other than the first start their commands with a login's environment, as over real
ssh, so what reaches a rank there is what mpirun forwards (-x). One set of hosts serves every
case; each case makes its fault and heals it after. The throttled link, the run folder and the
variable are one broken cluster's, one doctor run named by a test each: fewer launches, and the
doctor shown to name each of several faults at once, each on its own host."""

import json
import os
import shlex
import signal
import subprocess
import sys

import pytest

from hvdtrain.doctor.facts import watched
from launch import BIN, REPO, launcher_env

sys.path.insert(0, str(REPO / "scripts" / "netns"))
from hosts import Hosts, login_env, other_venv, unavailable_reason  # noqa: E402

REASON = unavailable_reason()
pytestmark = [pytest.mark.multiproc,
              pytest.mark.skipif(REASON is not None, reason=f"no network namespaces: {REASON}")]
RATE = 100  # Mbit/s of the throttled link
# Small messages, and a doctor that ends well within the test's time even when ranks hang.
DOCTOR = ["--sizes", "64KiB,1MiB", "--timeout", "45"]
LIMIT = 90  # seconds: a doctor still running then has missed its own --timeout
FORWARD = ["-x", "OMPI_ALLOW_RUN_AS_ROOT", "-x", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM",
           "-x", "PYTHONUNBUFFERED"]


@pytest.fixture(scope="module")
def hosts():
    with Hosts(3, tag=f"d{os.getpid()}") as made:
        yield made


@pytest.fixture
def cluster(hosts):
    """The hosts, healthy: every host but the first logs in with the system's PATH alone."""
    for host in range(1, len(hosts.names)):
        hosts.login_env(host, login_env())
    yield hosts
    hosts.heal()


def environment(hosts, **more) -> dict[str, str]:
    """The launching host's environment: the venv's bin first, what Open MPI needs as root,
    netns_ssh's host map; none of the variables the doctor compares across hosts (HOROVOD_*,
    NCCL_*, the tests' own HVDTRAIN_*...), which the tests forward only where they mean to."""
    env = {k: v for k, v in launcher_env().items()
           if not watched(k) or k.startswith(("HVDTRAIN_NETNS_", "OMPI_MCA_"))}
    env.update(hosts.env)
    env["PATH"] = f"{BIN}{os.pathsep}{env['PATH']}"
    return {**env, **more}


def doctor(hosts, tmp_path, command, env=None, expect_exit=None):
    """Run ``command`` on the first host (a shell line through netns_ssh, as ssh would); returns
    the output, the problem lines and doctor.json."""
    job = subprocess.Popen(hosts.on(0, [shlex.join(command)]), env=env or environment(hosts),
                           cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           stdin=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        stdout, stderr = job.communicate(timeout=LIMIT)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)  # the doctor, mpirun and the ranks on host A
        stdout, stderr = job.communicate()
        pytest.fail(f"the doctor still ran after {LIMIT} s (its --timeout is 45):\n"
                    f"{stdout[-3000:]}\n{stderr[-3000:]}")
    proc = subprocess.CompletedProcess(command, job.returncode, stdout, stderr)
    output = proc.stdout + proc.stderr
    if expect_exit is not None:
        assert proc.returncode == expect_exit, output[-5000:]
    report = json.loads((tmp_path / "doctor.json").read_text())
    problems = [line for line in proc.stdout.splitlines()
                if line.startswith("doctor: ") and " -- fix: " in line]
    return output, problems, report


def launched(hosts, tmp_path, launcher, expect="", forward=("-x", "PATH"), options=DOCTOR):
    """`hvdtrain doctor [--expect ...] mpirun LAUNCHER... <netns flags> -x ...`."""
    return [str(BIN / "hvdtrain"), "doctor", "--json", str(tmp_path / "doctor.json"),
            "--run-dir", str(tmp_path / "runs"), *options,
            *(["--expect", expect] if expect else []),
            "mpirun", *launcher, *hosts.mpirun_flags(), *FORWARD, *forward]


def slots(hosts, *counts) -> str:
    return ",".join(f"{hosts.addresses[i]}:{n}" for i, n in enumerate(counts) if n)


def problems_of(report, check):
    return [p for p in report["problems"] if p["check"] == check]


def test_the_doctor_passes_on_a_healthy_pair(cluster, tmp_path):
    output, problems, report = doctor(
        cluster, tmp_path, launched(cluster, tmp_path, ["-np", "2", "-H", slots(cluster, 1, 1)]),
        expect_exit=0)
    assert not problems, output
    assert output.rstrip().endswith("doctor: fit") or "doctor: fit" in output, output
    assert report["version"] == 1 and report["fit"] is True and report["ranks"] == 2
    assert sorted(report["hosts"]) == sorted(cluster.addresses[:2]), report["hosts"]
    link = report["links"][0]
    assert sorted(link["hosts"]) == sorted(cluster.addresses[:2])
    assert link["bandwidth_mbit"] > 0 and link["latency_ms"] > 0


def test_a_host_left_out_of_the_hostfiles_slots_is_named(cluster, tmp_path):
    # Open MPI runs both ranks on host A without a word when the hostfile gives host B no
    # slots (left out here; "slots=0" does the same).
    hostfile = cluster.hostfile(tmp_path / "hostfile", {0: 2})
    a, b = cluster.addresses[:2]
    output, problems, report = doctor(
        cluster, tmp_path, launched(cluster, tmp_path, ["-np", "2", "--hostfile", str(hostfile)],
                                    expect=slots(cluster, 1, 1)), expect_exit=2)
    assert report["fit"] is False and list(report["hosts"]) == [a], report["hosts"]
    found = [line for line in problems if line.startswith("doctor: hosts:")]
    assert found and any(b in line for line in found), output
    assert problems_of(report, "hosts") and all(p["fix"] for p in problems_of(report, "hosts"))
    assert output.rstrip().splitlines()[-1].startswith("doctor: NOT fit"), output


def test_a_host_whose_path_finds_another_venv_is_named(cluster, tmp_path_factory, tmp_path):
    # The job's command found through each host's PATH (no -x PATH): host B's login PATH finds
    # a venv with another hvdtrain first.
    venv = other_venv(tmp_path_factory.mktemp("venv") / "old", "0.0.9")
    cluster.login_env(1, login_env(path=f"{venv}{os.pathsep}{login_env()['PATH']}"))
    a, b = cluster.addresses[:2]
    command = ["mpirun", "-np", "2", "-H", slots(cluster, 1, 1), *cluster.mpirun_flags(), *FORWARD,
               "hvdtrain", "doctor", "--expect", slots(cluster, 1, 1),
               "--json", str(tmp_path / "doctor.json"), "--run-dir", str(tmp_path / "runs"),
               *DOCTOR]
    output, problems, report = doctor(cluster, tmp_path, command, expect_exit=2)
    assert report["hosts"][b]["hvdtrain"] == "0.0.9", report["hosts"][b]
    assert report["hosts"][a]["hvdtrain"] != "0.0.9"
    found = [line for line in problems if line.startswith("doctor: versions:")]
    assert found and any("0.0.9" in line and b in line for line in found), output
    assert problems_of(report, "versions"), report["problems"]


@pytest.fixture(scope="module")
def broken(hosts, tmp_path_factory):
    """One doctor run over three hosts with three faults at once, as a first launch often has
    them, each on its own host or variable so that none hides another: host C's link throttled
    to RATE both ways, host B seeing another folder at the run folder's path (as a host without
    the shared mount), and NCCL_SOCKET_IFNAME set where mpirun runs but not forwarded with -x,
    so that only host A's rank has it. Returns the run's folder and the doctor's output, problem
    lines and report."""
    tmp_path = tmp_path_factory.mktemp("broken")
    for host in range(1, len(hosts.names)):
        hosts.login_env(host, login_env())
    hosts.throttle(2, RATE)
    (tmp_path / "runs").mkdir()
    (tmp_path / "elsewhere").mkdir()
    hosts.mount(1, tmp_path / "elsewhere", tmp_path / "runs")
    try:
        # 4 MiB messages: 0.35 s each at the rate, the link's rate and not its bucket's burst
        command = launched(hosts, tmp_path, ["-np", "3", "-H", slots(hosts, 1, 1, 1)],
                           options=["--sizes", "64KiB,4MiB", "--timeout", "45"])
        found = doctor(hosts, tmp_path, command, expect_exit=2,
                       env=environment(hosts, NCCL_SOCKET_IFNAME="hvd0"))
    finally:
        hosts.heal()
    return tmp_path, *found


def test_a_throttled_link_among_normal_ones_is_named(hosts, broken):
    _, output, problems, report = broken
    c = hosts.addresses[2]
    assert report["fit"] is False, output
    found = [line for line in problems if line.startswith("doctor: network:")]
    # host C's two links and not A-B's, though the other faults slow nothing
    assert len(found) == 2 and all(c in line for line in found), output
    slow = [link for link in report["links"] if c in link["hosts"]]
    assert len(report["links"]) == 3 and len(slow) == 2, report["links"]
    assert problems_of(report, "network"), report["problems"]


def test_the_measured_bandwidth_of_a_throttled_link_is_its_rate(hosts, broken):
    _, _, _, report = broken
    c = hosts.addresses[2]
    for link in report["links"]:
        if c in link["hosts"]:
            assert abs(link["bandwidth_mbit"] / RATE - 1) <= 0.2, link
        else:
            assert link["bandwidth_mbit"] > 3 * RATE, link


def test_a_run_folder_not_the_same_on_every_host_is_named(hosts, broken):
    tmp_path, output, problems, report = broken
    a, b, c = hosts.addresses
    found = [line for line in problems if line.startswith("doctor: run_dir:")]
    # host B, compared with rank 0's host A; host C, which mounts the same folder, is not named
    assert found and any(f"{b} see(s) a different" in line and a in line for line in found), \
        output
    assert not any(c in line for line in found), output
    assert problems_of(report, "run_dir"), report["problems"]
    assert not list((tmp_path / "runs").iterdir()) and not list((tmp_path / "elsewhere").iterdir())


def test_a_variable_that_does_not_reach_the_other_host_is_named(hosts, broken):
    # Set where mpirun runs, not forwarded with -x: ranks on host A have it, hosts B and C's
    # do not.
    _, output, problems, report = broken
    a, b, c = hosts.addresses
    found = [line for line in problems if line.startswith("doctor: environment:")
             and "NCCL_SOCKET_IFNAME" in line]
    lacking = [line.split(" -- fix: ")[0].split("but not on ")[-1] for line in found]
    assert found and any(b in hosts_ and c in hosts_ and a not in hosts_
                         for hosts_ in lacking), output
    assert any("-x NCCL_SOCKET_IFNAME" in line for line in found), output
    assert problems_of(report, "environment"), report["problems"]
