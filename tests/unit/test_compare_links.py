"""compare --links doctor.json (compare/measured_links.py): the doctor's measured links as the
simulator's ring and server links, the file's faults each with a message, and the report saying
where its figures came from. The doctor.json here is written by hand in the doctor's schema."""

from __future__ import annotations

import json

import pytest

from hvdtrain.cli import build_parser
from hvdtrain.compare import command
from hvdtrain.compare.measured_links import read_links, server_link
from hvdtrain.compare.plan import Mode
from hvdtrain.compare.sim.link import Link
from hvdtrain.compare.sim.simulation import Simulation
from hvdtrain.compare.sim.timing import Timing
from hvdtrain.config import ConfigError

DIGITS = ["--dataset", "digits", "--model", "mlp", "--hidden", "32", "--threads", "1",
          "--epochs", "1", "--max-steps-per-epoch", "6"]


def host(ranks: list[int]) -> dict:
    return {"ranks": ranks, "python": "3.11.2", "executable": "/venv/bin/python",
            "hvdtrain": "0.1", "torch": "2.13.0", "mpi4py": "4.0.0",
            "horovod": {"version": "0.28.1", "mpi": True, "gloo": True, "nccl": False},
            "gpus": 0, "cuda": None, "nccl": None,
            "interfaces": {"mpi": "eth0", "gloo": "eth0"}, "clock_offset_s": 0.001}


def pair(a: str, b: str, mbit: float | None, latency_ms: float) -> dict:
    return {"hosts": [a, b], "bandwidth_mbit": mbit, "latency_ms": latency_ms,
            "sizes": [{"bytes": 65536, "seconds": 0.01, "mbit": mbit}]}


def doctor(tmp_path, name="doctor.json", **changes) -> str:
    """Three hosts, the last rank (the server's) on c; a-b is throttled to 50 Mbit/s."""
    record = {"version": 1, "fit": True, "ranks": 5, "asked": {"hosts": {"a": 2, "b": 2, "c": 1}},
              "hosts": {"a": host([0, 1]), "b": host([2, 3]), "c": host([4])},
              "links": [pair("a", "b", 50.0, 0.2), pair("a", "c", 900.0, 0.1),
                        pair("b", "c", 800.0, 0.3)],
              "allreduce": {"ranks": 5, "sizes": []}, "problems": []}
    record.update(changes)
    path = tmp_path / name
    path.write_text(json.dumps(record))
    return str(path)


def options(tmp_path, *flags):
    return command.validate(build_parser().parse_args(
        ["compare", "--out", str(tmp_path / "out"), *flags]))


def test_the_ring_takes_the_slowest_pair_and_the_server_the_slowest_of_its_hosts(tmp_path):
    links = read_links(doctor(tmp_path))
    assert links.ring_pair.name == "a-b" and links.ring_latency_ms == 0.3  # the highest latency
    assert links.server_host == "c"   # the last rank's host: the job's parameter server
    assert links.server_pair.name == "b-c" and links.server_latency_ms == 0.3
    # The doctor measures payload; the model's rate counts frames: it carries the bytes measured.
    assert links.ring.bytes_per_second == pytest.approx(50e6 / 8)
    assert links.server.bytes_per_second == pytest.approx(800e6 / 8)
    assert links.ring.latency_seconds == pytest.approx(0.0003)
    assert links.fit and links.warning() is None


@pytest.mark.parametrize("write, message", [
    (lambda p: None, "no such file; run `hvdtrain doctor`"),
    (lambda p: p.write_text("{\"version\": 1, \"fit\""), "not readable as JSON"),
    (lambda p: p.write_text("[1, 2]"), "not a doctor.json"),
    (lambda p: p.write_text(json.dumps({"version": 2, "links": []})),
     "version 2, but this hvdtrain reads version 1"),
])
def test_a_missing_corrupt_or_foreign_file_says_what_to_do(tmp_path, write, message):
    path = tmp_path / "doctor.json"
    write(path)
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("(", r"\(")):
        read_links(str(path))


def test_a_file_without_usable_links_says_why(tmp_path):
    one_host = doctor(tmp_path, "one.json", hosts={"a": host([0, 1])}, links=[])
    with pytest.raises(ConfigError, match=r"no link between hosts \(its ranks ran on 1 host"):
        read_links(one_host)
    unmeasured = doctor(tmp_path, "gap.json", links=[pair("a", "b", 50.0, 0.2),
                                                     pair("a", "c", None, 0.1)])
    with pytest.raises(ConfigError, match="the doctor could not measure the link a-c"):
        read_links(unmeasured)
    malformed = doctor(tmp_path, "bad.json", links=[{"hosts": ["a"], "bandwidth_mbit": 5}])
    with pytest.raises(ConfigError, match="links\\[0\\] is not a measured pair"):
        read_links(malformed)
    zero = doctor(tmp_path, "zero.json", links=[pair("a", "b", 0.0, 0.2)])
    with pytest.raises(ConfigError, match="the link a-b has no usable measurement"):
        read_links(zero)


def test_an_unfit_clusters_links_are_used_with_a_warning(tmp_path, capsys):
    path = doctor(tmp_path, fit=False, problems=[{"check": "network", "message": "slow a-b",
                                                  "fix": "check the cable"}])
    cfg = options(tmp_path, "--simulate", "--links", path)
    assert "the doctor judged this cluster NOT fit (1 problem(s))" in capsys.readouterr().out
    assert cfg.sim_link() == read_links(path).ring
    assert "NOT fit" in cfg.measured.describe()


