"""hvdtrain doctor's input (issue 44): what was asked, read from a launcher line, --expect, a
hostfile or Slurm; its options; bad input as one message and exit 2; the verdict and doctor.json
over fake facts; a link test's arithmetic."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from hvdtrain.doctor import asked as asking
from hvdtrain.doctor.asked import Asked, DoctorInput
from hvdtrain.doctor.doctor_cli import refuse_program, under_launcher
from hvdtrain.doctor.doctor_options import checked, parse_sizes
from hvdtrain.doctor.facts import environment, fill_in, path_venv, watched
from hvdtrain.doctor.launcher import probe_command, run_doctor
from hvdtrain.doctor.rank import FACTS, STARTED, STEP
from hvdtrain.doctor.measure import link_summary
from hvdtrain.doctor.verdict import conclude

from test_doctor_checks import cluster


def test_mpirun_and_horovodrun_lines():
    a = asking.from_launcher(["mpirun", "-np", "4", "-H", "a:2,b:2", "--bind-to", "none"], {})
    assert (a.hosts, a.np, a.source) == ({"a": 2, "b": 2}, 4, "-H")
    h = asking.from_launcher(["horovodrun", "-np", "3", "-H", "a,b:2"], {})
    assert (h.hosts, h.np) == ({"a": 1, "b": 2}, 3)
    assert asking.from_launcher(["mpirun", "--np=2"], {}).np == 2


def test_a_hostfile_of_each_kind(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# the cluster\na slots=2\nb slots=2 max_slots=4\nc:3\nd\n")
    a = asking.from_launcher(["mpirun", "--hostfile", str(hostfile)], {})
    assert a.hosts == {"a": 2, "b": 2, "c": 3, "d": 1} and a.hostfile == str(hostfile)
    inside = asking.from_probe_options(None, None,
                                       {"OMPI_MCA_orte_default_hostfile": str(hostfile)})
    assert inside.hosts["c"] == 3 and "default hostfile" in inside.source
    hostfile.write_text("a slots=two\n")
    with pytest.raises(DoctorInput, match="no valid slot count"):
        asking.parse_hostfile(str(hostfile))
    with pytest.raises(DoctorInput, match="cannot read it"):
        asking.parse_hostfile(str(tmp_path / "missing"))


def test_slurm_s_variables():
    env = {"SLURM_JOB_NODELIST": "n[01-03],gpu7", "SLURM_TASKS_PER_NODE": "2(x3),1",
           "SLURM_NTASKS": "7"}
    a = asking.from_probe_options(None, None, env)
    assert a.hosts == {"n01": 2, "n02": 2, "n03": 2, "gpu7": 1} and a.np == 7
    # text after the brackets was lost: rack1-n[01-02]-ib read as one host "-ib"
    assert asking.expand_nodelist("rack1-n[01-02]-ib,x[1-2]y[3-4]") == [
        "rack1-n01-ib", "rack1-n02-ib", "x1y3", "x1y4", "x2y3", "x2y4"]
    s = asking.from_launcher(["srun", "-n", "4", "--ntasks-per-node", "2", "-w", "n[01-02]"], env)
    assert (s.hosts, s.np) == ({"n01": 2, "n02": 2}, 4)


def test_bad_input_names_the_fix():
    with pytest.raises(DoctorInput, match="unknown launcher 'ssh'"):
        asking.from_launcher(["ssh", "a"], {})
    for bad in ("a:0", "a:x,b:2", ","):
        with pytest.raises(DoctorInput, match="write it as a:2,b:2"):
            asking.parse_host_slots(bad, "--expect")
    with pytest.raises(DoctorInput, match="is not a size"):
        parse_sizes("64KiB,lots")
    assert parse_sizes("1MiB,64KiB,64k") == [65536, 1048576]
    for timeout in (0.0, -5.0, float("nan"), float("inf")):  # inf: a doctor that never ends
        with pytest.raises(DoctorInput, match="give a positive number of seconds"):
            checked(SimpleNamespace(sizes="1MiB", timeout=timeout, env=""))
    with pytest.raises(DoctorInput, match="--gloo"):
        probe_command(["horovodrun", "--gloo", "-np", "2"], SimpleNamespace(
            run_dir="runs", sizes="1MiB", env=""), 10)


def test_a_launcher_line_with_the_program_is_told_to_leave_it_out():
    """The launcher read the job's flags as the probe's: 'unrecognized arguments', blamed on
    a wrong launcher flag."""
    for command in (["mpirun", "-np", "2", "hvdtrain", "train", "--run-dir", "r"],
                    ["mpirun", "-np", "2", "/venv/bin/hvdtrain", "train"],
                    ["mpirun", "-np", "2", "python", "-m", "hvdtrain", "train"]):
        with pytest.raises(DoctorInput, match=r"the launcher line holds the program .*: give "
                                              r"the launcher line alone, hvdtrain doctor mpirun "
                                              r"-np 2, and"):
            refuse_program(command)
    refuse_program(["mpirun", "-np", "2", "-H", "a:1,b:1"])  # a launcher line alone is fine


def test_horovodrun_is_told_mpi_and_the_probe_is_appended():
    args = SimpleNamespace(run_dir="r", sizes="1MiB", env="FOO")
    line = probe_command(["horovodrun", "-np", "2"], args, 30)
    assert line[:4] == ["horovodrun", "--mpi", "-np", "2"]
    assert line[5:8] == ["-m", "hvdtrain.doctor.rank", "--facts-to-stdout"]
    assert line[-2:] == ["--env", "FOO"]


def test_placement_fills_slots_in_order():
    assert Asked({"a": 2, "b": 2}, 3).placement() == {"a": 2, "b": 1}
    assert Asked({"a": 2, "b": 2}, None).placement() == {"a": 2, "b": 2}
    by_node = asking.from_launcher(["mpirun", "-np", "3", "-H", "a:2,b:2,c:1", "--map-by",
                                    "node"], {})
    assert by_node.placement() == {"a": 1, "b": 1, "c": 1}
    assert Asked({"a": 4, "b": 1}, 4, by_node=True).placement() == {"a": 3, "b": 1}


def test_the_watched_variables():
    assert watched("HOROVOD_FUSION_THRESHOLD") and watched("OMPI_MCA_btl_tcp_if_include")
    assert not watched("OMPI_MCA_ess_base_vpid") and not watched("HOROVOD_RANK")
    assert not watched("HOME") and watched("MY_VAR", ("MY_VAR",))
    env = environment({"NCCL_DEBUG": "INFO", "HOME": "/root", "PATH": ""})
    assert env == {"NCCL_DEBUG": "INFO", "PATH_VENV": ""}


def test_path_venv_is_the_first_python_s_folder(tmp_path):
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    python = tmp_path / "venv" / "bin" / "python"
    python.write_text("")
    python.chmod(0o755)
    assert path_venv(f"{tmp_path}/none:{tmp_path}/venv/bin") == str(tmp_path / "venv")


def test_a_link_is_its_slower_direction_at_the_largest_size():
    forth = [{"bytes": 65536, "seconds": 0.001, "mbit": 500.0},
             {"bytes": 1048576, "seconds": 0.01, "mbit": 900.0}]
    back = [{"bytes": 65536, "seconds": 0.001, "mbit": 400.0},
            {"bytes": 1048576, "seconds": 0.1, "mbit": 95.0}]
    link = link_summary(forth, back, 0.0002)
    assert link["bandwidth_mbit"] == 95.0 and link["latency_ms"] == 0.2
    assert link["sizes"][1]["mbit_each_way"] == [900.0, 95.0]


def test_the_verdict_prints_one_line_per_problem_and_writes_doctor_json(tmp_path, capsys):
    ranks = cluster({"a": 2, "b": 2})
    ranks[3]["run_dir"] = {**ranks[3]["run_dir"], "sees_rank0": False}
    facts = {"ranks": ranks, "clock_offsets": {"a": 0.0, "b": 0.01},
             "links": [{"hosts": ["a", "b"], "bandwidth_mbit": 94.1, "latency_ms": 0.21,
                        "sizes": []}], "allreduce": None}
    code = conclude(facts, Asked({"a": 2, "b": 2}, 4, "-H"), "runs", str(tmp_path / "d.json"))
    out = capsys.readouterr().out.splitlines()
    assert code == 2 and out[-1] == "doctor: NOT fit (1 problem)"
    assert out[0].startswith("doctor: run_dir: b see(s) a different runs than a")
    assert "doctor: link a - b: 94.1 Mbit/s, latency 0.210 ms" in out
    document = json.loads((tmp_path / "d.json").read_text())
    assert document["version"] == 1 and document["fit"] is False and document["ranks"] == 4
    assert document["asked"] == {"hosts": {"a": 2, "b": 2}}
    assert document["hosts"]["b"]["ranks"] == [2, 3]
    assert document["hosts"]["b"]["clock_offset_s"] == 0.01
    assert document["problems"][0]["check"] == "run_dir"
    ranks[3]["run_dir"]["sees_rank0"] = True
    assert conclude(facts, None, "runs", str(tmp_path / "d.json")) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "doctor: fit"
    # a report that cannot be written (a run folder that is a file) crashed with a traceback
    (tmp_path / "file").write_text("")
    assert conclude(facts, None, "runs", str(tmp_path / "file" / "d.json")) == 2
    out = capsys.readouterr().out.splitlines()
    assert out[-2].startswith("doctor: report: --json ") and out[-1] == "doctor: NOT fit (1 problem)"


def test_doctor_help_imports_no_torch_and_bad_input_exits_2():
    code = ("import sys\nfrom hvdtrain.cli import main\n"
            "try:\n    main(['doctor', '--help'])\nexcept SystemExit as e:\n    print(e.code)\n"
            "print(main(['doctor', '--expect', 'a:0']), main(['doctor', 'ssh', 'a']))\n"
            "print('torch' in sys.modules)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.stdout.split()[-4:] == ["0", "2", "2", "False"], (proc.stdout[-300:], proc.stderr)
    assert "hvdtrain doctor: error: --expect 'a:0'" in proc.stderr
    assert "unknown launcher 'ssh'" in proc.stderr


def _fake_launcher(tmp_path, lines: list[str]):
    """An "mpirun" that prints ``lines`` as the probe's ranks would, then hangs."""
    script = tmp_path / "mpirun"
    body = "".join(f"echo {shlex.quote(line)}\n" for line in lines)
    script.write_text(f"#!/bin/sh\n{body}exec sleep 60\n")
    script.chmod(0o755)
    return str(script)


