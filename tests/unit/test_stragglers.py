"""--straggler's model: the persistent and random forms, their seeded draws, the words the
compare report uses, and the hook that sleeps (no process is launched here; the real run is in
tests/multiproc/test_stragglers_multiproc.py)."""

from __future__ import annotations

import statistics
from collections import Counter

import pytest

from hvdtrain.cli import build_parser, config_from_args
from hvdtrain.compare.command import validate
from hvdtrain.compare.plan import modes, plan
from hvdtrain.compare.report import conditions_in_words, finding, summarize
from hvdtrain.compare.results import RunResult
from hvdtrain.config import ConfigError
from hvdtrain.stragglers import StragglerModel, parse_straggler
from hvdtrain.loop import hooks
from hvdtrain.scheme import Progress


@pytest.mark.parametrize("text, model", [
    ("", StragglerModel()),
    ("none", StragglerModel()),
    ("1x", StragglerModel()),
    ("3x", StragglerModel("last", factor=3.0)),
    ("50ms", StragglerModel("last", seconds=0.05)),
    ("3x@0.1", StragglerModel("random", factor=3.0, probability=0.1)),
    (" 2.5X @ 1 ", StragglerModel("random", factor=2.5, probability=1.0)),
    ("50ms@0.25", StragglerModel("random", seconds=0.05, probability=0.25)),
    ("exp:50ms", StragglerModel("exp", seconds=0.05)),
    ("pareto:20ms", StragglerModel("pareto", seconds=0.02)),
    ("heavy:20ms", StragglerModel("pareto", seconds=0.02)),
])
def test_forms(text, model):
    assert parse_straggler(text) == model


def test_persistent_forms_keep_their_old_meaning():
    # The last worker, every step: 3x sleeps twice its step time, 50ms sleeps 50 ms.
    last = parse_straggler("3x")
    assert [last.delay(w, 4, 7, 0.2, seed=0) for w in range(4)] == [0, 0, 0, pytest.approx(0.4)]
    assert parse_straggler("50ms").delay(1, 2, 0, 9.0, seed=5) == pytest.approx(0.05)
    assert not parse_straggler("none").active and parse_straggler("0ms") == StragglerModel()


@pytest.mark.parametrize("bad", ["fast", "0.5x", "-3ms", "3", "infx", "nanms", "3x@0", "3x@1.5",
                                 "3x@", "3x@often", "exp:0ms", "exp:50", "exp:-5ms", "pareto:",
                                 "gauss:50ms", "exp:50ms@0.1", "3x,exp:5ms"])
def test_bad_forms_name_the_forms_that_exist(bad):
    with pytest.raises(ValueError) as err:
        parse_straggler(bad)
    for form in ("3x", "50ms", "3x@0.1", "exp:50ms", "pareto:50ms"):
        assert form in str(err.value)


def test_train_and_compare_take_the_new_forms(tmp_path):
    def train(*argv):
        return config_from_args(build_parser().parse_args(["train", *argv]))

    assert train("--straggler", "pareto:30ms").run.straggler == "pareto:30ms"
    with pytest.raises(ConfigError, match="--straggler: invalid value '3x@2'; use none, or a form"):
        train("--straggler", "3x@2")

    def compare(stragglers):
        # Parsed by the real parser, so that a flag added to compare reaches validate here too.
        validate(build_parser().parse_args(["compare", "--seeds", "1", "--epochs", "1",
                                            "--out", str(tmp_path), "--stragglers", stragglers]))

    compare("none,3x,3x@0.1,50ms@0.5,exp:50ms,heavy:5ms")
    with pytest.raises(ConfigError, match="--stragglers: invalid condition 'exp:50'"):
        compare("none,exp:50")


def test_draws_are_seeded_by_seed_worker_and_step():
    for text in ("exp:50ms", "pareto:50ms"):
        model = parse_straggler(text)
        again = parse_straggler(text)  # another rank, or the simulator, parses its own
        draws = [model.delay(w, 4, s, 0.01, seed=3) for w in range(4) for s in range(50)]
        assert draws == [again.delay(w, 4, s, 0.01, seed=3) for w in range(4) for s in range(50)]
        assert len(set(draws)) == len(draws)  # each worker and step draws its own
        assert draws != [model.delay(w, 4, s, 0.01, seed=4) for w in range(4) for s in range(50)]
        # Neither the step time nor the number of workers changes a delay draw.
        assert model.delay(1, 2, 9, 5.0, seed=3) == model.delay(1, 8, 9, 0.0, seed=3)


@pytest.mark.parametrize("text, count, tolerance", [("exp:50ms", 20_000, 0.03),
                                                    ("pareto:50ms", 200_000, 0.05)])
