"""The simulator's link model (compare/sim/link.py): a ring average's and a push's cost from
bytes, bandwidth and latency, the server's link shared by the transfers in flight, the fit of a
link from a run's waits, and the --sim-link-mbit and --sim-latency-ms flags."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from hvdtrain.cli import build_parser
from hvdtrain.compare import command
from hvdtrain.compare.plan import Mode
from hvdtrain.compare.sim.link import (DUPLEX_OVERLAP, PAYLOAD_SHARE, Link, SharedLink, fit_link,
                                      gradient_bytes, run_link, wire_bytes)
from hvdtrain.compare.sim.simulation import Simulation
from hvdtrain.compare.sim.timing import Timing
from hvdtrain.config import ConfigError
from hvdtrain.ps.dispatch import NO_SLOT

DIGITS = ["--dataset", "digits", "--model", "mlp", "--hidden", "32", "--threads", "1",
          "--epochs", "1", "--max-steps-per-epoch", "6"]
MB = 12.5e6 * PAYLOAD_SHARE  # payload bytes that a 100 Mbit/s link carries in one second


def test_a_ring_average_moves_2_n_minus_1_over_n_of_the_bytes_and_pays_a_latency_per_hop():
    link = Link(100, latency_seconds=0.001)
    assert link.ring_seconds(MB, 2) == pytest.approx(1.0 + 2 * 0.001)
    assert link.ring_seconds(MB, 4) == pytest.approx(1.5 + 6 * 0.001)
    assert link.ring_seconds(MB, 1) == 0.0  # nobody to average with
    assert Link(1000).ring_seconds(MB, 4) == pytest.approx(0.15)  # ten times the rate


def test_the_server_link_carries_one_way_at_a_time_and_is_never_idle_while_one_waits():
    way_in = SharedLink(Link(100, latency_seconds=0.01))
    assert way_in.send(0.0, MB) == pytest.approx(1.01)       # alone: its bytes, + latency
    # sent the same way while the first is in flight: it follows it, so the two take the link
    # for their bytes alone (2 s), not the 2.5 s of an older model (half the rate, the first
    # unslowed)
    assert way_in.send(0.5, MB) == pytest.approx(2.01)
    assert way_in.send(3.0, MB) == pytest.approx(4.01)       # both landed: alone again
    many = SharedLink(Link(100))
    assert [many.send(0.0, MB / 4) for _ in range(4)] == pytest.approx([0.25, 0.5, 0.75, 1.0])


def test_a_reply_overlaps_the_push_in_flight_the_other_way_for_a_share_of_it():
    link = SharedLink(Link(100))
    assert link.send(0.0, MB, toward_server=True) == pytest.approx(1.0)
    # the reply starts DUPLEX_OVERLAP of a transfer before the push ends, not after it
    assert link.send(0.5, MB, toward_server=False) == pytest.approx(2.0 - DUPLEX_OVERLAP)
    # a push behind that reply overlaps it as well, by the shorter transfer's share
    assert link.send(0.5, MB / 2, toward_server=True) == pytest.approx(
        2.0 - DUPLEX_OVERLAP + (1 - DUPLEX_OVERLAP) / 2)
    # never before it was sent: a reply sent near the push's end starts when it is sent
    late = SharedLink(Link(100))
    late.send(0.0, MB, toward_server=True)
    assert late.send(0.9, MB, toward_server=False) == pytest.approx(1.9)
    # the lab's bare loop, two workers through one server: a cycle of both takes 3.25
    # transfers (measured 3.2 to 3.3), between 4 in series and 2 in full duplex
    assert 4 - 2 * DUPLEX_OVERLAP == pytest.approx(3.25)


def test_a_link_wins_over_the_fixed_allreduce_figure():
    assert Timing(0.1, allreduce_seconds=0.5).average_seconds(MB, 2) == 0.5
    timed = Timing(0.1, allreduce_seconds=0.5, link=Link(100))
    assert timed.average_seconds(MB, 2) == pytest.approx(1.0)
    with pytest.raises(ConfigError, match="link bandwidth"):
        Timing(0.1, link=Link(0)).check()


def test_the_wire_dtype_sets_the_bytes_of_an_element():
    assert wire_bytes(SimpleNamespace()) == 4  # a config from before --wire-dtype: float32
    assert wire_bytes(SimpleNamespace(ps=SimpleNamespace(wire_dtype="bf16"))) == 2
    assert wire_bytes(SimpleNamespace(sync=SimpleNamespace(wire_dtype="fp32"))) == 4
    assert gradient_bytes(SimpleNamespace(sync=SimpleNamespace(compression="fp16"))) == 2


def test_fit_link_gives_back_the_bandwidth_of_a_measured_exchange():
    link = Link(80, latency_seconds=0.002)
    ring = fit_link(link.ring_seconds(MB, 3), MB, 3, ring=True, latency_seconds=0.002)
    assert ring.mbit == pytest.approx(80)
    push_pull = 2 * link.transfer_seconds(MB)
    assert fit_link(push_pull, MB, 2, ring=False, latency_seconds=0.002).mbit == pytest.approx(80)
    assert fit_link(0.001, MB, 2, ring=True, latency_seconds=0.002) is None  # latency only


def run(mode: Mode, workers: int, timing: Timing) -> Simulation:
    sim = Simulation(mode, workers, "", 0, DIGITS, 0.99, timing)
    sim.result = sim.run()
    return sim


def test_simulated_sync_and_diloco_rounds_pay_the_ring_of_the_models_bytes():
    link = Link(10, latency_seconds=0.001)
    sync = run(Mode("sync", scheme="sync"), 3, Timing(0.01, link=link))
    ring = link.ring_seconds(sync.message_bytes, 3)
    assert sync.message_bytes == 4 * sync.setup.model.flat.numel()
    assert sync.round_seconds == pytest.approx([0.01 + ring] * 6)
    diloco = run(Mode("diloco3", scheme="sync", local_steps=3, outer_lr=0.7,
                      outer_momentum=0.9), 3, Timing(0.01, link=link))
    assert diloco.round_seconds == pytest.approx([3 * 0.01 + ring] * 2)  # one average a round


def test_simulated_async_pushes_and_pulls_share_the_server_link():
    link = Link(10)
    sim = run(Mode("async"), 2, Timing(0.01, link=link))
    one = sim.message_bytes / link.bytes_per_second
    times = sorted(p.time for p in sim.pushes)
    # Both workers push at 0.01 and share the link: the second follows the first.
    assert times[:2] == pytest.approx([0.01 + one, 0.01 + 2 * one])
    # The first worker's reply is sent while the second push crosses the other way: it
    # overlaps it for DUPLEX_OVERLAP of a transfer and lands then; its next push leaves a step
    # later, and crosses beside the second worker's reply, which follows the first's.
    first_reply = 0.01 + (3 - DUPLEX_OVERLAP) * one
    second_reply = first_reply + one
    assert times[2] == pytest.approx(max(first_reply + 0.01, second_reply - DUPLEX_OVERLAP * one)
                                     + one)
    # a cycle of both workers takes about 4 - 2 x DUPLEX_OVERLAP transfers, not 4 in series
    assert len(times) == 12 and 6 * 2 * one < sim.result.wall_seconds < 6 * 4 * one


def options(tmp_path, *flags):
    return command.validate(build_parser().parse_args(
        ["compare", "--out", str(tmp_path / "out"), *flags]))


def test_sim_link_flags_are_checked_and_set_the_simulated_link(tmp_path):
    cfg = options(tmp_path, "--simulate", "--sim-link-mbit", "100", "--sim-latency-ms", "2",
                  "--sim-step-ms", "10", "--sim-apply-ms", "1")
    timing = command._simulation_timing(cfg, [])
    assert timing.link == Link(100, 0.002)
    assert "100 Mbit/s" in timing.describe_network()
    for flags, message in [(("--simulate", "--sim-link-mbit", "0"), "--sim-link-mbit: invalid"),
                           (("--simulate", "--sim-link-mbit", "nan"), "--sim-link-mbit: inv"),
                           (("--sim-link-mbit", "100"), "add --simulate"),
                           (("--simulate", "--sim-latency-ms", "5"), "give --sim-link-mbit"),
                           (("--simulate", "--sim-link-mbit", "9", "--sim-latency-ms", "-1"),
                            "--sim-latency-ms: invalid")]:
        with pytest.raises(ConfigError, match=message):
            options(tmp_path, *flags)


def test_run_link_says_whether_the_link_was_fitted_or_given():
    link, words = run_link(0.5, MB / 2, 2, ring=True, given=None, latency_seconds=0.0)
    assert link.mbit == pytest.approx(100) and "fitted from the run's measured" in words
    assert "latency of 0 ms given" in words
    given = Link(10, 0.001)
    link, words = run_link(0.5, MB / 2, 2, ring=True, given=given, latency_seconds=0.0)
    assert link is given and "given (--sim-link-mbit" in words and "500.00 ms (measured)" in words
    link, words = run_link(0.001, MB, 2, ring=False, given=None, latency_seconds=0.001)
    assert link is None and "not fitted" in words


def test_from_run_fits_the_link_from_a_sync_runs_waits(tmp_path):
    from hvdtrain.compare.from_run import read_run
    from hvdtrain.compare.from_run_replay import from_run_link, train_args_from_config
    from test_from_run import _write_log

    run = read_run(_write_log(tmp_path / "run", epochs=4))
    args = train_args_from_config(run.config)
    cfg = options(tmp_path, "--from-run", str(run.folder))
    link, words = from_run_link(run, Mode("sync", scheme="sync"), args, 0.0, cfg)
    # the synthetic run's slowest worker waits 1 ms for each allreduce of the model's float32s
    from hvdtrain.compare.sim.flat_model import _Setup
    setup = _Setup.build(args, 0, "", Mode("sync", scheme="sync"))
    nbytes = 4 * setup.model.flat.numel()
    setup.workload.close()
    assert link.ring_seconds(nbytes, 2) == pytest.approx(0.001)
    assert "fitted" in words
    cfg = options(tmp_path, "--from-run", str(run.folder), "--sim-link-mbit", "50")
    assert from_run_link(run, Mode("sync", scheme="sync"), args, 0.0, cfg)[0] == Link(50)


def test_the_labs_token_bucket_holds_a_timer_ticks_bytes_at_fast_rates():
    from hvdtrain.compare.link_lab import tbf_command

    command = tbf_command("ns", 1000)
    assert command[-7:] == ["tbf", "rate", "1000mbit", "burst", "500000", "latency", "50ms"]
    assert tbf_command("ns", 1)[command.index("burst") + 1] == "4096"  # 32 kbit at least


def test_plan_links_is_refused_with_what_to_do_where_the_lab_cannot_run(tmp_path, monkeypatch):
    from hvdtrain.compare import link_lab

    monkeypatch.setattr(link_lab, "unavailable_reason", lambda: "cannot create a namespace")
    cfg = options(tmp_path, "--plan", "links")
    with pytest.raises(ConfigError, match="needs network namespaces .* cannot create a "
                                          "namespace.*--simulate --sim-link-mbit"):
        link_lab.check_lab(cfg)
    with pytest.raises(ConfigError, match="use --workers 2"):
        link_lab.check_lab(options(tmp_path, "--plan", "links", "--workers", "3"))
    with pytest.raises(ConfigError, match="--link-mbit: invalid"):
        link_lab.check_lab(options(tmp_path, "--plan", "links", "--link-mbit", "0"))


def test_lab_runs_start_on_host_b_with_one_worker_a_host_and_the_server_beside_worker_1(tmp_path):
    import shlex

    from hvdtrain.compare import plan as planning
    from hvdtrain.compare.link_lab import SlowLinks, lab_runs

    lab = SlowLinks(tag="unit")  # nothing is created before ``with``
    modes = planning.modes(["sync", "async"], [0], [0], [4])
    runs = lab_runs(lab, planning.plan(modes, [0], ["none"], 2, ["--stop-at", "test_acc>=0.9"]),
                    tmp_path)
    a, b = lab.hosts.addresses
    assert (tmp_path / "hostfile-sync").read_text() == f"{a} slots=1\n{b} slots=1\n"
    # rank 0 (worker 0) on B; worker 1 and the server, the last rank, on A
    assert (tmp_path / "hostfile-async").read_text() == f"{b} slots=1\n{a} slots=2\n"
    command = runs[1].command("python", "RUN")
    assert command[:2] == [str(lab.hosts.on(1, [])[0]), b]  # netns_ssh, host B
    words = shlex.split(command[2])  # one word, through netns_ssh's shell
    assert words[:3] == ["mpirun", "-np", "3"] and "test_acc>=0.9" in words
    # the hosts share this machine's cores: a waiting rank yields, as plan.py's rule for a run
    # that takes every core (which a hostfile bypasses) says
    assert words[words.index("mpi_yield_when_idle") + 1] == "1"
    assert words[words.index("--hostfile") + 1] == str(tmp_path / "hostfile-async")
    # the server alone on A, both workers on B: every push and reply crosses the link
    alone = lab_runs(lab, planning.plan(modes[1:], [0], ["none"], 2, []), tmp_path,
                     server_beside=False)
    words = shlex.split(alone[0].command("python", "RUN")[2])
    assert words[words.index("--hostfile") + 1] == str(tmp_path / "hostfile-async-alone")
    assert (tmp_path / "hostfile-async-alone").read_text() == f"{b} slots=2\n{a} slots=1\n"


def test_links_md_sets_each_mode_against_sync_with_the_ratios_interval(tmp_path):
    import csv

    from hvdtrain.compare import link_lab
    from hvdtrain.compare.stats import ratio_ci

    rows = [("sync", 0, 70.0), ("sync", 1, 80.0), ("diloco8", 0, 13.0), ("diloco8", 1, 15.0),
            ("adiloco8", 0, 14.0), ("adiloco8", 1, "")]  # one async run never got there
    with open(tmp_path / "summary.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["straggler", "mode", "seed", "time_to_target"])
        writer.writerows([("none", *row) for row in rows])
    section = link_lab._rate_section(100, tmp_path)
    ratio = ratio_ci([13.0, 15.0], [70.0, 80.0])
    assert ratio[0] == pytest.approx(14 / 75)
    assert section[1] == (f"| 100 | none | diloco8 | 14.00 [13.00, 15.00] | {ratio[0]:.2f} "
                          f"[{ratio[1]:.2f}, {ratio[2]:.2f}] |")
    assert section[2] == "| 100 | none | adiloco8 | 1/2 reached | - |"  # no mean to divide
    assert section[0] == "| 100 | none | sync | 75.00 [70.00, 80.00] | 1 |"


def lab_epoch(compute: float, wait_p50: float = 0.0, wait_p90: float = 0.0,
              seconds: float = 1.0, steps=(20, 20), wait_mean=None):
    """An epoch of a two-worker lab run as from_run reads it from the log (``steps``: each
    worker's; ``wait_mean``: each worker's, or None for a log from before it was recorded)."""
    from hvdtrain.compare.from_run import EpochTimes
    from hvdtrain.loop.step_times import RankStepTimes

    two = (compute, compute)
    return EpochTimes(2, seconds, sum(steps) // 2, RankStepTimes(
        steps, tuple(32 * n for n in steps), two, two, two, (wait_p50, wait_p50),
        (wait_p90, wait_p90), two, () if wait_mean is None else tuple(wait_mean)))


def test_the_labs_async_prediction_is_a_mid_run_epoch_of_pushes_and_overlapping_replies():
    from hvdtrain.compare import plan as planning
    from hvdtrain.compare.link_lab import predicted_step_seconds

    link = Link(10)
    args = [*DIGITS, "--max-steps-per-epoch", "20"]
    sim = run(Mode("async"), 2, Timing(0.001, link=link))
    # one transfer: 8 ms, so the link, not a round's 4 ms of compute, sets the pace
    one = sim.message_bytes / link.bytes_per_second
    adiloco4 = planning.modes(["adiloco"], [0], [0], [4])[0]
    # an epoch of 1 ms steps with nothing else in them: no time of the loop's own
    predicted = predicted_step_seconds(adiloco4, args, lab_epoch(0.001, seconds=0.02), link)
    # Each round of 4 steps (2 global steps of the two workers) takes a push and a reply on the
    # link, and a cycle of both workers' rounds takes 4 - 2 x DUPLEX_OVERLAP transfers (half
    # of them cross beside one going the other way): 1 - DUPLEX_OVERLAP / 2 of a transfer per
    # global step, in mid-run. A model with the transfers in series predicted a whole one (the
    # lab measured 12% to 28% less); an older one charged the link more than its bytes where
    # transfers overlapped, and averaged the whole run, its first and last rounds with them.
    # At the epoch's end the lead pulls the weights to evaluate: one more transfer in its 20
    # global steps (DiLoCoRun._epoch_ends).
    assert predicted == pytest.approx((1 - DUPLEX_OVERLAP / 2) * one + one / 20, rel=0.03)


def test_the_loop_is_the_period_less_the_mean_compute_and_wait_of_the_busiest_worker():
    from hvdtrain.compare.from_run import fit_epochs

    def loop(epoch, lock_step=True, local_steps=4):
        return fit_epochs([epoch], lock_step, local_steps).timing.loop_seconds

    # 4 local steps, a 20 ms period with 1 ms of compute: three steps wait 1 ms, the round's
    # 61 ms, a mean wait of 16 ms, as recorded; a log from before the mean was recorded gives
    # it from the median and the 90th percentile, which the round's wait holds while H < 10
    rounds = dict(wait_p50=0.001, wait_p90=0.061, seconds=0.4)
    assert loop(lab_epoch(0.001, wait_mean=(0.016, 0.016), **rounds)) == pytest.approx(0.003)
    assert loop(lab_epoch(0.001, **rounds)) == pytest.approx(0.003)
    # at 16 local steps the 90th percentile misses the round's wait: only the mean has it
    # (1 ms at 15 steps in 16, 61 ms at one)
    sixteen = lab_epoch(0.001, wait_mean=(0.00475, 0.00475), seconds=0.2, wait_p50=0.001,
                        wait_p90=0.001)
    assert loop(sixteen, local_steps=16) == pytest.approx(0.01 - 0.001 - 0.00475)
    # async, worker 0 across a slow link: 4 steps in a 72 ms epoch, mostly pushes; worker 1,
    # beside the server, took the other 36, one each 2 ms: the epoch's loop is worker 1's
    lopsided = lab_epoch(0.001, seconds=0.072, steps=(4, 36), wait_mean=(0.015, 0.0005))
    assert loop(lopsided, lock_step=False) == pytest.approx(0.002 - 0.001 - 0.0005)


def test_a_worker_beside_the_server_skips_the_link_and_never_waits_for_a_push_crossing_it():
    # The lab's placement: worker 1 on the server's host, worker 0 across the link. The server
    # takes a slow link's gradient in the background (ps/arrivals.py), so a remote push that
    # crosses holds nobody: in the lab it held the server, and worker 1, for the whole crossing.
    link = Link(10)
    sim = run(Mode("async"), 2, Timing(0.01, link=link, beside_server=(1,)))
    one = sim.message_bytes / link.bytes_per_second
    remote = [p.time for p in sim.pushes if p.worker == 0]
    beside = [p.time for p in sim.pushes if p.worker == 1]
    # Worker 0's round: its step, its push over the link, its reply over the link; the server
    # is never busy when it sends (updates cost nothing here), so nothing else delays it.
    assert len(remote) >= 2
    assert all(b - a == pytest.approx(0.01 + 2 * one) for a, b in zip(remote, remote[1:]))
    # Worker 1 pays no link and waits for nothing: a push every step, also while worker 0's
    # push crosses.
    assert len(beside) > len(remote)
    assert all(b - a == pytest.approx(0.01) for a, b in zip(beside, beside[1:]))
    assert [t for t in beside for landed in remote if landed - one < t < landed]
    # Every push crossing the link (no worker beside the server) is slower for worker 1.
    apart = run(Mode("async"), 2, Timing(0.01, link=link))
    assert len([p for p in apart.pushes if p.worker == 1]) < len(beside)


def adiloco(local_steps: int) -> Mode:
    from hvdtrain.compare import plan as planning

    return planning.modes(["adiloco"], [0], [0], [local_steps])[0]


def test_the_leads_epoch_ends_are_the_runs_each_a_pull_across_the_link_when_it_gets_there():
    # The lab beside a worker: worker 1 trains an epoch's 40 batches in 40 ms, faster than one
    # transfer of worker 0's (80 ms at 1 Mbit/s). A real run's epochs are worker 0's, and each
    # of its epoch ends here pulls the model across the link before it evaluates; so the
    # simulated evaluations are one a transfer or more apart, each at its epoch's last step,
    # not at worker 1's pace as they were until stop 58 (the job's batches of the epoch done).
    link = Link(1)
    args = [*DIGITS[:-4], "--epochs", "4", "--max-steps-per-epoch", "20"]
    sim = Simulation(adiloco(4), 2, "", 0, args, 0.99,
                     Timing(0.001, link=link, beside_server=(1,)))
    sim.result = sim.run()
    one = sim.message_bytes / link.bytes_per_second
    assert one > 0.04
    points = sim.result.curve
    assert [p["step"] for p in points][:4] == [20, 40, 60, 80]
    times = [p["wall_seconds"] for p in points[:4]]
    assert all(b - a >= one for a, b in zip(times, times[1:])), times
    # worker 1 ran out of batches long before worker 0 had ended the run's epochs
    assert max(p.time for p in sim.pushes if p.worker == 1) < times[-1] - one
    # Evaluations every 10 of the job's steps come at worker 1's pace meanwhile: the curve
    # keeps them in time order with worker 0's later ones, as a log's lines are.
    steps = Simulation(adiloco(4), 2, "", 0, [*args, "--eval-every-steps", "10"], 0.99,
                       Timing(0.001, link=link, beside_server=(1,)))
    curve = steps.run().curve
    assert len(curve) > len(points)
    assert [p["wall_seconds"] for p in curve] == sorted(p["wall_seconds"] for p in curve)


def test_an_async_diloco_round_takes_the_batches_held_and_worker_0s_ends_with_its_epoch():
    from hvdtrain.compare.sim.diloco_run import DiLoCoRun

    args = [*DIGITS[:-4], "--epochs", "2", "--max-steps-per-epoch", "20"]
    sim = Simulation(adiloco(4), 2, "", 0, args, 0.99, Timing(0.001))
    server = DiLoCoRun(sim)
    lead, other = sim.workers
    per_epoch = server.dispatcher.plan.slots_per_epoch
    assert per_epoch == 40
    # As server 0 answers a push: as many batches as its round trained, behind those held.
    server.dispatcher.next = per_epoch - 2
    server._hand_out(lead, 3)
    assert lead.slot == per_epoch - 2
    # Worker 0's epoch evaluates at its end, where its round is pushed: the round stops there
    # and the next epoch's batch waits for its next round.
    assert server._round(lead) == [per_epoch - 2, per_epoch - 1]
    assert lead.slot == per_epoch
    # Another worker's round goes on into the next epoch; with fewer held than H it asks for
    # the next ones, as a real worker's empty queue asks server 0.
    server._hand_out(other, 2)
    assert server._round(other) == [per_epoch + 1, per_epoch + 2, per_epoch + 3, per_epoch + 4]
    assert other.slot == NO_SLOT  # it holds none now: its push will bring four