@pytest.fixture
def quick_ranks(monkeypatch):
    """Fake launchers answer at once: the ranks' least time (10 s, for MPI's start) is 1 s."""
    from hvdtrain.doctor import launcher
    monkeypatch.setattr(launcher, "RANKS_S", 1.0)


def _doctor_args(tmp_path, timeout=6.0):  # the ranks get 1 s of it (END_S: 5 s to report)
    return SimpleNamespace(expect=None, timeout=timeout, run_dir="runs", sizes="1MiB", env="",
                           env_names=(), json=str(tmp_path / "doctor.json"))


def test_ranks_that_hang_are_ended_at_the_timeout_and_the_step_is_named(tmp_path, capsys,
                                                                        quick_ranks):
    partial = json.dumps({"ranks": cluster({"a": 1, "b": 1}), "partial": True})
    launcher = _fake_launcher(tmp_path, [
        f"[1,0]<stdout>:{STARTED} 0 a", f"{STARTED} 1 b", f"{FACTS} {partial}",
        f"{STEP} the link test between a and b"])
    started = time.monotonic()
    code = run_doctor([launcher, "-np", "2", "-H", "a:1,b:1"], _doctor_args(tmp_path))
    assert code == 2 and time.monotonic() - started < 6
    out = capsys.readouterr().out
    assert ("doctor: network: the ranks hung in the link test between a and b and were ended "
            "after 1 s") in out  # what the ranks had, not --timeout
    report = json.loads((tmp_path / "doctor.json").read_text())
    assert report["fit"] is False and sorted(report["hosts"]) == ["a", "b"]


