"""The study's steps-to-target mode (tools/batch_study/target_*.py): the rate
search, the budget and schedule of a trial, the table, the fit of McCandlish
et al. and a tiny study end to end with its resume."""

import dataclasses
import math
import re
import warnings

import numpy as np
import pytest

from keras_lars.tools import batch_study
from keras_lars.tools import train
from keras_lars.tools.batch_study import quasi_results
from keras_lars.tools.batch_study import target_results
from keras_lars.tools.batch_study import target_runner
from keras_lars.tools.batch_study import target_search
from keras_lars.tools.batch_study.cells import cell_key
from keras_lars.tools.settings import ConfigError
from keras_lars.tools.train.loop import Diverged
from tests.test_batch_study import parse
from tests.test_batch_study import read_csv
from tests.test_batch_study import read_json

TARGET = ["--mode=steps_to_target", "--target_accuracy=0.8"]


def row(k, steps=None, accuracy=0.5):
    """A trial row at grid step k: reached in `steps`, or missed at `accuracy`."""
    reached = steps is not None
    return {"reached": reached, "steps": steps or 100, "best_val_accuracy": accuracy, "k": k}


def search_path(outcome, max_steps=5):
    """The k's the search tries when trial k comes out as outcome(k)."""
    results, path = {}, []
    while (k := target_search.next_step(results, max_steps)) is not None:
        path.append(k)
        results[k] = outcome(k)
    return path, target_search.best_step(results)


def test_the_search_walks_to_the_best_rate_and_stops_past_it():
    # Fewest steps at k = 2: 0, -1, 1 first, then up while the best is the largest k.
    path, best = search_path(lambda k: row(k, steps=10 + abs(k - 2)))
    assert (path, best) == ([0, -1, 1, 2, 3], 2)
    path, best = search_path(lambda k: row(k, steps=10 + abs(k + 3)))
    assert (path, best) == ([0, -1, 1, -2, -3, -4], -3)


def test_the_search_stops_at_its_limit_and_ranks_misses_by_accuracy():
    # Always better further down: stops at -max_steps.
    path, best = search_path(lambda k: row(k, steps=20 + k), max_steps=3)
    assert (path, best) == ([0, -1, 1, -2, -3], -3)
    # Nothing reaches the target: the highest accuracy leads the search, and
    # two steps either side of it are tried too.
    path, best = search_path(lambda k: row(k, accuracy=0.5 - 0.01 * abs(k - 1)))
    assert (path, best) == ([0, -1, 1, 2, 3], 1)
    path, best = search_path(lambda k: row(k, accuracy=0.5 - 0.01 * abs(k)), max_steps=1)
    assert (path, best) == ([0, -1, 1], 0)
    # A reached trial beats any miss; a tie goes to the smaller |k|.
    outcome = {0: row(0, steps=30), -1: row(-1, accuracy=0.9), 1: row(1, steps=30)}
    assert search_path(outcome.__getitem__) == ([0, -1, 1], 0)


def test_a_walk_limited_to_zero_steps_tries_nothing_more():
    # The budget walk with --max_budget_doublings=0 keeps the budget T(B).
    assert target_search.next_step({0: row(0, steps=10)}, 0) is None
    assert target_search.next_step({0: row(0, steps=10)}, 1) == -1


def test_a_miss_at_the_best_accuracy_is_searched_on_both_sides():
    # Best accuracy at k = 0 (missed); k = -2 reaches the target: the search
    # finds it, then walks on down from it as from any reached trial.
    outcome = {0: 0.89, -1: 0.86, 1: 0.66, 2: 0.1}

    def result(k):
        return row(k, steps=200 + 10 * k) if k <= -2 else row(k, accuracy=outcome[k])

    assert search_path(result, max_steps=4) == ([0, -1, 1, -2, -3, -4], -4)
    # -2 misses too and is worse: +2 is tried, then the search stops at 0.
    outcome[-2] = 0.5
    assert search_path(lambda k: row(k, accuracy=outcome[k])) == ([0, -1, 1, -2, 2], 0)


def test_a_stored_trial_takes_its_grid_step_in_this_plan():
    # The same rate (key) stored at k = -2 of an earlier centre is k = 0 now.
    study = parse(*TARGET)
    t = target_search.trial(study, "lars", 256, 2.5, 0, 0, 1024)
    records = {t.key: {"row": {"rate_step": -2, "steps": 90, "reached": True}}}
    assert target_results.trial_rows([t], records) == [
        {"rate_step": 0, "budget_step": 0, "steps": 90, "reached": True}
    ]
    assert target_results.trial_rows([t], {}) == []


