"""The planner's benchmark (tools/benchmark_plan.py): the study's best
trials as the settings it trains with, the evaluations left out of the
measured time, the planned / measured table and the choices compared, and
one whole run on a tiny study of the digits (8x8, a target every run reaches
at its first evaluation)."""

import dataclasses
import json
import os

import pytest

from keras_lars.tools import benchmark_plan as benchmark
from keras_lars.tools import train
from keras_lars.tools.plan.step import StepTime
from keras_lars.tools.plan.time_to_accuracy import Cell
from keras_lars.tools.settings import ConfigError

TINY = dict(  # the digits' simple CNN, a few steps a run
    model="simple_cnn",
    dataset="digits",
    image_size=8,
    train_examples=256,
    eval_examples=64,
    optimizer="lars",
    lr_scaling="none",
    warmup_epochs=0.0,
    target_accuracy=0.01,
)
# the tiny study's choice at each batch: (peak rate, schedule steps, mean steps to the target)
CHOSEN = {32: (0.5, 8, 4.0), 64: (1.0, 4, 2.0), 128: (1.0, 2, 1.0)}


def trial(batch, rate, budget, seed=0, **config):
    """A trials.jsonl record of the tiny study."""
    settings = dict(TINY, global_batch_size=batch, base_learning_rate=rate, seed=seed)
    settings.update(train_steps=budget, eval_every_steps=max(1, budget // 4), **config)
    stored = dataclasses.asdict(train.Config(**settings, model_dir="study/trials/x"))
    row = dict(
        optimizer="lars",
        batch_size=batch,
        seed=seed,
        peak_learning_rate=rate,
        budget_steps=budget,
    )
    return {"config": stored, "row": row}


def write_study(directory, trials):
    """The tiny study's fit.json, steps_to_target.json and trials.jsonl."""
    os.makedirs(directory, exist_ok=True)
    study = dict(
        mode="steps_to_target",
        target_accuracy=TINY["target_accuracy"],
        model="simple_cnn",
        dataset="digits",
        image_size=8,
        train_examples=256,
        optimizers=["lars"],
    )
    fit = {"lars": {"s_min": 0.5, "e_min": 100.0, "b_crit": 200.0, "batches": sorted(CHOSEN)}}
    rows = [
        dict(
            optimizer="lars",
            batch_size=b,
            chosen_rate=rate,
            budget_steps=budget,
            steps_mean=steps,
            tuned=True,
        )
        for b, (rate, budget, steps) in CHOSEN.items()
    ]
    with open(os.path.join(directory, "fit.json"), "w") as f:
        json.dump({"study": study, "fits": fit}, f)
    with open(os.path.join(directory, "steps_to_target.json"), "w") as f:
        json.dump({"study": study, "rows": rows}, f)
    with open(os.path.join(directory, "trials.jsonl"), "w") as f:
        f.writelines(json.dumps(t) + "\n" for t in trials)
    return str(directory)


def chosen_trials():
    return [trial(b, rate, budget) for b, (rate, budget, _) in CHOSEN.items()]


def test_the_settings_are_the_study_best_trials_seed_zero(tmp_path):
    others = [
        trial(64, 2.0, 4),  # another rate the search tried
        trial(64, 1.0, 8),  # another schedule length
        trial(64, 1.0, 4, seed=1),  # another seed
        trial(64, 1.0, 4, noise_scale=True, gradient_accumulation_steps=2),  # the noise run
    ]
    study = write_study(tmp_path / "study", [*others, *chosen_trials()])
    found = benchmark.best_trials(study, "lars", (64, 128))
    assert sorted(found) == [64, 128]
    assert [found[64][k] for k in ("base_learning_rate", "train_steps", "seed")] == [1.0, 4, 0]
    assert found[64]["noise_scale"] is False and found[128]["train_steps"] == 2
    config = benchmark.study_config(found[64], str(tmp_path / "run"), seed=3)
    assert config.model_dir == str(tmp_path / "run")
    assert (config.seed, config.global_batch_size, config.base_learning_rate) == (3, 64, 1.0)


def test_a_batch_without_settings_is_one_line(tmp_path):
    study = write_study(tmp_path / "study", chosen_trials()[:2])
    with pytest.raises(ConfigError) as raised:
        benchmark.best_trials(study, "lars", (256,))
    assert str(raised.value) == (
        f"--study={study}: lars tuned no rate at batch 256 (it tuned 32, 64, 128): no settings "
        "to train it with."
    )
    with pytest.raises(ConfigError) as raised:
        benchmark.best_trials(study, "lars", (64, 128))
    assert str(raised.value) == (
        f"--study={study}: trials.jsonl has no seed-0 trial of lars at the chosen settings of "
        "batch 128 (peak rate 1 over 2 steps)."
    )
    stored = dict(chosen_trials()[0]["config"], retired_flag=1)
    with pytest.raises(ConfigError, match=r"^trials.jsonl: config.retired_flag: not a setting"):
        benchmark.study_config(stored, "run")


def test_settings_refuse_the_calibration_batch_among_the_others():
    with pytest.raises(ConfigError, match=r"--batches=64,256: must not hold --calibration_batch"):
        benchmark.BenchmarkSettings(batches="64,256")
    with pytest.raises(ConfigError, match=r"--batches=64,x: must be global batches"):
        benchmark.BenchmarkSettings(batches="64,x")


def test_the_measured_time_leaves_out_the_evaluations_up_to_the_target():
    # Two evaluations to the target took 5 s of its 30 (the test split's
    # after it is in neither count).
    summary = {"target": {"reached": True, "step": 40, "seconds": 30.0, "evaluation_seconds": 5.0}}
    found = benchmark.measured(summary)
    assert (found.steps, found.seconds, found.evaluation_seconds, found.step) == (
        40,
        25.0,
        5.0,
        0.625,
    )
    history = [{"evaluation_seconds": 1.0}, {"evaluation_seconds": 2.0}]
    missed = benchmark.measured({"target": {"reached": False}, "history": history})
    assert missed.steps is None and missed.evaluation_seconds == 3.0


def planned_cell(batch, steps, step_seconds):
    return Cell(batch, 1, steps, StepTime(step_seconds, 0.0, 0.0, 0.0), measured=True)


def test_the_table_compares_planned_and_measured_and_the_choices():
    cells = {64: planned_cell(64, 1000, 0.1), 1024: planned_cell(1024, 200, 1.0)}
    runs = {
        64: benchmark.Measured(1100, 110.0, 4.0),  # 100 s planned: 0.91
        1024: benchmark.Measured(250, 150.0, 30.0),  # 200 s planned: 1.33
    }
    lines, met = benchmark.comparison(cells, runs)
    assert lines == [
        "  batch  steps planned  measured  step planned  measured  time planned  measured"
        "  planned/measured  evaluations",
        "     64          1,000     1,100      100.0 ms  100.0 ms         100 s     110 s"
        "              0.91          4 s",
        "  1,024            200       250    1,000.0 ms  600.0 ms       3.3 min   2.5 min"
        "    1.33 (outside)         30 s",
        "fastest   planned batch 64, measured batch 64: the same",
        "cheapest  planned batch 64, measured batch 64: the same",
        "goal: planned / measured within 0.75..1.25 at every batch and the same choices: not met",
    ]
    runs[1024] = benchmark.Measured(250, 190.0, 30.0)  # 1.05
    assert benchmark.comparison(cells, runs)[1] is True
    runs[64] = benchmark.Measured(1100, 200.0, 4.0)  # 0.5, and 1,024 is faster
    lines, met = benchmark.comparison(cells, runs)
    assert lines[-3:] == [
        "fastest   planned batch 64, measured batch 1,024: differ",
        "cheapest  planned batch 64, measured batch 1,024: differ",
        "goal: planned / measured within 0.75..1.25 at every batch and the same choices: not met",
    ]
    # the machine ran 1.6x faster before 1,024's run than at the short run: the plan made there
    # is 1.6x shorter, 200 / 1.6 = 125 s against 190 measured: 0.66
    lines, met = benchmark.comparison(cells, runs, speeds={64: 1.0, 1024: 1.6})
    assert [line.split()[-1] for line in lines[:3]] == ["probe", "0.50", "0.66"]
    assert lines[-2] == (
        "from the probe: planned / measured of the plan made from the short run repeated just "
        "before that batch's run; the machine's speed then: 1.00 x at 64, 1.60 x at 1,024"
    )
    runs[64] = benchmark.Measured(None, float("nan"), 9.0)
    lines, met = benchmark.comparison(cells, runs)
    assert lines[1].split() == ["64", "1,000", "not", "reached", "-", "-", "-", "-", "-", "9", "s"]
    assert lines[-3] == "fastest   planned batch 64, measured batch 1,024: differ" and not met


def test_a_whole_run_on_a_tiny_study(tmp_path):
    study = write_study(tmp_path / "study", chosen_trials())
    options = benchmark.BenchmarkSettings(
        study=study, calibration_batch=64, calibration_steps=10, batches="128"
    )
    said = []
    benchmark.benchmark(options, str(tmp_path / "runs"), say=said.append)
    text = "\n".join(said)
    assert said[0] == "(1) 10 steps at batch 64, no evaluation ..."
    assert sum(line.startswith("(3) the short run again: ") for line in said) == 1
    assert "step      simple_cnn at 8, measured (--from_run): " in text  # the planner's report
    assert "(3) batch 128 to 0.01: peak rate 1 over 2 steps, seed 0" in text
    assert "    reached at step 1: " in text
    table = said[said.index("(4) planned / measured time to the target, one device:") + 1]
    assert table.splitlines()[1].split()[:3] == ["128", "1", "1"]
    assert table.splitlines()[0].endswith("from the probe")
    assert table.splitlines()[-1].startswith("goal: planned / measured within 0.75..1.25")