def test_ranks_that_never_start_are_counted(tmp_path, capsys, quick_ranks):
    launcher = _fake_launcher(tmp_path, [f"{STARTED} 0 a"])
    code = run_doctor([launcher, "-np", "3", "-H", "a:2,b:1"], _doctor_args(tmp_path))
    out = capsys.readouterr().out
    assert code == 2 and "doctor: hosts: no rank on b answered within 1 s (1 rank(s) on a did)" \
        in out, out
    assert out.splitlines()[-2:] == [f"doctor: measurements and problems written to "
                                     f"{tmp_path / 'doctor.json'}", "doctor: NOT fit (1 problem)"]
    assert json.loads((tmp_path / "doctor.json").read_text())["problems"][0]["check"] == "hosts"


def test_fill_in_gives_the_lead_s_devices_to_the_other_ranks_of_its_host():
    everyone = [{"host": "a", "horovod": {"mpi": True}, "gpus": 2, "cuda": "12.1", "nccl": None},
                {"host": "a"}, {"host": "b", "horovod": None, "gpus": 0, "cuda": None,
                                "nccl": None}, {"host": "b", "gpus": 1, "horovod": None,
                                                "cuda": "12.1", "nccl": "2.18"}]
    fill_in(everyone)
    assert everyone[1]["gpus"] == 2 and everyone[1]["horovod"] == {"mpi": True}
    assert everyone[3]["gpus"] == 1  # its own devices (CUDA_VISIBLE_DEVICES) stay