def test_a_trial_has_its_budget_rate_warmup_and_evaluations():
    study = parse(*TARGET, "--budget_epochs=3", "--min_budget_steps=20", "--warmup_fraction=0.1")
    n = 1438
    # T(B) = max(20, ceil(3 * 1438 / B)); every floor(n / B / 4) steps, at least 1.
    for batch, budget, every in ((32, 135, 11), (128, 34, 2), (512, 20, 1)):
        assert target_search.budget_steps(study.search, batch, n) == budget
        t = target_search.trial(study, "lars", batch, 2.0, -1, 1, n)
        config = t.config
        assert config.train_steps == budget and config.eval_every_steps == every
        assert config.peak_learning_rate == 1.0 and config.lr_scaling == "none"
        assert config.target_accuracy == 0.8 and config.seed == 1
        warmup = train.run_length(config, n).warmup_steps
        assert warmup == math.floor(0.1 * budget + 0.5)
        assert t.key in config.model_dir and (t.rate_step, t.batch_size) == (-1, batch)
    # The key follows the numbers, not where the trial runs.
    a = target_search.trial(study, "lars", 128, 2.0, 0, 0, n)
    b = target_search.trial(study, "lars", 128, 2.0, 1, 0, n)
    assert a.key != b.key
    assert a.key == target_search.trial(study, "lars", 128, 4.0, -1, 0, n).key


def test_a_budget_below_a_smaller_batchs_steps_is_named():
    """Fashion-MNIST: Nesterov took 174 steps at 1024; 150 steps at 4096 missed at every rate."""
    assert target_search.budget_warning("nesterov", 4096, 150, (1024, 174)) == (
        "warning: nesterov at batch 4096: its budget of 150 steps is below the 174 steps it "
        "took at batch 1024; a miss here may be the budget's: raise --min_budget_steps"
    )
    assert target_search.budget_warning("nesterov", 4096, 174, (1024, 174)) is None
    assert target_search.budget_warning("lars", 4096, 150, None) is None  # nothing reached


def test_the_fit_recovers_s_min_and_e_min_of_exact_data():
    s_min, e_min = 40.0, 3.0e5
    batches = [64, 256, 1024, 4096, 16384]
    rows = [
        {"batch_size": b, "seeds": 3, "seeds_reached": 3, "steps_mean": s_min + e_min / b}
        | {"tuned": True}
        for b in batches
    ]
    found = target_results.fit(rows)
    assert found["s_min"] == pytest.approx(s_min, rel=1e-9)
    assert found["e_min"] == pytest.approx(e_min, rel=1e-9)
    assert found["b_crit"] == pytest.approx(e_min / s_min, rel=1e-9)
    assert found["batches"] == batches
    # A batch where a seed missed is left out; fewer than three points: no fit.
    rows[0]["seeds_reached"] = 2
    assert target_results.fit(rows)["batches"] == batches[1:]
    assert target_results.fit(rows[:3]) is None
    # So is an untuned batch.
    rows[-1]["tuned"] = False
    assert target_results.fit(rows)["batches"] == batches[1:-1]


def test_the_fit_falls_back_to_one_coefficient():
    # Perfect scaling (S = E_min / B): S_min would come out negative.
    rows = [
        {"batch_size": b, "seeds": 1, "seeds_reached": 1, "steps_mean": 1e5 / b - 1.0}
        | {"tuned": True}
        for b in (32, 64, 128)
    ]
    found = target_results.fit(rows)
    assert found["s_min"] == 0.0 and found["b_crit"] == math.inf
    x = np.array([1 / 32, 1 / 64, 1 / 128])
    s = 1e5 * x - 1.0
    assert found["e_min"] == pytest.approx(np.sum(x / s) / np.sum((x / s) ** 2))


def test_the_markdown_tables_show_each_kind_of_table_row_and_fit():
    def row(optimizer, batch, seeds, reached, steps=(), rate=0.05, budget=300, tuned=True):
        return {
            "optimizer": optimizer,
            "batch_size": batch,
            "chosen_rate": rate,
            "tuned": tuned,
            "seeds": seeds,
            "seeds_reached": reached,
            "steps_mean": sum(steps) / len(steps) if steps else None,
            "steps_min": min(steps, default=None),
            "steps_max": max(steps, default=None),
            "budget_steps": budget,
            "eval_every_steps": 60_000 // batch // 4 or 1,
        }

    summary = [
        row("lamb", 64, 1, 1, [1638], rate=0.0025, budget=9375),
        row("lamb", 16384, 3, 2, [131, 141], rate=0.04),
        row("nesterov", 64, 1, 1, [1170], rate=0.0125, budget=4688),
        row("nesterov", 16384, 3, 3, [120, 132, 150]),
        row("nesterov", 60000, 1, 0, rate=0.05, budget=600, tuned=False),
    ]
    fits = {
        "nesterov": {"s_min": 134.4, "e_min": 67_949.0, "b_crit": 505.6, "batches": [64, 16384]},
        "lamb": {"s_min": 0.0, "e_min": 1.0e5, "b_crit": math.inf, "batches": [64, 1024, 4096]},
    }
    noise = {
        "nesterov": {"batch_size": 1024, "noise_scale": 53.4, "step": 174, "reached": True},
        "lamb": {"batch_size": 1024, "noise_scale": 1234.4, "step": 300, "reached": False},
    }
    text = target_results.markdown_tables(["nesterov", "lamb"], summary, fits, noise)
    assert text == (
        "| batch | evaluation interval | Nesterov | LAMB |\n"
        "|---|---|---|---|\n"
        "| 64 | 234 | 1,170 (0.0125, T 4,688) | 1,638 (0.0025, T 9,375) |\n"
        "| 16,384 | 1 | 134 [120\u2013150] (0.05, T 300) | 136 [131\u2013141], 2 of 3 seeds "
        "(0.04, T 300) |\n"
        "| 60,000 | 1 | not reached (0.05, T 600; untuned) |  |\n"
        "\n"
        "| optimizer | batches fitted | S_min (steps) | E_min (examples) | B_crit = E_min / S_min "
        "| B_simple (at batch, step) |\n"
        "|---|---|---|---|---|---|\n"
        "| Nesterov | 64\u201316,384 (2) | 134 | 67,900 | 506 | 53 (1,024, 174) |\n"
        "| LAMB | 64\u20134,096 (3) | 0 | 100,000 | \u221e | 1,234 (1,024, 300); missed the "
        "target |\n"
    )
    # An optimizer without a fit or a noise scale keeps its row.
    text = target_results.markdown_tables(["nesterov"], summary[2:4], {"nesterov": None}, {})
    assert text.endswith("| Nesterov | fewer than 3 |  |  |  |  |\n")