def test_mean_delay_is_the_stated_mean(text, count, tolerance):
    model = parse_straggler(text)
    draws = [model.delay(s % 4, 4, s // 4, 0.01, seed=0) for s in range(count)]
    assert statistics.fmean(draws) == pytest.approx(0.05, rel=tolerance)
    if model.kind == "exp":
        assert statistics.median(draws) == pytest.approx(0.05 * 0.6931, rel=0.03)  # ln 2 x mean
    else:
        # Pareto with shape a, scaled to mean m: minimum m (a-1)/a, median minimum x 2^(1/a);
        # the tail reaches far beyond the mean (here some draws wait over 5 s).
        low = 0.05 / 3
        assert low <= min(draws) < low * 1.001
        assert statistics.median(draws) == pytest.approx(low * 2 ** (1 / 1.5), rel=0.02)
        assert max(draws) > 100 * 0.05


def test_random_straggler_is_one_worker_at_the_stated_rate_on_every_rank():
    model, workers, steps = parse_straggler("3x@0.1"), 4, 20_000
    ranks = [parse_straggler("3x@0.1") for _ in range(workers)]  # each rank's own copy
    slowed = Counter()
    for step in range(steps):
        delays = [ranks[w].delay(w, workers, step, 0.2, seed=1) for w in range(workers)]
        who = [w for w, d in enumerate(delays) if d]
        assert len(who) <= 1
        assert who == ([] if model.slowed_worker(workers, step, 1) is None
                       else [model.slowed_worker(workers, step, 1)])
        for w in who:
            assert delays[w] == pytest.approx(0.4)  # 3x: twice its step time more
            slowed[w] += 1
    assert sum(slowed.values()) / steps == pytest.approx(0.1, abs=0.01)
    for w in range(workers):  # the choice is spread over the workers, not always the last
        assert slowed[w] / steps == pytest.approx(0.1 / workers, abs=0.01)
    other_seed = [model.slowed_worker(workers, s, 2) for s in range(200)]
    assert other_seed != [model.slowed_worker(workers, s, 1) for s in range(200)]


def test_describe_says_each_condition_in_words():
    words = {t: parse_straggler(t).describe() for t in
             ("none", "3x", "50ms", "3x@0.1", "50ms@0.25", "exp:50ms", "pareto:20ms")}
    assert words == {
        "none": "no worker is slowed",
        "3x": "the last worker runs 3x slower at every step",
        "50ms": "the last worker waits 50 ms more at every step",
        "3x@0.1": "at each step, with probability 0.1, one random worker runs 3x slower",
        "50ms@0.25": "at each step, with probability 0.25, one random worker waits 50 ms more",
        "exp:50ms": "every worker waits an exponential delay with mean 50 ms at each step",
        "pareto:20ms": "every worker waits a heavy-tailed (Pareto, shape 1.5) delay with mean "
                       "20 ms at each step",
    }


def test_hook_sleeps_what_the_model_says(monkeypatch):
    slept = []
    monkeypatch.setattr(hooks.time, "sleep", slept.append)

    def run_steps(spec, worker, workers, seed=7, steps=30):
        hook = hooks.Straggler(spec, seed)
        hook.bind_world(worker, workers)
        slept.clear()
        for s in range(steps):
            hook.after_step(hooks.StepResult(Progress(epoch=s // 10, step=s % 10, global_step=s),
                                             0.5, 0.1))
        return list(slept)

    assert run_steps("3x", 1, 2) == [pytest.approx(0.2)] * 30 and run_steps("3x", 0, 2) == []
    model = parse_straggler("exp:5ms")
    assert run_steps("exp:5ms", 1, 3) == [model.delay(1, 3, s, 0.1, 7) for s in range(30)]
    picked = [s for s in range(30) if parse_straggler("3x@0.3").slowed_worker(2, s, 7) == 0]
    assert len(run_steps("3x@0.3", 0, 2)) == len(picked) > 0
    run = config_from_args(build_parser().parse_args(["train", "--straggler", "exp:5ms",
                                                      "--seed", "11"])).run
    straggler = next(h for h in hooks.default_hooks(run) if isinstance(h, hooks.Straggler))
    assert straggler.seed == 11 and straggler.model == model


def _result(straggler, mode, time):
    curve = [{"step": 10, "wall_seconds": time, "train_loss": 0.5, "test_acc": 0.95}]
    return RunResult(f"{mode}-{straggler}", mode, straggler, 0, "ok", "", 0.95, time, 1000.0,
                     0.0, time, curve, {})


def test_compare_plans_and_reports_the_random_conditions():
    runs = plan(modes(["sync"], []), [0], ["none", "3x@0.1", "exp:50ms", " 3x "], 2, [])
    assert [r.name for r in runs] == ["sync-seed0", "sync-seed0-straggler3x@0.1",
                                      "sync-seed0-stragglerexp-50ms", "sync-seed0-straggler3x"]
    assert runs[2].command("python", "d")[-2:] == ["--straggler", "exp:50ms"]
    results = [_result("none", "sync", 1.0), _result("exp:50ms", "sync", 2.0),
               _result("exp:50ms", "async", 1.0)]
    text = finding(summarize(results), "exp:50ms", 0.9)
    assert text.startswith("- With straggler exp:50ms (every worker waits an exponential delay "
                           "with mean 50 ms at each step): time to 90%")
    assert "**whether it beats sync is not settled**" in text  # one run each: no interval
    assert finding(summarize(results), "none", 0.9).startswith("- Without a straggler")
    lines = conditions_in_words(["none", "3x", "pareto:50ms"])
    assert "- `3x`: the last worker runs 3x slower at every step." in lines
    assert "- `none`: no worker is slowed." in lines
    assert any("each run's seed" in line for line in lines)
    assert not any("seed" in line for line in conditions_in_words(["none", "3x"]))