def test_a_rank_without_hvdtrain_is_a_versions_problem(tmp_path, capsys, quick_ranks):
    script = tmp_path / "mpirun"
    script.write_text("#!/bin/sh\necho \"/usr/bin/python3: No module named hvdtrain\" >&2\n"
                      "exit 1\n")
    script.chmod(0o755)
    assert run_doctor([str(script), "-np", "2"], _doctor_args(tmp_path)) == 2
    captured = capsys.readouterr()
    assert "doctor: versions: a rank cannot import what the doctor needs (/usr/bin/python3: No " \
           "module named hvdtrain) -- fix: install hvdtrain" in captured.out
    assert "No module named hvdtrain" in captured.err  # the launcher's own output, passed on


def test_a_timeout_that_leaves_the_ranks_no_time_is_refused(tmp_path):
    """--timeout 5 left the ranks 0 s (5 s are kept to end the launcher and report): NOT fit
    in half a second, "0 of 2 rank(s) started within 5 s"."""
    with pytest.raises(DoctorInput, match=r"^--timeout 5: with a launcher line the doctor keeps "
                                          r"5 s to end the launcher and report, which leaves "
                                          r"the ranks 0 s, .*give --timeout 15 or more"):
        run_doctor(["mpirun", "-np", "2"], _doctor_args(tmp_path, timeout=5.0))


def test_under_which_launcher():
    assert not under_launcher({}) and under_launcher({"OMPI_COMM_WORLD_RANK": "0"})
    assert under_launcher({"SLURM_PROCID": "3", "SLURM_STEP_ID": "0"})
    assert not under_launcher({"SLURM_PROCID": "0"})  # sbatch's script: srun starts the tasks
    # mpirun inside that script: its ranks inherit the shell's SLURM_PROCID, and each ran its
    # own srun over the allocation instead of probing
    assert under_launcher({"SLURM_PROCID": "0", "OMPI_COMM_WORLD_RANK": "1"})
    assert under_launcher({"PMIX_RANK": "1"})
    with pytest.raises(DoctorInput, match="horovodrun --gloo does not start"):
        under_launcher({"HOROVOD_RANK": "0", "HOROVOD_CONTROLLER": "gloo"})