def test_the_table_takes_the_search_choice_and_the_seeds_at_it():
    def trial(seed, k, reached, steps, j=0):
        return {
            "optimizer": "lars",
            "batch_size": 256,
            "seed": seed,
            "rate_step": k,
            "budget_step": j,
            "peak_learning_rate": 2.0**k,
            "reached": reached,
            "steps": steps,
            "examples": 256 * steps,
            "seconds": steps / 10,
            "best_val_accuracy": 0.9 if reached else 0.5,
            "budget_steps": 500 * 2**j,
            "eval_every_steps": 25,
        }

    rows = [trial(0, 0, True, 120), trial(0, -1, True, 90), trial(0, 1, False, 500)]
    rows += [trial(0, -2, True, 100), trial(1, -1, True, 110), trial(2, -1, False, 500)]
    rows += [trial(0, -1, True, 95, j=-1), trial(0, -1, True, 90, j=1)]  # no better budget
    (found,) = target_results.table(rows)
    assert found["chosen_rate"] == 0.5 and found["search_trials"] == 6
    assert (found["seeds"], found["seeds_reached"]) == (3, 2)
    assert found["steps_mean"] == 100.0 and (found["steps_min"], found["steps_max"]) == (90, 110)
    assert found["examples_mean"] == 256 * 100.0
    assert (found["budget_steps"], found["eval_every_steps"]) == (500, 25)
    # A halved budget that reaches the target sooner is chosen, with its seeds.
    rows += [trial(0, -1, True, 70, j=-2), trial(1, -1, True, 80, j=-2)]
    (found,) = target_results.table(rows)
    assert (found["chosen_rate"], found["budget_steps"]) == (0.5, 125)
    assert (found["seeds"], found["steps_mean"]) == (2, 75.0)
    # The rate is chosen at the budget T(B) first: a better trial at another
    # rate's budget walk is not in this search.
    assert target_search.chosen_point({(0, 0): rows[0], (1, -1): trial(0, 1, True, 10)}) == (0, 0)


def test_a_seed_that_misses_at_the_choice_moves_it_to_the_next_point_that_reached():
    def trial(seed, k, steps, j=0):  # steps None: missed
        reached = steps is not None
        return {
            "optimizer": "lamb",
            "batch_size": 4096,
            "seed": seed,
            "rate_step": k,
            "budget_step": j,
            "peak_learning_rate": 2.0**k,
            "reached": reached,
            "steps": steps or 200 * 2**j,
            "examples": 4096 * (steps or 200 * 2**j),
            "seconds": 1.0,
            "best_val_accuracy": 0.9 if reached else 0.89,
            "budget_steps": 200 * 2**j,
            "eval_every_steps": 3,
        }

    search = [trial(0, 0, 120), trial(0, -1, 90), trial(0, 1, None), trial(0, -2, 100)]
    search += [trial(0, -1, 95, j=-1), trial(0, -1, 130, j=1)]
    points = {(r["rate_step"], r["budget_step"]): r for r in search}
    # The choice, then the two best other points that reached: 95 at j = -1, 100 at k = -2.
    candidates = target_search.seed_candidates(points)
    assert candidates == [(-1, 0), (-1, -1), (-2, 0)]

    def chosen(rows):
        (found,) = target_results.table(rows)
        return found["chosen_rate"], found["budget_steps"], found["points_seeded"], found

    # A seed missed at the choice, and no seeds ran further: the choice, its miss shown.
    rows = search + [trial(1, -1, 110), trial(2, -1, None)]
    rate, budget, seeded, found = chosen(rows)
    assert (rate, budget, seeded, found["seeds"], found["seeds_reached"]) == (0.5, 200, 1, 3, 2)
    # Seeds at the next point all reached: it is the choice.
    rows += [trial(1, -1, 97, j=-1), trial(2, -1, 99, j=-1)]
    rate, budget, seeded, found = chosen(rows)
    assert (rate, budget, seeded, found["steps_mean"]) == (0.5, 100, 2, 97.0)
    # A miss there too: on to the third.
    rows[-1] = trial(2, -1, None, j=-1)
    rows += [trial(1, -2, 104), trial(2, -2, 102)]
    rate, budget, seeded, found = chosen(rows)
    assert (rate, budget, seeded, found["steps_mean"]) == (0.25, 200, 3, 102.0)
    # Misses everywhere: the fewest misses, the earlier point on a tie.
    rows[-1] = trial(2, -2, None)
    assert chosen(rows)[:3] == (0.5, 200, 3)
    # A choice that missed with seed 0 has no other point to fall back to.
    missed = {(0, 0): trial(0, 0, None), (1, 0): trial(0, 1, None)}
    assert target_search.seed_candidates(missed) == [(0, 0)]


