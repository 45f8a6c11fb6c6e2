"""hvdtrain doctor's checks (issue 44), each fault fed to them as fake per-rank facts: the checks
are pure functions over what the ranks gathered, so no process is started here."""

from __future__ import annotations

import copy

from hvdtrain.doctor.asked import Asked
from hvdtrain.doctor.environment_checks import check_clocks, check_environment
from hvdtrain.doctor.folder_checks import check_run_dir
from hvdtrain.doctor.host_checks import check_hosts, never_started
from hvdtrain.doctor.network_checks import check_interfaces, check_links
from hvdtrain.doctor.version_checks import check_devices, check_versions

VERSIONS = {"python": "3.11.7", "hvdtrain": "0.1.0", "torch": "2.13.0", "mpi4py": "4.1.2",
            "horovod": "0.28.1"}
HOROVOD = {"version": "0.28.1", "mpi": True, "gloo": True, "nccl": False}


def rank(r: int, host: str, **changes) -> dict:
    facts = {"rank": r, "host": host, "pid": 100 + r, "executable": "/venv/bin/python",
             "versions": dict(VERSIONS), "horovod": dict(HOROVOD), "gpus": 0, "cuda": None,
             "nccl": None, "addresses": {"lo": "127.0.0.1", "eth0": f"10.0.0.{ord(host[0])}"},
             "told": {}, "routes": {},
             "env": {"PATH_VENV": "/venv", "HOROVOD_CYCLE_TIME": "1"},
             "run_dir": {"path": "/shared/runs", "writable": True, "error": None,
                         "sees_rank0": True}}
    for key, value in changes.items():
        facts[key] = value
    return facts


def cluster(layout: dict[str, int]) -> list[dict]:
    ranks, r = [], 0
    for host, count in layout.items():
        for _ in range(count):
            ranks.append(rank(r, host))
            r += 1
    return ranks


def lines(problems) -> list[str]:
    return [p.line() for p in problems]


def test_a_healthy_cluster_has_no_problem():
    ranks = cluster({"a": 2, "b": 2})
    asked = Asked({"a": 2, "b": 2}, 4, "-H")
    assert check_hosts(ranks, asked) == []
    assert check_versions(ranks) == check_devices(ranks) == check_interfaces(ranks) == []
    assert check_run_dir(ranks, "runs") == check_environment(ranks, "mpirun") == []


def test_open_mpi_s_single_node_fallback_is_named():
    problems = check_hosts(cluster({"a": 4}), Asked({"a": 2, "b": 2}, 4, "-H"))
    assert len(problems) == 1
    assert "all 4 ranks ran on a, though -H asked for a, b" in problems[0].line()
    assert "fix:" in problems[0].line()


def test_a_hostfile_whose_slots_differ_from_what_ran():
    ranks = cluster({"a": 3, "b": 1})
    problems = check_hosts(ranks, Asked({"a": 2, "b": 2}, None, "hostfile hf", "hf"))
    text = "\n".join(lines(problems))
    assert "a: 3 rank(s) ran there, hostfile hf asked for 2" in text
    assert "write 'a slots=3' in hf" in text
    assert "b: 1 rank(s) ran there" in text


def test_a_host_that_ran_nothing_and_one_nobody_asked_for():
    problems = lines(check_hosts(cluster({"a": 2, "c": 2}), Asked({"a": 2, "b": 2}, 4, "-H")))
    assert any("b: no rank ran there" in p and "ssh b" in p for p in problems)
    assert any("2 rank(s) ran on c, which -H does not name" in p for p in problems)


def test_hosts_are_matched_by_short_name_and_by_address_but_addresses_stay_whole():
    ranks = [rank(0, "a.cluster.local"), rank(1, "10.213.0.2", addresses={"hvd0": "10.213.0.2"})]
    assert check_hosts(ranks, Asked({"a": 1, "10.213.0.2": 1}, 2, "-H")) == []
    two = [rank(0, "10.213.0.1", addresses={"hvd0": "10.213.0.1"}),
           rank(1, "10.213.0.2", addresses={"hvd0": "10.213.0.2"})]
    assert check_hosts(two, Asked({"10.213.0.1": 1, "10.213.0.2": 1}, 2, "-H")) == []
    resolved = {"b": "10.213.0.2"}  # -H b, and b's ranks report their address only
    assert check_hosts(two, Asked({"10.213.0.1": 1, "b": 1}, 2, "-H"), resolved) == []


def test_np_below_the_slots_leaves_a_host_empty():
    problems = lines(check_hosts(cluster({"a": 2}), Asked({"a": 2, "b": 2}, 2, "-H")))
    assert any("b: -np 2 fills the first hosts' slots" in p for p in problems)