def test_the_address_each_host_is_reached_by(monkeypatch):
    from hvdtrain.doctor import rank
    from hvdtrain.doctor.rank import _target

    names = {"10.0.0.2": "10.0.0.2", "localhost": "127.0.0.1"}  # no resolver asked
    monkeypatch.setattr(rank, "resolve", lambda hosts: {h: names[h] for h in hosts if h in names})
    ours = {"127.0.0.1", "172.17.0.1", "10.0.0.1"}
    theirs = {"lo": "127.0.0.1", "docker0": "172.17.0.1", "eth0": "10.0.0.2"}
    assert _target("10.0.0.2", theirs, ours) == "10.0.0.2"
    assert _target("localhost", theirs, ours) == "127.0.0.1"  # the loopback fault
    assert _target("no-such-host.invalid", theirs, ours) == "10.0.0.2"  # not docker0's
    assert _target("no-such-host.invalid", {"docker0": "172.17.0.1"}, ours) is None


def test_the_probe_s_lines_are_read_through_open_mpi_s_output_tags():
    import io

    from hvdtrain.doctor.launcher import Output

    facts = json.dumps({"ranks": [{"env": {"OMPI_MCA_btl_tcp_if_include": "lo"}}]})
    cut = facts.index("CA_btl")  # Open MPI read the line in two pieces and tagged both
    stream = io.StringIO(f"[1,0]<stdout>:{STARTED} 0 a 10.0.0.1,127.0.0.1[1,0]<stdout>:\n"
                         f"[1,0]<stdout>:{FACTS} {facts[:cut]}[1,0]<stdout>:{facts[cut:]}\n"
                         "a line of the launcher's own\n")
    echoed = []
    output = Output(stream, echoed.append)
    output.join(5)
    assert output.facts == json.loads(facts)
    assert output.started == {0: {"host": "a", "addresses": {0: "10.0.0.1", 1: "127.0.0.1"}}}
    assert echoed == ["a line of the launcher's own\n"]


def test_the_ranks_start_up_counts_against_the_launching_doctor_s_deadline():
    from hvdtrain.doctor.rank import MARGIN_S, time_left

    started = time.monotonic() - 10  # this rank started 10 s ago
    args = SimpleNamespace(timeout=50.0, deadline=None)
    assert 40 - MARGIN_S - 1 < time_left(args, started) <= 40 - MARGIN_S
    args.deadline = time.time() + 20  # the doctor's clock: 20 s left
    assert 20 - MARGIN_S - 1 < time_left(args, started) <= 20 - MARGIN_S
    line = probe_command(["mpirun", "-np", "2"], SimpleNamespace(run_dir="r", sizes="1MiB",
                                                                  env=""), 30)
    assert abs(float(line[line.index("--deadline") + 1]) - (time.time() + 30)) < 5