def simulated(missed=lambda t: False, collapsed=lambda t: False, j_steps=lambda t: 5 * abs(t)):
    """A stand-in for target_runner.run_trial: trial t reaches the target in
    50 + 10|k| + j_steps(j) steps, unless missed(t), or collapsed(t): missed,
    and stopped at that step as collapsed."""

    def run_trial(t):
        steps = 50 + 10 * abs(t.rate_step) + j_steps(t.budget_step)
        reached = not missed(t) and not collapsed(t)
        target = {
            "reached": reached,
            "step": steps,
            "steps": t.config.train_steps,
            "examples": t.batch_size * (steps if reached else t.config.train_steps),
            "seconds": 1.0,
            "noise_scale": 7.0,
        }
        if collapsed(t):
            target["collapsed"] = {"step": steps, "seconds": 0.5}
        evaluations = [{"step": steps, "val_accuracy": 0.9 if reached else 0.5}]
        summary = {"target": target, "evaluations": evaluations, "history": []}
        return {"key": t.key, "row": target_runner.trial_row(t, summary, 1.0), "evaluations": []}

    return run_trial


def without_plots(monkeypatch):
    """The studies of simulated trials draw no plot (target_results.plot, a
    second under load, after every trial); the plot tests and the studies
    that train draw theirs. Returns the paths of the plots asked for."""
    asked = []

    def record(summary, fits, noise, path, title):
        asked.append(str(path))

    monkeypatch.setattr(target_results, "plot", record)
    monkeypatch.setattr(quasi_results, "plot", record)  # its own name of it
    return asked


SIMULATED = [
    *TARGET,
    "--model=simple_cnn",
    "--image_size=8",
    "--optimizers=lars",
    "--train_examples=512",
    "--budget_epochs=5",
    "--min_budget_steps=20",
    "--max_rate_steps=1",
]


def test_the_runner_falls_back_over_the_points_while_a_seed_misses(tmp_path, monkeypatch):
    # Simulated trials: the choice is (0, 0) and the next points (0, -1) and
    # (0, 1); seed 1 misses at the first two.
    misses = {(0, 0), (0, -1)}
    outcome = simulated(lambda t: t.seed == 1 and (t.rate_step, t.budget_step) in misses)
    monkeypatch.setattr(target_runner, "run_trial", outcome)
    plots = without_plots(monkeypatch)
    study = parse(
        *SIMULATED,
        "--batch_sizes=64",
        "--seeds=2",
        "--noise_scale_batch_size=64",
        "--noise_scale_micro_batches=2",
        f"--study_dir={tmp_path}",
    )
    rows, _ = batch_study.run_target_study(study)
    # Seed 0's search: the rates k = 0, -1, 1, then the budget walk at the
    # best (k = 0), halved and doubled: ceil(T(B) 2^j), T(B) = max(20,
    # ceil(5 * 512 / 64)) = 40.
    search = {
        (r["rate_step"], r["budget_step"]): r["budget_steps"]
        for r in rows
        if r["seed"] == 0 and "noise_scale" not in r
    }
    assert search == {(0, 0): 40, (-1, 0): 40, (1, 0): 40, (0, -1): 20, (0, 1): 80}
    seeds = [(r["rate_step"], r["budget_step"]) for r in rows if r["seed"] == 1]
    assert seeds == [(0, 0), (0, -1), (0, 1)]
    # The plot after each of the 5 + 3 + 1 trials and at the end.
    assert plots == [str(tmp_path / "steps_to_target.png")] * 10
    (noise,) = [r for r in rows if "noise_scale" in r]
    assert (noise["rate_step"], noise["budget_step"], noise["budget_steps"]) == (0, 1, 80)
    (found,) = read_csv(tmp_path / "steps_to_target.csv")
    assert (int(found["budget_steps"]), int(found["points_seeded"])) == (80, 3)
    assert float(found["steps_mean"]) == 55.0


def test_a_validation_split_is_every_trials_and_recorded(tmp_path, monkeypatch):
    # 300 training images held out (seed 7): every trial evaluates on them;
    # the store's rows carry the test accuracy read at the target.
    def with_test(t):
        record = simulated()(t)
        return dict(record, row=dict(record["row"], test_accuracy=0.75))

    monkeypatch.setattr(target_runner, "run_trial", with_test)
    without_plots(monkeypatch)
    args = [*SIMULATED, "--batch_sizes=64", "--seeds=1", f"--study_dir={tmp_path}"]
    held = ["--validation_examples=300", "--validation_seed=7"]
    rows, trained = batch_study.run_target_study(parse(*args, *held))
    assert len(rows) == len(trained) == 5 and {r["test_accuracy"] for r in rows} == {0.75}
    # The trials' configs hold out the split (so their keys differ from the test split's).
    t = target_search.trial(parse(*args, *held), "lars", 64, 1.0, 0, 0, 512)
    assert (t.config.validation_examples, t.config.validation_seed) == (300, 7)
    assert t.key != target_search.trial(parse(*args), "lars", 64, 1.0, 0, 0, 512).key
    header = read_json(tmp_path / "trials.json")["study"]
    assert (header["validation_examples"], header["validation_seed"]) == (300, 7)
    assert header["train_examples"] == 512
    # Holding out too many leaves no batch: one line naming the flag, the store untouched.
    before = (tmp_path / "trials.jsonl").read_bytes()
    with pytest.raises(ConfigError) as raised:
        batch_study.run_target_study(
            parse(*args, "--validation_examples=1400", "--train_examples=0")
        )
    assert str(raised.value) == (
        "--validation_examples=1400 leaves 38 training examples, fewer than the batch 64 of "
        "--batch_sizes=64 (an epoch would have no step)."
    )
    assert (tmp_path / "trials.jsonl").read_bytes() == before


