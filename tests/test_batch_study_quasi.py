"""The steps-to-target mode's quasi-random search (--search=quasi_random:
tools/batch_study/quasi_search.py, quasi_results.py): the search space, the
evaluation interval, the plan with its seeds, Shallue's statistic beside the
seeds' mean, the robustness table and the protocol recorded with the store.
Trials are simulated (no training)."""

import json
import math
import os
import shutil

import pytest
from scipy.stats import qmc

from keras_lars.tools import batch_study
from keras_lars.tools.batch_study import noise_along
from keras_lars.tools.batch_study import quasi_results
from keras_lars.tools.batch_study import quasi_search
from keras_lars.tools.batch_study import target_runner
from keras_lars.tools.batch_study import target_search
from keras_lars.tools.settings import ConfigError
from keras_lars.tools.train import build
from keras_lars.tools.train import saved_weights
from tests.test_batch_study import parse
from tests.test_batch_study import read_csv
from tests.test_batch_study import read_json
from tests.test_batch_study_target import without_plots

QUASI = [
    "--mode=steps_to_target",
    "--target_accuracy=0.8",
    "--search=quasi_random",
    "--model=simple_cnn",
    "--image_size=8",
    "--train_examples=512",
    "--budget_epochs=5",
    "--min_budget_steps=20",
]


def assert_each_refused_leaving_the_store(study_dir, cases):
    """Each (argv, start, stored) of `cases`, run on the store in `study_dir`:
    one ConfigError line that starts with `start` and names the stored
    setting `stored`; the store is left byte for byte."""
    store = (study_dir / "trials.jsonl").read_bytes()
    for argv, start, stored in cases:
        with pytest.raises(ConfigError) as raised:
            batch_study.run_target_study(parse(*argv, f"--study_dir={study_dir}"))
        line = str(raised.value)
        assert line.startswith(start) and stored in line and "\n" not in line, line
    assert (study_dir / "trials.jsonl").read_bytes() == store