def test_ranks_that_never_started_name_the_silent_host():
    asked = Asked({"a": 2, "b": 2}, 4, "-H")
    on_a = {"host": "a", "addresses": {0: "10.0.0.1"}}
    problems = lines(never_started(asked, {0: on_a, 1: on_a}, 4, 60))
    assert "no rank on b answered within 60 s (2 rank(s) on a did)" in problems[0]
    assert "2 of 4 rank(s) started" in lines(never_started(None, {0: on_a, 1: on_a}, 4, 60))[0]
    by_address = Asked({"10.0.0.1": 2, "10.0.0.2": 2}, 4, "-H")  # -H by address, named hosts
    assert "no rank on 10.0.0.2 answered" in lines(never_started(by_address, {0: on_a}, 4, 60))[0]
    # Open MPI starts no rank until it reaches every host: none answered, and none was named
    assert "on any of a, b (the launcher starts its ranks once it reaches every host" in \
        lines(never_started(asked, {}, 4, 60))[0]
    told = lines(never_started(asked, {}, 4, 60, unreachable={"b": "Connection timed out"}))[0]
    assert "ssh from here cannot reach b (b: Connection timed out)" in told


def test_a_host_with_another_torch_and_venv_is_named_with_its_executable():
    ranks = cluster({"a": 2, "b": 2, "c": 2})
    for facts in ranks[2:4]:
        facts["versions"]["torch"] = "2.1.0"
        facts["executable"] = "/other/bin/python"
    problems = lines(check_versions(ranks))
    assert problems == ["doctor: versions: torch 2.1.0 on b (/other/bin/python), 2.13.0 on the "
                        "others -- fix: install the same torch on every host, or put the same "
                        "venv first on PATH on b (mpirun -x PATH, or the same image)"]


def test_a_missing_hvdtrain_and_another_horovod_build():
    ranks = cluster({"a": 1, "b": 1})
    ranks[1]["versions"]["hvdtrain"] = None
    ranks[1]["horovod"] = {**HOROVOD, "mpi": False}
    problems = lines(check_versions(ranks))
    assert any("hvdtrain not installed on b" in p for p in problems)
    assert any("Horovod on b is built with Gloo, on the others with MPI+Gloo" in p
               for p in problems)


def test_fewer_gpus_than_ranks_and_cuda_that_differs():
    ranks = cluster({"a": 4, "b": 4})
    for facts in ranks:
        facts.update(gpus=4 if facts["host"] == "a" else 2, cuda="12.1", nccl="2.18.1")
    ranks[4]["cuda"] = "11.8"
    problems = lines(check_devices(ranks))
    assert any("b: 4 ranks and 2 GPU(s)" in p and "-H b:2" in p for p in problems)
    assert any("CUDA 11.8 on b, 12.1 on the others" in p for p in problems)


def test_one_gpu_per_rank_by_cuda_visible_devices_is_enough():
    ranks = cluster({"a": 2})
    for i, facts in enumerate(ranks):
        facts.update(gpus=1, cuda="12.1")
        facts["env"]["CUDA_VISIBLE_DEVICES"] = str(i)
    assert check_devices(ranks) == []
    assert check_devices(cluster({"a": 2})) == []  # CPUs only: no GPU is missing


def test_an_interface_a_host_lacks_and_a_route_through_the_loopback():
    ranks = cluster({"a": 1, "b": 1})
    for facts in ranks:
        facts["told"] = {"gloo": "HOROVOD_GLOO_IFACE=eth0"}
    ranks[1]["addresses"] = {"lo": "127.0.0.1", "ens5": "10.0.0.98"}
    ranks[0]["routes"] = {"b": "lo"}
    problems = lines(check_interfaces(ranks))
    assert any("b has no interface eth0 (HOROVOD_GLOO_IFACE=eth0)" in p for p in problems)
    assert any("a reaches b through the loopback" in p for p in problems)
    ranks[1]["told"] = {"nccl": "NCCL_SOCKET_IFNAME=en"}  # NCCL takes a prefix
    ranks[1]["routes"] = {"a": "ens5"}
    assert not any("b has no interface" in p for p in lines(check_interfaces(ranks)))