def test_the_runner_says_where_a_collapsed_trial_stopped(tmp_path, monkeypatch, capsys):
    outcome = simulated(collapsed=lambda t: t.rate_step == 1)
    monkeypatch.setattr(target_runner, "run_trial", outcome)
    without_plots(monkeypatch)
    study = parse(*SIMULATED, "--batch_sizes=64", "--seeds=1", f"--study_dir={tmp_path}")
    rows, _ = batch_study.run_target_study(study)
    (stopped,) = [r for r in rows if "collapsed_step" in r]
    assert (stopped["rate_step"], stopped["collapsed_step"], stopped["seconds"]) == (1, 60, 0.5)
    lines = [line for line in capsys.readouterr().out.splitlines() if "collapsed" in line]
    assert len(lines) == 1
    assert "not reached (collapsed to chance: stopped at step 60), best accuracy 0.5000" in lines[0]


def test_an_untuned_batch_runs_once_at_the_choice_before_and_is_left_out_of_the_fit(
    tmp_path, monkeypatch
):
    # At 128 the search chooses k = -1 (k = 0 misses; k = 1 ties, farther
    # from 0 on the grid's other side) and j = -1 (a shorter budget helps
    # everywhere here); 256 and 512 are untuned: one trial each at that rate,
    # unscaled, and that budget step. Seeds 1 at 512 run there too.
    def missed(t):
        return t.batch_size == 128 and (t.rate_step, t.budget_step) == (0, 0)

    outcome = simulated(missed, j_steps=lambda j: 5 * j)
    monkeypatch.setattr(target_runner, "run_trial", outcome)
    without_plots(monkeypatch)
    study = parse(
        *SIMULATED,
        "--batch_sizes=32,64,128,256,512",
        "--untuned_batch_sizes=256,512",
        "--seeds=2",
        "--seed_batch_sizes=512",
        f"--study_dir={tmp_path}",
    )
    rows, _ = batch_study.run_target_study(study)

    def at(batch):
        return [r for r in rows if r["batch_size"] == batch]

    searched = {(r["rate_step"], r["budget_step"]): r for r in at(128)}
    rate = searched[(-1, -1)]["peak_learning_rate"]
    assert len(searched) == 5 and rate == searched[(0, 0)]["peak_learning_rate"] / 2
    for batch in (256, 512):
        budget = target_search.budget_steps(study.search, batch, 512, budget_step=-1)
        assert [(r["seed"], r["rate_step"], r["budget_step"]) for r in at(batch)] == [
            (s, 0, -1) for s in range(1 + (batch == 512))
        ]
        assert {(r["peak_learning_rate"], r["budget_steps"]) for r in at(batch)} == {(rate, budget)}
    table = {int(r["batch_size"]): r for r in read_csv(tmp_path / "steps_to_target.csv")}
    assert [table[b]["tuned"] for b in (32, 64, 128, 256, 512)] == ["True"] * 3 + ["False"] * 2
    assert (table[512]["search_trials"], table[512]["seeds_reached"]) == ("1", "2")
    fit = read_json(tmp_path / "fit.json")
    assert fit["study"]["untuned_batch_sizes"] == [256, 512]
    assert fit["fits"]["lars"]["batches"] == [32, 64, 128]


def test_untuned_batches_after_a_choice_that_missed_are_not_run(tmp_path, monkeypatch, capsys):
    # Every trial at 128 misses: its choice is a miss, so neither untuned
    # batch after it runs (no rate is known to reach the target there).
    outcome = simulated(lambda t: t.batch_size == 128)
    monkeypatch.setattr(target_runner, "run_trial", outcome)
    without_plots(monkeypatch)
    study = parse(
        *SIMULATED,
        "--batch_sizes=64,128,256,512",
        "--untuned_batch_sizes=256,512",
        "--seeds=1",
        f"--study_dir={tmp_path}",
    )
    rows, trained = batch_study.run_target_study(study)
    assert {r["batch_size"] for r in rows} == {64, 128} and len(trained) == len(rows)
    lines = [line for line in capsys.readouterr().out.splitlines() if "(untuned)" in line]
    assert lines == [
        "lars at batch 256 (untuned): not run, as its choice at batch 128 did not reach the "
        "target; it would train its whole budget at a rate not known to reach it."
    ]
    table = {int(r["batch_size"]): r for r in read_csv(tmp_path / "steps_to_target.csv")}
    assert sorted(table) == [64, 128] and table[128]["seeds_reached"] == "0"
    # A rerun trains nothing and says it again.
    assert batch_study.run_target_study(study)[1] == []
    assert "lars at batch 256 (untuned): not run" in capsys.readouterr().out