def test_links_is_one_source_and_prices_simulated_runs_only(tmp_path):
    path = doctor(tmp_path)
    for flags, message in [(("--simulate", "--links", path, "--sim-link-mbit", "100"),
                            "drop --sim-link-mbit and --sim-latency-ms, or drop --links"),
                           (("--simulate", "--links", path, "--sim-link-mbit", "100",
                             "--sim-latency-ms", "1"), "drop --sim-link-mbit"),
                           (("--links", path), "add --simulate"),
                           (("--simulate", "--links", str(tmp_path / "none.json")),
                            "no such file")]:
        with pytest.raises(ConfigError, match=message):
            options(tmp_path, *flags)


def test_the_simulated_plan_takes_both_links_and_its_report_says_whence(tmp_path):
    path = doctor(tmp_path)
    cfg = options(tmp_path, "--simulate", "--links", path, "--sim-step-ms", "10",
                  "--sim-apply-ms", "1")
    timing = command._simulation_timing(cfg, [])
    measured = read_links(path)
    assert timing.link == measured.ring and timing.server_link == measured.server
    described = command._describe(cfg)
    assert f"links measured by hvdtrain doctor ({path}; hosts a, b, c)" in described
    assert "the slowest pair, a-b, 50 Mbit/s" in described and "b-c, 800 Mbit/s" in described


def test_simulated_async_pushes_cross_the_server_link_and_sync_the_ring():
    ring, server = Link(1000), Link(10)
    timing = Timing(0.01, link=ring, server_link=server)
    sim = Simulation(Mode("async"), 1, "", 0, DIGITS, 0.99, timing)
    sim.result = sim.run()
    first = min(p.time for p in sim.pushes)
    assert first == pytest.approx(0.01 + sim.message_bytes / server.bytes_per_second)
    assert timing.average_seconds(1e6, 2) == ring.ring_seconds(1e6, 2)
    with pytest.raises(ConfigError, match="link bandwidth"):
        Timing(0.1, server_link=Link(0)).check()


def test_from_run_replays_on_the_measured_links_and_says_so(tmp_path):
    from hvdtrain.compare.from_run import read_run
    from hvdtrain.compare.from_run_replay import from_run_link, train_args_from_config
    from test_from_run import _write_log

    run = read_run(_write_log(tmp_path / "run", epochs=4))
    path = doctor(tmp_path)
    cfg = options(tmp_path, "--from-run", str(run.folder), "--links", path)
    link, words = from_run_link(run, Mode("sync", scheme="sync"), train_args_from_config(
        run.config), 0.0, cfg)
    assert link == read_links(path).ring and server_link(cfg) == read_links(path).server
    assert words.startswith("link: the links measured by hvdtrain doctor")
    assert "the run's own exchange of" in words


def test_compare_simulate_with_links_writes_where_the_figures_came_from(tmp_path, capsys):
    path = doctor(tmp_path)
    out = tmp_path / "out"
    args = build_parser().parse_args(
        ["compare", "--simulate", "--links", path, "--out", str(out), "--modes", "sync,async",
         "--stragglers", "none", "--seeds", "1", "--epochs", "1", "--model", "mlp",
         "--train-args", "--hidden 32 --max-steps-per-epoch 4", "--eval-every-steps", "4",
         "--target", "0.1", "--sim-step-ms", "10", "--sim-apply-ms", "1"])
    assert command.main(args) == 0
    printed = capsys.readouterr().out
    assert "links measured by hvdtrain doctor" in printed and "a-b, 50 Mbit/s" in printed
    report = (out / "report.md").read_text()
    assert f"links measured by hvdtrain doctor ({path}; hosts a, b, c)" in report


def test_the_doctors_own_file_is_read_as_written(tmp_path):
    """A contract with hvdtrain/doctor: what its verdict writes, compare reads."""
    from hvdtrain.doctor.problem import Problem
    from hvdtrain.doctor.verdict import report, unfinished_report, write_json

    def rank(number: int, name: str) -> dict:
        return {"rank": number, "host": name, "executable": "/venv/bin/python", "gpus": 0,
                "cuda": None, "nccl": None, "versions": {"python": "3.11.2", "hvdtrain": "0.1",
                                                        "torch": "2.13.0", "mpi4py": "4.0.0"}}
    links = [{"hosts": ["a", "b"], "bandwidth_mbit": 93.2, "latency_ms": 0.009,
              "sizes": [{"bytes": 65536, "seconds": 0.006, "mbit": 87.0}]}]
    facts = {"ranks": [rank(0, "a"), rank(1, "b")], "links": links, "allreduce": None}
    path = tmp_path / "doctor.json"
    write_json(str(path), report(facts, [], None))
    links = read_links(str(path))
    assert links.ring_pair.name == "a-b" and links.ring_pair.payload_mbit == 93.2
    assert links.server_host == "b" and links.fit
    hung = Problem("hosts", "ranks 1 never started on b", "check ssh to b")
    write_json(str(path), unfinished_report(None, [hung], 2))
    with pytest.raises(ConfigError, match=r"never reported.*\(ranks 1 never started on b\)"):
        read_links(str(path))