def test_a_link_far_below_the_others_is_flagged():
    links = [{"hosts": ["a", "b"], "bandwidth_mbit": 940.0, "latency_ms": 0.1},
             {"hosts": ["a", "c"], "bandwidth_mbit": 930.0, "latency_ms": 0.1},
             {"hosts": ["b", "c"], "bandwidth_mbit": 95.0, "latency_ms": 0.1}]
    problems = lines(check_links(links))
    assert problems == ["doctor: network: link b-c: 95.0 Mbit/s, far below the other links' "
                        "median 935.0 Mbit/s -- fix: check that pair's interfaces and path "
                        "(ethtool, tc qdisc, the switch port), or keep the job off it"]
    assert check_links(links[:1]) == []  # one link: nothing to compare it with


def test_a_slow_host_among_three_has_both_its_links_flagged():
    # Host c's own link is slow: two of the three links are, and the median of all three is
    # one of them; each is compared with the others' median instead.
    links = [{"hosts": ["a", "b"], "bandwidth_mbit": 940.0, "latency_ms": 0.1},
             {"hosts": ["a", "c"], "bandwidth_mbit": 95.0, "latency_ms": 0.1},
             {"hosts": ["b", "c"], "bandwidth_mbit": 90.0, "latency_ms": 0.1}]
    problems = lines(check_links(links))
    assert [p.split(":")[2].strip() for p in problems] == ["link a-c", "link b-c"], problems
    # links of about the same rate: none is far below the others
    assert check_links([{**link, "bandwidth_mbit": rate} for link, rate
                        in zip(links, (940.0, 700.0, 880.0))]) == []


def test_a_run_dir_not_shared_and_one_not_writable():
    ranks = cluster({"a": 1, "b": 1, "c": 1})
    ranks[1]["run_dir"] = {**ranks[1]["run_dir"], "sees_rank0": False}
    ranks[2]["run_dir"] = {"path": "/x", "writable": False, "error": "PermissionError: denied",
                           "sees_rank0": False}
    problems = lines(check_run_dir(ranks, "runs"))
    assert any("runs is not writable on c (PermissionError: denied)" in p for p in problems)
    assert any("b see(s) a different runs than a" in p for p in problems)
    assert not any("c see(s)" in p for p in problems)


def test_a_variable_that_does_not_reach_the_second_host():
    ranks = cluster({"a": 2, "b": 2})
    for facts in ranks[:2]:
        facts["env"]["HOROVOD_FUSION_THRESHOLD"] = "0"
    problems = lines(check_environment(ranks, "mpirun"))
    assert problems == ["doctor: environment: HOROVOD_FUSION_THRESHOLD is set on a but not on "
                        "b -- fix: mpirun -x HOROVOD_FUSION_THRESHOLD (or set it in each host's "
                        "shell profile)"]
    assert "srun --export=ALL,HOROVOD_FUSION_THRESHOLD" in lines(
        check_environment(ranks, "srun"))[0]


def test_a_variable_with_another_value_and_one_that_reached_no_rank():
    ranks = cluster({"a": 1, "b": 1, "c": 1})
    ranks[2]["env"]["PATH_VENV"] = "/other"
    launcher_env = {"NCCL_DEBUG": "INFO", "PATH_VENV": "/venv"}
    problems = lines(check_environment(ranks, "mpirun", launcher_env))
    # PATH_VENV is no variable to set: the fix is the PATH that finds the venv
    assert any("environment: PATH finds python in '/other' on c, in '/venv' on the others -- fix: "
               "put the same venv first on PATH on every host: mpirun -x PATH (or set it" in p
               for p in problems), problems
    assert any("NCCL_DEBUG is set where the launcher runs but reached no rank" in p and
               "mpirun -x NCCL_DEBUG" in p for p in problems)


def test_per_rank_devices_may_differ():
    ranks = cluster({"a": 1, "b": 1})
    ranks[0]["env"]["CUDA_VISIBLE_DEVICES"], ranks[1]["env"]["CUDA_VISIBLE_DEVICES"] = "0", "1"
    assert check_environment(copy.deepcopy(ranks)) == []


def test_a_clock_more_than_a_second_off():
    problems = lines(check_clocks({"a": 0.0, "b": 0.2, "c": -3.5}, "a"))
    assert problems == ["doctor: clock: c's clock is 3.50 s behind a's (rank 0) -- fix: run NTP "
                        "(chrony, systemd-timesyncd) on every host"]


def test_fewer_ranks_than_asked_for():
    problems = lines(check_hosts(cluster({"n01": 2}), Asked({}, 4, "SLURM_JOB_NODELIST")))
    assert problems == ["doctor: hosts: 2 ranks answered, 4 were asked for (-np 4) -- fix: give "
                        "the launcher as many ranks as the job asks for (-np, srun -n) and the "
                        "hosts slots for them"]