def test_tables_written_part_way_keep_what_the_store_holds(tmp_path, monkeypatch):
    # Batch-major order: a rerun with a larger batch trains its search before
    # it comes to the seeds of the batch before, which the store holds; the
    # tables written after its first trial still have them.
    monkeypatch.setattr(target_runner, "run_trial", simulated())
    without_plots(monkeypatch)
    args = [*SIMULATED, "--seeds=2", "--seed_batch_sizes=64", f"--study_dir={tmp_path}"]
    batch_study.run_target_study(parse(*args, "--batch_sizes=64"))
    (before,) = read_csv(tmp_path / "steps_to_target.csv")
    assert (before["seeds"], before["seeds_reached"]) == ("2", "2")
    first_trials = read_csv(tmp_path / "trials.csv")
    trained = []

    def stopped_at_the_second(t):
        trained.append(t.key)
        if len(trained) == 2:
            raise train.Preempted("stopped by SIGTERM")
        return simulated()(t)

    monkeypatch.setattr(target_runner, "run_trial", stopped_at_the_second)
    with pytest.raises(train.Preempted):
        batch_study.run_target_study(parse(*args, "--batch_sizes=64,256"))
    after = read_csv(tmp_path / "steps_to_target.csv")
    assert after[0] == before
    assert (after[1]["batch_size"], after[1]["search_trials"]) == ("256", "1")
    assert read_csv(tmp_path / "trials.csv")[:-1] == first_trials  # and the new one


def plotted(batch, steps, tuned, budget=586):
    """A row of the steps-to-target table as target_results.plot reads it
    (Nesterov, one seed)."""
    return {
        "optimizer": "nesterov",
        "batch_size": batch,
        "steps_mean": steps,
        "steps_min": steps,
        "steps_max": steps,
        "budget_steps": budget,
        "tuned": tuned,
    }


@pytest.mark.parametrize(
    "batches, steps", [((1024,), (174,)), ((64,), (10,)), ((64, 256), (10, 10))]
)
def test_the_plot_of_one_batch_or_equal_steps_draws_without_a_warning(tmp_path, batches, steps):
    # Log axes of one point, or of a flat curve, used to warn (singular
    # limits) or collapse the layout (labelled minor ticks).
    summary = [plotted(b, s, tuned=b != 256) for b, s in zip(batches, steps)]  # 256 drawn open
    summary.append({**summary[0], "optimizer": "lars", "steps_mean": None})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        target_results.plot(summary, {}, {}, tmp_path / "plot.png", "title")
    assert (tmp_path / "plot.png").read_bytes()[:4] == b"\x89PNG"
    assert target_results.at_least_a_factor(100.0, 100.0) == (50.0, 200.0)
    assert target_results.at_least_a_factor(10.0, 1000.0) == (10.0, 1000.0)


def test_the_plot_draws_an_untuned_batch_open_and_a_tuned_one_filled(tmp_path):
    # The open marker once sat under the error bar's own (matplotlib draws
    # that at zorder 2.1): the 60,000 points of the Fashion-MNIST plot were filled.
    summary = [plotted(64, 1000, True), plotted(256, 400, True), plotted(1024, 300, False)]
    figure = target_results.plot(summary, {}, {}, tmp_path / "plot.png", "title")
    figure.canvas.draw()
    pixels = np.asarray(figure.canvas.buffer_rgba())[..., :3]
    white = (255, 255, 255)
    for axes, scale in zip(figure.axes[:2], (lambda r: 1, lambda r: r["batch_size"])):
        for r in summary:
            x, y = axes.transData.transform((r["batch_size"], r["steps_mean"] * scale(r)))
            centre = tuple(pixels[pixels.shape[0] - round(y), round(x)])
            assert (centre == white) == (not r["tuned"]), (axes.get_ylabel(), r, centre)


@pytest.mark.parametrize(
    "argv, line",
    [
        (["--mode=steps_to_target"], "--mode=steps_to_target needs --target_accuracy"),
        (["--target_accuracy=0.9"], "--target_accuracy=0.9 needs --mode=steps_to_target"),
        ([*TARGET, "--warmup_epochs=1"], "--warmup_epochs: --mode=steps_to_target sets it"),
        ([*TARGET, "--eval_every_steps=5"], "--eval_every_steps: --mode=steps_to_target sets"),
        ([*TARGET, "--control_schedule=0:64,1:128"], "--control_schedule belongs to"),
        ([*TARGET, "--seed_batch_sizes=64"], "--seed_batch_sizes=64: 64 is not one of"),
        ([*TARGET, "--untuned_batch_sizes=64"], "--untuned_batch_sizes=64: 64 is not one of"),
        (
            [*TARGET, "--batch_sizes=full,128,512", "--untuned_batch_sizes=512,128"],
            "--untuned_batch_sizes=512,128: 128 is the smallest of --batch_sizes; an untuned "
            "batch takes the choice of the batch before.",
        ),
        ([*TARGET, "--budget_epochs=0"], "--budget_epochs=0.0: must be > 0"),
        ([*TARGET, "--rate_step=1"], "--rate_step=1.0: must be > 1"),
        ([*TARGET, "--warmup_fraction=1"], "--warmup_fraction=1.0: must be in [0, 1)"),
        ([*TARGET, "--max_rate_steps=0"], "--max_rate_steps=0: must be >= 1"),
        ([*TARGET, "--max_budget_doublings=-1"], "--max_budget_doublings=-1: must be >= 0"),
        ([*TARGET, "--noise_scale_batch_size=64"], "--noise_scale_batch_size=64: not one of"),
        ([*TARGET, "--noise_scale_micro_batches=1"], "--noise_scale_micro_batches=1: must be"),
    ],
)
def test_bad_target_study_flags_are_one_line_naming_the_flag(argv, line):
    with pytest.raises(ConfigError) as raised:
        parse(*argv)
    assert str(raised.value).startswith(line), str(raised.value)