def test_each_trial_maps_its_halton_point_onto_the_search_space():
    study = parse(
        *QUASI,
        "--trials=8",
        "--rate_range=0.5,2",
        "--one_minus_momentum_range=0.01,0.1",
        "--warmup_fraction_range=0,0.2",
        "--budget_range=1,4",
        "--search_seed=3",
    )
    u = qmc.Halton(d=4, scramble=True, seed=3).random(8)
    for optimizer, batch in (("lars", 64), ("lamb", 128)):
        rule = target_search.rule_rate(study, optimizer, batch)
        base = target_search.budget_steps(study.search, batch, 512)  # T(B)
        for i in range(8):
            t = quasi_search.quasi_trial(study, optimizer, batch, i, 0, 512)
            c = t.config
            assert c.peak_learning_rate == pytest.approx(rule * 0.5 * 4 ** u[i, 0])
            assert 1 - c.momentum == pytest.approx(0.01 * 10 ** u[i, 1])
            assert c.train_steps == math.ceil(base * 4 ** u[i, 3])
            assert c.warmup_epochs == pytest.approx(0.2 * u[i, 2] * c.train_steps / (512 // batch))
            assert t.settings_row == {
                "trial": i,
                "momentum": c.momentum,
                "warmup_fraction": pytest.approx(0.2 * u[i, 2]),
            }
            assert c.eval_every_steps == max(1, math.floor(0.02 * 512 / batch))
    # The ends of a log range and its middle: the geometric mean.
    search = study.search
    assert quasi_search.along(search, "rate_range", 0.0) == 0.5
    assert quasi_search.along(search, "rate_range", 0.5) == pytest.approx(1.0)
    assert quasi_search.along(search, "warmup_fraction_range", 0.5) == pytest.approx(0.1)
    # Seeds share the point, not the key.
    seeds = {quasi_search.quasi_trial(study, "lars", 64, 2, s, 512) for s in (0, 1)}
    assert len({t.key for t in seeds}) == 2
    assert len({t.config.peak_learning_rate for t in seeds}) == 1


def test_the_evaluation_interval_is_a_fraction_of_the_fewest_examples_to_the_target():
    # Fashion-MNIST's 55,000 after a 5,000 validation split, floor one epoch.
    search = parse(*QUASI).search
    intervals = [quasi_search.eval_interval(search, b, 55000) for b in (64, 256, 1024, 4096)]
    assert intervals == [17, 4, 1, 1]
    floored = parse(*QUASI, "--target_examples_floor=100000", "--eval_fraction=0.01").search
    assert quasi_search.eval_interval(floored, 64, 55000) == 15


def quasi_run(steps_of, evaluations_of=None):
    """A stand-in for target_runner.run_trial: trial t reaches the goal in
    steps_of(t) steps (None: missed at accuracy 0.5), its evaluations every
    10 steps rising by 0.01 to the goal's 0.8."""

    def run_trial(t):
        steps = steps_of(t)
        reached = steps is not None
        last = steps if reached else t.config.train_steps
        evaluations = [
            {"step": s, "val_accuracy": 0.8 - 0.01 * (last - s) / 10}
            for s in range(10, last + 1, 10)
        ]
        if not reached:
            evaluations = [dict(e, val_accuracy=0.5) for e in evaluations]
        target = {
            "reached": reached,
            "step": steps,
            "steps": t.config.train_steps,
            "examples": t.batch_size * (steps if reached else t.config.train_steps),
            "seconds": 1.0,
            "test_accuracy": 0.7,
        }
        summary = {"target": target, "evaluations": evaluations, "history": []}
        row = target_runner.trial_row(t, summary, 1.0)
        return {"key": t.key, "row": row, "evaluations": evaluations}

    return run_trial


def test_the_search_seeds_its_best_trial_and_reports_shallues_statistic_beside(
    tmp_path, monkeypatch
):
    # Trial i reaches the goal in 100 - 10 i steps at batch 64 (the last, 3,
    # the best; half the trials: 0 and 1, best 90), halved at batch 128; lamb
    # misses with trial 3 and is slower.
    def steps_of(t):
        if t.optimizer == "lamb" and t.rate_step == 3:
            return None
        steps = (100 - 10 * t.rate_step) * 64 // t.batch_size + (20 if t.optimizer == "lamb" else 0)
        return steps + 10 * t.seed  # the seeds: slower than the search's winner

    monkeypatch.setattr(target_runner, "run_trial", quasi_run(steps_of))
    without_plots(monkeypatch)
    args = [
        *QUASI,
        "--optimizers=lars,lamb",
        "--batch_sizes=64,128",
        "--trials=4",
        "--seeds=2",
        "--robustness_targets=0.78,0.75",
        f"--study_dir={tmp_path}",
    ]
    rows, trained = batch_study.run_target_study(parse(*args))
    assert len(rows) == len(trained) == 2 * 2 * (4 + 2)
    seeds = [(r["optimizer"], r["batch_size"], r["trial"], r["seed"]) for r in rows if r["seed"]]
    assert seeds == [
        (o, b, best, s) for b in (64, 128) for o, best in (("lars", 3), ("lamb", 2)) for s in (1, 2)
    ]
    table = {
        (r["optimizer"], int(r["batch_size"])): r
        for r in read_csv(tmp_path / "steps_to_target.csv")
    }
    lars = table[("lars", 64)]
    assert (lars["best_trial"], lars["steps_shallue"], lars["steps_shallue_half"]) == (
        "3",
        "70",
        "90",
    )
    assert (lars["seeds"], lars["seeds_reached"], float(lars["steps_mean"])) == ("2", "2", 85.0)
    assert (lars["trials"], lars["trials_reached"], lars["test_accuracy"]) == ("4", "4", "0.7")
    assert float(lars["eval_fraction_of_steps"]) == pytest.approx(
        quasi_search.eval_interval(parse(*args).search, 64, 512) / 70
    )
    lamb = table[("lamb", 128)]
    assert (lamb["best_trial"], lamb["trials_reached"], lamb["steps_shallue"]) == ("2", "3", "60")
    fit = read_json(tmp_path / "fit.json")
    assert fit["rankings"] == [
        {"batch_size": 64, "all": ["lars", "lamb"], "half": ["lars", "lamb"], "same": True},
        {"batch_size": 128, "all": ["lars", "lamb"], "half": ["lars", "lamb"], "same": True},
    ]
    assert fit["study"]["search"] == "quasi_random" and fit["study"]["trials"] == 4
    # Robustness: at 0.75 every trial got there 50 steps (5 evaluations) sooner.
    robust = {
        (float(r["target_accuracy"]), r["optimizer"]): r
        for r in read_csv(tmp_path / "robustness.csv")
    }
    assert sorted(robust) == sorted((t, o) for t in (0.75, 0.78, 0.8) for o in ("lars", "lamb"))
    found = quasi_results.robustness_markdown(read_json(tmp_path / "robustness.json")["rows"])
    assert (
        found.splitlines()[0] == "| target | LARS S_min | LARS B_crit | LAMB S_min | LAMB B_crit |"
    )
    assert [line.split(" | ")[0] for line in found.splitlines()[2:]] == [
        "| 0.75",
        "| 0.78",
        "| 0.8",
    ]
    # A rerun trains nothing; more trials reuse the stored ones.
    assert batch_study.run_target_study(parse(*args))[1] == []
    # Five trials: the first four are the stored ones (the sequence's first
    # points); trial 4 is the best everywhere now, and its seeds run.
    args = [a for a in args if a != "--trials=4"] + ["--trials=5"]
    rows, more = batch_study.run_target_study(parse(*args))
    trained = [r for r in rows if r["key"] in set(more)]
    assert sorted((r["trial"], r["seed"]) for r in trained) == sorted(
        [(4, 0)] * 4 + [(4, 1)] * 4 + [(4, 2)] * 4
    )


def test_robustness_takes_the_first_evaluation_at_each_target():
    evaluations = [{"step": 10, "val_accuracy": 0.5}, {"step": 20, "val_accuracy": 0.79}]
    assert quasi_results.steps_to(evaluations, 0.79) == 20
    assert quasi_results.steps_to(evaluations, 0.5) == 10
    assert quasi_results.steps_to(evaluations, 0.8) is None


def test_a_store_of_another_protocol_is_refused_in_one_line_and_left_as_it_is(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(target_runner, "run_trial", quasi_run(lambda t: 50))
    without_plots(monkeypatch)
    args = [*QUASI, "--optimizers=lars", "--batch_sizes=64", "--trials=2", "--seeds=1"]
    batch_study.run_target_study(parse(*args, f"--study_dir={tmp_path / 'quasi'}"))
    recorded = json.loads((tmp_path / "quasi" / "protocol.json").read_text())
    assert recorded["search"] == "quasi_random" and recorded["validation_examples"] == 0
    cases = [
        (
            [a for a in args if a != "--search=quasi_random" and a != "--trials=2"],
            "--search=grid: the store",
            "(--search=quasi_random)",
        ),
        ([*args, "--validation_examples=100"], "--validation_examples=100: the store", "=0)"),
        (
            [*args, "--rate_range=0.2,5"],
            "--rate_range=0.2,5.0: the store",
            "(--rate_range=0.1,10.0)",
        ),
    ]
    assert_each_refused_leaving_the_store(tmp_path / "quasi", cases)
    # A store without protocol.json is the grid's on the test split (the committed study's).
    old = tmp_path / "old"
    old.mkdir()
    shutil.copy("docs/batch_study/fashion_mnist_steps/trials.jsonl", old / "trials.jsonl")
    before = sorted(p.name for p in old.iterdir())
    with pytest.raises(
        ConfigError, match=r"^--search=quasi_random: the store .* \(--search=grid\)"
    ):
        batch_study.run_target_study(parse(*args, f"--study_dir={old}"))
    assert sorted(p.name for p in old.iterdir()) == before
    # A search space whose low rate is below the end rate: refused before any trial.
    low = [*args, "--optimizers=adam", f"--study_dir={tmp_path / 'low'}"]
    with pytest.raises(ConfigError) as raised:
        batch_study.run_target_study(parse(*low))
    assert str(raised.value) == (
        "--rate_range=0.1,10: its low end gives adam at batch 64 the peak rate 5e-05, below "
        "--end_learning_rate=0.0001; raise the range or the optimizer's --base_learning_rates, "
        "or lower --end_learning_rate."
    )
    assert not (tmp_path / "low").exists()


@pytest.mark.parametrize(
    "argv, line",
    [
        (["--rate_range=2,2"], "--rate_range=2,2: an empty range: give low < high."),
        (["--budget_range=3,1"], "--budget_range=3,1: an empty range: give low < high."),
        (["--rate_range=0,2"], "--rate_range=0,2: both ends must be > 0."),
        (["--rate_range=1"], "--rate_range=1: expected two numbers, low,high."),
        (
            ["--one_minus_momentum_range=0.1,2"],
            "--one_minus_momentum_range=0.1,2: both ends must be in (0, 1].",
        ),
        (
            ["--warmup_fraction_range=0.1,1"],
            "--warmup_fraction_range=0.1,1: both ends must be in [0, 1).",
        ),
        (["--trials=1"], "--trials=1: must be >= 2."),
        (["--noise_batch_sizes=64"], "--noise_batch_sizes=64: 64 is not one of --batch_sizes="),
        (["--noise_fractions=0,1.5"], "--noise_fractions=0,1.5: 1.5 is not a fraction in [0, 1]."),
        (["--noise_groups=1"], "--noise_groups=1: must be >= 2."),
        (["--eval_fraction=0"], "--eval_fraction=0.0: must be in (0, 1]."),
        (["--momentum=0.8"], "--momentum: --search=quasi_random searches it per trial"),
        (["--rate_step=3"], "--rate_step: belongs to --search=grid, not --search=quasi_random."),
        (["--robustness_targets=0.85"], "--robustness_targets=0.85: 0.85 is not below"),
        (["--robustness_targets=x"], "--robustness_targets=x: 'x' is not a number."),
    ],
)
def test_bad_quasi_random_flags_are_one_line_naming_the_flag(argv, line):
    with pytest.raises(ConfigError) as raised:
        parse(*QUASI, *argv)
    assert str(raised.value).startswith(line), str(raised.value)
    with pytest.raises(ConfigError, match=r"^--trials: belongs to --search=quasi_random"):
        parse(*[a for a in QUASI if a != "--search=quasi_random"], "--trials=4")


def test_the_noise_scale_is_measured_at_fixed_weights_along_the_best_run(tmp_path, monkeypatch):
    # Trial i reaches the goal in 40 + 10 i steps: trial 0 is the best (40
    # steps), so its rerun saves weights at 0, 10, 20 and 40 steps. The rerun
    # is simulated (a fresh model's weights, the same at every point); the
    # measurement is real.
    monkeypatch.setattr(target_runner, "run_trial", quasi_run(lambda t: 40 + 10 * t.rate_step))
    without_plots(monkeypatch)
    reruns = []

    def train_weights(t, steps):
        reruns.append((t.optimizer, t.batch_size, t.rate_step, t.seed, sorted(steps)))
        directory = f"{t.config.model_dir}-weights"
        model = build.create_model(t.config, 10)
        for step in steps:
            path = saved_weights.weights_path(directory, step)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            model.save_weights(path)
        return directory

    monkeypatch.setattr(noise_along, "train_weights", train_weights)
    args = [
        *QUASI,
        "--optimizers=lars",
        "--batch_sizes=64,128",
        "--trials=2",
        "--seeds=1",
        "--noise_batch_sizes=128",
        "--noise_fractions=0,0.25,0.5,1",
        "--noise_micro_batch_size=4",
        "--noise_micro_batches=2",
        "--noise_groups=3",
        f"--study_dir={tmp_path}",
    ]
    batch_study.run_target_study(parse(*args))
    assert reruns == [("lars", 128, 0, 0, [0, 10, 20, 40])]
    found = read_csv(tmp_path / "noise_scales.csv")
    assert [(r["fraction"], r["step"], r["steps_to_goal"]) for r in found] == [
        ("0.0", "0", "40"),
        ("0.25", "10", "40"),
        ("0.5", "20", "40"),
        ("1.0", "40", "40"),
    ]
    for r in found:
        assert (r["small_batch"], r["big_batch"], r["groups"]) == ("4", "8", "3")
        low, scale, high = (float(r[k]) for k in ("low", "noise_scale", "high"))
        assert low < scale < high and scale == pytest.approx(
            float(r["trace"]) / float(r["gradient_sq"])
        )
    # Each point draws its own examples (seed: the step), at the same weights here.
    assert len({r["noise_scale"] for r in found}) == 4
    # A rerun measures nothing again.
    reruns.clear()
    batch_study.run_target_study(parse(*args))
    assert reruns == [] and read_csv(tmp_path / "noise_scales.csv") == found


def test_a_tiny_quasi_random_study_trains_end_to_end(tmp_path):
    # Real trials of Adam on 256 digits at 8x8 with 64 more held out as the
    # validation split: two trials, a seed at the best and its rerun with the
    # noise scale.
    # A goal below chance: every trial reaches it at its first evaluation.
    args = [
        *QUASI,
        "--target_accuracy=0.01",
        "--optimizers=adam",
        "--end_learning_rate=0.00001",
        "--batch_sizes=64",
        "--train_examples=256",
        "--eval_examples=64",
        "--validation_examples=64",
        "--budget_epochs=2",
        "--min_budget_steps=4",
        "--trials=2",
        "--seeds=1",
        "--noise_batch_sizes=64",
        "--noise_fractions=0,1",
        "--noise_micro_batch_size=4",
        "--noise_micro_batches=2",
        "--noise_groups=2",
        f"--study_dir={tmp_path}",
    ]
    rows, trained = batch_study.run_target_study(parse(*args))
    search = [r for r in rows if r["seed"] == 0]
    assert len(search) == 2 and len(trained) == len(rows)
    for r in rows:
        assert r["eval_every_steps"] == 1  # floor(0.02 * 256 / 64) = 0: every step
        assert (r["reached"], r["steps"]) == (True, 1) and 0 <= r["test_accuracy"] <= 1
    assert [r["seed"] for r in rows] == [0, 0, 1]
    noise = read_csv(tmp_path / "noise_scales.csv")
    assert [(r["trial"], r["fraction"], r["step"]) for r in noise] == [
        ("0", "0.0", "0"),
        ("0", "1.0", "1"),
    ]
    assert sorted(p.name for p in tmp_path.glob("trials/*-weights/weights/*")) == [
        "step-000000.weights.h5",
        "step-000001.weights.h5",
    ]
    header = read_json(tmp_path / "trials.json")["study"]
    assert (header["validation_examples"], header["train_examples"]) == (64, 256)
    assert (tmp_path / "steps_to_target.png").read_bytes()[:4] == b"\x89PNG"