def test_a_rank_s_deadline_reports_and_exits_2_and_is_stopped_when_done(tmp_path):
    code = ("import sys, time\nfrom hvdtrain.doctor.deadline import Guards\n"
            f"guards = Guards(float(sys.argv[1]), 0, {str(tmp_path / 'd.json')!r})\n"
            "time.sleep(float(sys.argv[2]))\nguards.stop()\ntime.sleep(1.5)\nprint('done')\n")
    late = subprocess.run([sys.executable, "-c", code, "2", "30"], capture_output=True,
                          text=True, timeout=60)
    assert late.returncode == 2 and late.stdout.splitlines()[-1] == "doctor: NOT fit (1 problem)"
    # the rank's thread, before the deadline that the process keeps (a rank that holds the GIL)
    assert "doctor: hosts: the ranks did not finish within 1 s" in late.stdout
    assert late.stdout.count("doctor: NOT fit (") == 1  # the process found the rank gone
    assert f"doctor: measurements and problems written to {tmp_path / 'd.json'}" in late.stdout
    assert json.loads((tmp_path / "d.json").read_text())["fit"] is False
    done = subprocess.run([sys.executable, "-c", code, "1", "0"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and done.stdout == "done\n", done.stdout + done.stderr


def test_a_launcher_that_fails_before_the_ranks_is_quoted_by_its_message_not_its_advice():
    from hvdtrain.doctor.launcher import _no_facts

    box = ["-" * 74, "There are not enough slots available in the system to satisfy the 4",
           "slots that were requested by the application:", "", "  python", "",
           "Either request fewer slots for your application, or make more slots",
           "launch.", "-" * 74]
    output = SimpleNamespace(other=box, started={})
    [problem] = _no_facts(1, output, Asked(), 30)
    assert "exited 1 before the ranks reported (0 rank(s) started): There are not enough " \
           "slots available" in problem.message and "launch." not in problem.message
    output.other = ["ssh: Could not resolve hostname b: Name or service not known",
                    "ORTE was unable to reliably start one or more daemons.", *box]
    [problem] = _no_facts(255, output, Asked(), 30)
    assert "ssh: Could not resolve hostname b" in problem.message
    # a hostfile Open MPI refuses: its own sentence, not the ORTE internal error that follows
    output.other = ["-" * 74, "A hostfile was provided that contains multiple definitions",
                    "of the slot count for at least one node:", "", "  hostfile:  h", "-" * 74,
                    "-" * 74, "An internal error has occurred in ORTE:", "",
                    "[[5303,0],0] FORCE-TERMINATE AT (null):1 - error ras_base_allocate.c",
                    "-" * 74]
    [problem] = _no_facts(1, output, Asked(), 30)
    assert problem.message.endswith("started): A hostfile was provided that contains multiple "
                                    "definitions of the slot count for at least one node:")


def test_on_its_own_in_an_allocation_the_doctor_runs_srun_with_pmix():
    """Its srun had no --mpi=pmix, which every srun of the job's own has: the probes' MPI could
    not start under a Slurm without a default MPI type."""
    from hvdtrain.doctor.doctor_cli import own_launcher

    assert own_launcher({"SLURM_JOB_ID": "7"}) == ["srun", "--mpi=pmix"]
    assert own_launcher({"SLURM_JOB_ID": "7", "SLURM_MPI_TYPE": "pmi2"}) == ["srun"]
    assert own_launcher({}) == ["mpirun", "-np", "1"]


def test_a_hostfile_is_read_at_once_refused_beside_a_launcher_line_and_launched_on_its_own(
        tmp_path, capsys):
    """An unreadable --hostfile under mpirun waited out the whole --timeout; beside a launcher
    line, or on its own, it was ignored (fit, whatever it asked for)."""
    from hvdtrain.cli import main
    from hvdtrain.doctor.doctor_cli import own_launcher

    assert main(["doctor", "--hostfile", str(tmp_path / "none")]) == 2
    assert "hostfile " + str(tmp_path / "none") + ": cannot read it" in capsys.readouterr().err
    hostfile = tmp_path / "hosts"
    hostfile.write_text("a slots=2\nb slots=3\n")
    assert main(["doctor", "--hostfile", str(hostfile), "mpirun", "-np", "5"]) == 2
    assert (f"--hostfile {hostfile}: with a launcher line, give the hostfile to the launcher "
            f"(mpirun --hostfile {hostfile} ...)") in capsys.readouterr().err
    assert own_launcher({}, str(hostfile)) == ["mpirun", "--hostfile", str(hostfile), "-np", "5"]