def test_a_tiny_target_study_end_to_end_and_its_resume(tmp_path, capsys):
    args = [
        *TARGET,
        "--model=simple_cnn",
        "--image_size=8",
        "--optimizers=lamb",
        "--batch_sizes=64,full",
        "--train_examples=512",
        "--budget_epochs=2",
        "--min_budget_steps=4",
        "--max_rate_steps=1",
        "--max_budget_doublings=0",
        "--seeds=2",
        "--seed_batch_sizes=full",
        "--noise_scale_batch_size=full",
        "--noise_scale_micro_batches=2",
        f"--study_dir={tmp_path}",
    ]
    study = parse(*args)
    rows, trained = batch_study.run_target_study(study)
    # Two batches (the whole set: 512), each 3 rates at their budget T(B) (no
    # budget walk: the simulated runs of test_the_runner_falls_back_... walk
    # it); a seed and the noise-scale run at 512.
    assert len(trained) == len(rows) >= 2 * 3 + 2
    searched = [r for r in rows if r["seed"] == 0 and "noise_scale" not in r]
    assert {r["batch_size"] for r in searched} == {64, 512}
    points = {
        b: {(r["rate_step"], r["budget_step"]): r for r in searched if r["batch_size"] == b}
        for b in (64, 512)
    }
    for b, tried in points.items():  # T(B) = max(4, ceil(2 * 512 / B))
        assert sorted(tried) == [(-1, 0), (0, 0), (1, 0)]
        assert {r["budget_steps"] for r in tried.values()} == {max(4, math.ceil(2 * 512 / b))}
    # The seed and the noise-scale run at 512: its chosen rate and budget, the
    # latter in 2 micro-batches of 256.
    same = points[512][target_search.chosen_point(points[512])]
    (seed,) = [r for r in rows if r["seed"]]
    assert (seed["batch_size"], seed["peak_learning_rate"]) == (512, same["peak_learning_rate"])
    assert seed["budget_steps"] == same["budget_steps"]
    (noise,) = [r for r in rows if "noise_scale" in r]
    assert noise["peak_learning_rate"] == same["peak_learning_rate"]
    assert noise["budget_steps"] == same["budget_steps"]
    assert (noise["reached"], noise["steps"]) == (same["reached"], same["steps"])
    assert noise["noise_scale"] > 0
    noise_scales = read_json(tmp_path / "fit.json")["noise_scales"]
    assert noise_scales["lamb"]["noise_scale"] == noise["noise_scale"]
    assert noise_scales["lamb"]["batch_size"] == 512
    for r in rows:
        assert r["examples"] == r["steps"] * r["batch_size"]
        assert 0 < r["steps"] <= r["budget_steps"]
    table = read_csv(tmp_path / "steps_to_target.csv")
    assert [int(r["batch_size"]) for r in table] == [64, 512]
    for r in table:
        best = points[int(r["batch_size"])][
            target_search.chosen_point(points[int(r["batch_size"])])
        ]
        assert float(r["chosen_rate"]) == best["peak_learning_rate"]
        assert int(r["budget_steps"]) == best["budget_steps"]
    assert read_json(tmp_path / "trials.json")["study"]["target_accuracy"] == 0.8
    assert (tmp_path / "steps_to_target.png").read_bytes()[:4] == b"\x89PNG"
    assert "fits" in read_json(tmp_path / "fit.json")
    # A rerun finds every trial done and trains none.
    store = (tmp_path / "trials.jsonl").read_text()
    capsys.readouterr()
    again, trained = batch_study.run_target_study(parse(*args))
    assert trained == [] and again == rows
    assert (tmp_path / "trials.jsonl").read_text() == store
    out = capsys.readouterr().out
    assert f"study: 0 trial(s) trained, {len(rows)} found done" in out
    # A budget below the fewest steps a smaller batch took is named (budget_warning).
    expected, fewest = [], None
    for batch in (64, 512):
        budget = points[batch][(0, 0)]["budget_steps"]
        expected.append(target_search.budget_warning("lamb", batch, budget, fewest))
        best = points[batch][target_search.chosen_point(points[batch])]
        if best["reached"] and (fewest is None or best["steps"] < fewest[1]):
            fewest = (batch, best["steps"])
    warnings = [line for line in out.splitlines() if line.startswith("warning: lamb")]
    assert warnings and warnings == [line for line in expected if line]


def test_noise_scale_micro_batches_that_do_not_divide_the_batch_are_one_line():
    study = parse(*TARGET, "--batch_sizes=64,full", "--noise_scale_batch_size=full")
    with pytest.raises(ConfigError) as raised:
        target_search.noise_scale_run(study, 1438)  # 1438 = 2 * 719
    assert str(raised.value) == (
        "--noise_scale_micro_batches=8 does not divide the batch 1438 of --noise_scale_batch_size."
    )
    study = parse(*TARGET, "--batch_sizes=64,256", "--noise_scale_batch_size=256")
    assert target_search.noise_scale_run(study, 1438) == (256, 8)
    assert target_search.noise_scale_run(parse(*TARGET), 1438) == (None, 0)


def test_batches_larger_than_the_devices_hold_train_in_micro_batches():
    study = parse(*TARGET, "--max_micro_batch_size=100")
    # The fewest k dividing B with B / k <= 100.
    assert [study.micro_batches(b) for b in (64, 100, 256, 1438, 60000)] == [1, 1, 4, 719, 600]
    assert parse(*TARGET).micro_batches(60000) == 1
    t = target_search.trial(study, "lars", 256, 1.0, 0, 0, 1438)
    assert (t.config.gradient_accumulation_steps, t.config.micro_batch_size) == (4, 64)
    assert t.key != target_search.trial(parse(*TARGET), "lars", 256, 1.0, 0, 0, 1438).key
    cell = batch_study.cell_config(parse("--max_micro_batch_size=100"), "sgd", 512, 0)
    assert cell.gradient_accumulation_steps == 8


def test_a_trial_that_diverges_stops_there_and_is_not_reached(tmp_path, capsys):
    study = parse(
        *TARGET,
        "--model=simple_cnn",
        "--image_size=8",
        "--optimizers=nesterov",
        "--train_examples=512",
        "--budget_epochs=4",
        "--min_budget_steps=4",
        f"--study_dir={tmp_path}",
    )
    t = target_search.trial(study, "nesterov", 64, 1e12, 0, 0, 512)  # budget 32 steps
    assert t.config.stop_on_divergence
    assert t.config.collapse_patience == target_search.COLLAPSE_PATIENCE == 10
    # Stopping there changes no outcome, so the key is the run's to its budget.
    on = dataclasses.replace(
        t.config, stop_on_divergence=False, collapse_patience=0, model_dir=study.study_dir
    )
    assert cell_key(on) == t.key
    record = target_runner.run_trial(t)
    row = record["row"]
    assert (row["reached"], row["steps"], row["examples"]) == (False, 32, 32 * 64)
    out = capsys.readouterr().out
    assert re.search(rf"^  {re.escape(t.name)}: diverged: .*non-finite", out, re.MULTILINE), out
    # It stopped in its first epoch: no evaluation after the divergence.
    assert all(e["step"] < 8 for e in record["evaluations"]), record["evaluations"]
    assert row["best_val_accuracy"] == max(
        (e["val_accuracy"] for e in record["evaluations"]), default=0.0
    )


def test_a_collapsed_trial_is_not_reached_with_the_seconds_and_step_of_its_stop():
    # The tool's summary of a trial that collapsed (tools/train/target.py).
    t = target_search.trial(parse(*TARGET), "nesterov", 64, 0.1, 0, 0, 512)
    stop = {"step": 24, "examples": 24 * 64, "seconds": 12.5, "val_accuracy": 0.1}
    budget = t.config.train_steps
    found = {"reached": False, "steps": budget, "examples": budget * 64, "collapsed": stop}
    evaluations = [{"step": 8, "val_accuracy": 0.6}, stop]
    history = [{"seconds": 10.0}]  # the epochs before the stop's
    summary = {"target": found, "evaluations": evaluations, "history": history}
    row = target_runner.trial_row(t, summary, 20.0)
    assert (row["reached"], row["steps"], row["examples"]) == (False, budget, budget * 64)
    assert (row["seconds"], row["collapsed_step"], row["best_val_accuracy"]) == (12.5, 24, 0.6)
    del found["collapsed"]  # trained on to its budget
    row = target_runner.trial_row(t, summary, 20.0)
    assert row["seconds"] == 10.0 and "collapsed_step" not in row


def test_a_noise_scale_trial_that_diverges_before_its_first_evaluation_is_not_reached():
    # trial_row took the noise scale of the last evaluation: an IndexError.
    study = parse(*TARGET, "--batch_sizes=64,256", "--noise_scale_batch_size=256")
    t = target_search.trial(study, "lars", 256, 1.0, 0, 0, 1438, micro_batches=8)
    assert t.config.noise_scale
    error = Diverged("loss became non-finite at step 2", {"epochs_done": 0, "history": []})
    row = target_runner.trial_row(t, target_runner.diverged_summary(t, error), 3.0)
    budget = t.config.train_steps
    assert (row["reached"], row["steps"], row["examples"]) == (False, budget, budget * 256)
    assert (row["best_val_accuracy"], row["noise_scale_step"]) == (0.0, None)
    assert math.isnan(row["noise_scale"])
    assert target_results.noise_scales([row]) == {
        "lars": {"batch_size": 256, "noise_scale": None, "step": None, "reached": False}
    }
