"""The adaptive arm of the steps-to-target study (--search=quasi_random with
--adaptive_batch: tools/batch_study/adaptive_arm.py): its examples to the
target, the fixed batch of the same steps, its flags and protocol, a
simulated study beside a fixed-batch one (--compare_study) and a tiny one
that trains."""

import json
import os

import pytest
from absl import flags

from keras_lars.tools import batch_study
from keras_lars.tools import train
from keras_lars.tools.batch_study import adaptive_arm
from keras_lars.tools.batch_study import quasi_search
from keras_lars.tools.batch_study import target_runner
from keras_lars.tools.settings import ConfigError
from tests.test_batch_study import parse
from tests.test_batch_study import read_csv
from tests.test_batch_study import read_json
from tests.test_batch_study_quasi import QUASI
from tests.test_batch_study_quasi import assert_each_refused_leaving_the_store

ADAPTIVE = [*QUASI, "--adaptive_batch=adascale", "--adaptive_batch_max=256", "--batch_sizes=32,64"]


def test_examples_to_the_target_sum_each_batch_over_its_steps():
    # Batch 32 for updates 1-10, 64 for 11-25 (decided at step 10), 128 after step 25.
    decisions = [{"step": 10, "batch_size": 64}, {"step": 25, "batch_size": 128}]
    assert adaptive_arm.examples_to(30, 32, decisions) == 32 * 10 + 64 * 15 + 128 * 5 == 1920
    assert adaptive_arm.examples_to(10, 32, decisions) == 320
    assert adaptive_arm.examples_to(11, 32, decisions) == 384
    assert adaptive_arm.examples_to(7, 32, []) == 224
    assert [adaptive_arm.batch_at(s, 32, decisions) for s in (10, 11, 25, 26)] == [32, 64, 64, 128]


def test_the_fixed_batch_of_the_same_steps_follows_the_fit():
    # S_min 100, E_min 51,200 (B_crit 512): 150 steps take B = 512 / (1.5 - 1) = 1,024.
    assert adaptive_arm.same_steps(150, 100, 51200) == (1024, 153600)
    assert adaptive_arm.same_steps(400, 100, 51200) == pytest.approx((512 / 3, 400 * 512 / 3))
    # At S_min or below: fewer steps than any fixed batch; no E_min: every batch takes S_min.
    assert adaptive_arm.same_steps(100, 100, 51200) == (None, None)
    assert adaptive_arm.same_steps(90, 100, 51200) == (None, None)
    assert adaptive_arm.same_steps(150, 100, 0) == (None, None)


def test_a_trial_searches_the_fixed_arms_point_with_its_budget_in_epochs():
    study = parse(*ADAPTIVE, "--batch_sizes=64", "--noise_scale_micro_batches=4")
    fixed = parse(*QUASI, "--batch_sizes=64")
    for i in range(4):
        t = adaptive_arm.adaptive_trial(study, "lars", 64, i, 0, 512)
        f = quasi_search.quasi_trial(fixed, "lars", 64, i, 0, 512)
        c = t.config
        assert (c.peak_learning_rate, c.momentum) == (
            f.config.peak_learning_rate,
            f.config.momentum,
        )
        # The fixed arm's budget at the start batch, in whole epochs of 512 / 64 = 8 steps.
        assert c.train_steps == 0 and c.train_epochs == -(-f.config.train_steps // 8)
        assert c.warmup_epochs == pytest.approx(
            dict(t.searched)["warmup_fraction"] * c.train_epochs
        )
        assert (c.adaptive_batch, c.adaptive_batch_max, c.gradient_accumulation_steps) == (
            "adascale",
            256,
            4,
        )
        # Every max(1, floor(0.02 * 512 / 256)) steps: bounded by the largest batch.
        assert c.eval_every_steps == 1
    floored = parse(*ADAPTIVE, "--target_examples_floor=100000").search
    assert adaptive_arm.eval_interval(floored, 512) == 7  # floor(0.02 * 100,000 / 256)


def test_the_adaptive_flags_are_the_training_tools():
    flag_values = flags.FlagValues()
    batch_study.define_flags(flag_values)
    for field in train.Config.__dataclass_fields__.values():
        if field.name.startswith("adaptive"):
            assert flag_values[field.name].default == field.default
            assert flag_values[field.name].help.endswith(field.metadata["help"])
    recorded = parse(*ADAPTIVE, "--adaptive_batch_growth=4").search.protocol(parse(*QUASI).shared)
    assert {k: v for k, v in recorded.items() if k.startswith("adaptive")} == {
        "adaptive_batch": "adascale",
        "adaptive_batch_every_epochs": 1,
        "adaptive_batch_min": 0,
        "adaptive_batch_max": 256,
        "adaptive_batch_growth": 4.0,
        "adaptive_batch_target": 1.0,
    }


@pytest.mark.parametrize(
    "argv, line",
    [
        (
            [*ADAPTIVE, "--adaptive_batch_max=32"],
            "--adaptive_batch_max=32 is below the start batch 64 of --batch_sizes=32,64.",
        ),
        ([*ADAPTIVE, "--adaptive_batch_growth=1"], "--adaptive_batch_growth=1.0: must be > 1."),
        ([*ADAPTIVE, "--adaptive_batch_target=0"], "--adaptive_batch_target=0.0: must be > 0."),
        (
            [*ADAPTIVE, "--adaptive_batch_min=64"],
            "--adaptive_batch_min=64 is above the start batch 32 of --batch_sizes=32,64.",
        ),
        (
            [*QUASI, "--adaptive_batch=sqrt", "--batch_sizes=64"],
            "--adaptive_batch=sqrt: needs --adaptive_batch_max",
        ),
        ([*QUASI, "--adaptive_batch_max=256"], "--adaptive_batch_max: belongs to the adaptive arm"),
        ([*QUASI, "--compare_study=x"], "--compare_study: belongs to the adaptive arm"),
        (
            [a for a in ADAPTIVE if a != "--search=quasi_random"],
            "--adaptive_batch=adascale: the adaptive arm runs in --mode=steps_to_target "
            "--search=quasi_random",
        ),
        ([*ADAPTIVE, "--batch_sizes=64,full"], "--batch_sizes=64,full: the adaptive arm starts"),
        (
            [*ADAPTIVE, "--noise_scale_micro_batches=3"],
            "--noise_scale_micro_batches=3 does not divide 32 (of --batch_sizes=32,64",
        ),
        (
            [*ADAPTIVE, "--max_micro_batch_size=16"],
            "--max_micro_batch_size=16: the adaptive arm's micro-batch reaches 32 images",
        ),
        ([*ADAPTIVE, "--noise_batch_sizes=64"], "--noise_batch_sizes: belongs to the fixed-batch"),
    ],
)
def test_bad_adaptive_flags_are_one_line_naming_the_flag(argv, line):
    with pytest.raises(ConfigError) as raised:
        parse(*argv)
    assert str(raised.value).startswith(line) and "\n" not in str(raised.value), str(raised.value)


def simulated(t):
    """A stand-in for target_runner.run_trial: a search trial i reaches the
    goal in 40 - 5 i steps (LAMB 10 more), seed s 2 s later; the batch
    doubles at step 10; evaluations every step."""
    steps = 40 - 5 * t.rate_step + (10 if t.optimizer == "lamb" else 0) + 2 * t.seed
    decisions = [{"step": 10, "batch_size": 2 * t.batch_size, "noise_scale": 300.0}]
    evaluations = [
        {"step": s, "val_accuracy": 0.8 - 0.01 * (steps - s)} for s in range(1, steps + 1)
    ]
    target = {"reached": True, "step": steps, "examples": steps * t.batch_size, "seconds": 2.0}
    summary = {"target": target, "evaluations": evaluations, "history": []}
    summary["adaptive_batch"] = decisions
    row = target_runner.trial_row(t, summary, 1.0)
    return {"key": t.key, "row": row, "evaluations": evaluations, "adaptive_batch": decisions}


def fixed_study(directory, fits, rows=()):
    """A fixed-batch study's fit.json (and steps_to_target.json with `rows`) in `directory`."""
    os.makedirs(directory, exist_ok=True)
    header = {
        "target_accuracy": 0.8,
        "validation_examples": 0,
        "validation_seed": 0,
        "dataset": "digits",
        "model": "simple_cnn",
    }
    with open(os.path.join(directory, "fit.json"), "w") as f:
        json.dump({"study": header, "fits": fits}, f)
    with open(os.path.join(directory, "steps_to_target.json"), "w") as f:
        json.dump({"study": header, "rows": list(rows)}, f)


def measured(batch, steps, reached=3):
    return {
        "optimizer": "lars",
        "batch_size": batch,
        "seeds": 3,
        "seeds_reached": reached,
        "steps_mean": steps,
        "examples_mean": steps * batch,
        "seconds_mean": 1.5,
    }


def test_the_arm_seeds_its_best_trial_and_compares_with_the_fixed_batch_of_its_steps(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(target_runner, "run_trial", simulated)
    # LARS: S_min 20, B_crit 256; LAMB: S_min 50, above the arm's 44 steps.
    fits = {
        "lars": {"s_min": 20.0, "e_min": 5120.0, "b_crit": 256.0, "batches": [64, 256, 1024]},
        "lamb": {"s_min": 50.0, "e_min": 1000.0, "b_crit": 20.0, "batches": [64, 256, 1024]},
    }
    rows = [measured(256, 40.0), measured(1024, 25.0), measured(4096, 22.0, reached=2)]
    fixed_study(tmp_path / "fixed", fits, rows)
    args = [
        *ADAPTIVE,
        "--optimizers=lars,lamb",
        "--batch_sizes=64",
        "--trials=3",
        "--seeds=3",
        f"--compare_study={tmp_path / 'fixed'}",
        f"--study_dir={tmp_path / 'adaptive'}",
    ]
    found, trained = batch_study.run_target_study(parse(*args))
    assert len(found) == len(trained) == 2 * (3 + 3)
    lars_best = [r for r in found if r["optimizer"] == "lars" and r["trial"] == 2]
    # Seeds 1-3 at the best trial: 32, 34, 36 steps; 64 x 10 + 128 x (S - 10) examples.
    assert [(r["seed"], r["steps"], r["examples"]) for r in lars_best] == [
        (0, 30, 3200),
        (1, 32, 3456),
        (2, 34, 3712),
        (3, 36, 3968),
    ]
    assert {(r["budget_steps"], r["batch_at_target"], r["decisions"]) for r in lars_best} == {
        (None, 128, 1)
    }
    table = {r["optimizer"]: r for r in read_csv(tmp_path / "adaptive" / "steps_to_target.csv")}
    assert (table["lars"]["best_trial"], table["lars"]["steps_shallue"]) == ("2", "30")
    assert (float(table["lars"]["steps_mean"]), float(table["lars"]["examples_mean"])) == (34, 3712)
    compared = {
        r["optimizer"]: r for r in read_json(tmp_path / "adaptive" / "comparison.json")["rows"]
    }
    lars = compared["lars"]
    # B_f = 5,120 / (34 - 20) and its examples 34 B_f = 12,434, above the arm's 3,712.
    assert lars["fixed_batch_same_steps"] == pytest.approx(5120 / 14)
    assert lars["fixed_examples_same_steps"] == pytest.approx(34 * 5120 / 14)
    assert lars["verdict"] == "no more examples than the fixed batch of its steps"
    assert (lars["steps_adaptive"], lars["examples_adaptive"], lars["seconds_adaptive"]) == (
        34,
        3712,
        2.0,
    )
    # Measured: 256 (40 steps) is nearest 34; 4,096 is left out (a seed missed).
    assert (lars["nearest_fixed_batch"], lars["nearest_fixed_steps"]) == (256, 40.0)
    assert (lars["fewest_fixed_batch"], lars["fewest_fixed_steps"]) == (1024, 25.0)
    lamb = compared["lamb"]
    assert (lamb["steps_adaptive"], lamb["verdict"]) == (44, adaptive_arm.FEWER)
    assert lamb["fixed_batch_same_steps"] is None and lamb["nearest_fixed_batch"] is None
    assert (tmp_path / "adaptive" / "adaptive_batch.png").read_bytes()[:4] == b"\x89PNG"
    header = read_json(tmp_path / "adaptive" / "trials.json")["study"]
    assert header["adaptive"]["adaptive_batch"] == "adascale"
    assert header["adaptive"]["micro_batches"] == 8


def test_a_store_of_the_other_arm_or_other_adaptive_settings_is_refused_and_left_as_it_is(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(target_runner, "run_trial", simulated)
    common = ["--optimizers=lars", "--batch_sizes=64", "--trials=2", "--seeds=1"]
    adaptive, fixed = tmp_path / "adaptive", tmp_path / "fixed"
    batch_study.run_target_study(parse(*ADAPTIVE, *common, f"--study_dir={adaptive}"))
    cases = [
        ([*QUASI, *common], "--adaptive_batch=not set: the store", "(--adaptive_batch=adascale)"),
        (
            [*ADAPTIVE, *common, "--adaptive_batch_max=512"],
            "--adaptive_batch_max=512: the store",
            "(--adaptive_batch_max=256)",
        ),
    ]
    assert_each_refused_leaving_the_store(adaptive, cases)
    # The adaptive arm in a fixed-batch store.
    batch_study.run_target_study(parse(*QUASI, *common, f"--study_dir={fixed}"))
    before = (fixed / "trials.jsonl").read_bytes()
    with pytest.raises(ConfigError, match=r"^--adaptive_batch=adascale: the store .*=not set\)"):
        batch_study.run_target_study(parse(*ADAPTIVE, *common, f"--study_dir={fixed}"))
    assert (fixed / "trials.jsonl").read_bytes() == before


def test_a_compare_study_without_its_fit_or_the_optimizer_is_refused_before_anything_is_written(
    tmp_path,
):
    fit = {"s_min": 20.0, "e_min": 5120.0, "b_crit": 256.0, "batches": [64, 256, 1024]}
    args = [*ADAPTIVE, "--optimizers=lars,lamb", "--batch_sizes=64", "--trials=2", "--seeds=1"]
    fixed_study(tmp_path / "one", {"lars": fit})
    fixed_study(tmp_path / "nofit", {"lars": fit, "lamb": None})
    (tmp_path / "empty").mkdir()
    cases = [
        ("empty", "fit.json: cannot read it"),
        ("one", "fit.json: fits has no lamb."),
        ("nofit", "fit.json: fits.lamb is null: fewer than 3 batches where every seed"),
    ]
    for name, end in cases:
        directory = tmp_path / name
        with pytest.raises(ConfigError) as raised:
            batch_study.run_target_study(
                parse(*args, f"--compare_study={directory}", f"--study_dir={tmp_path / 'out'}")
            )
        line = str(raised.value)
        assert line.startswith(f"--compare_study={directory}: ") and end in line, line
        assert not (tmp_path / "out").exists()
    with pytest.raises(ConfigError, match=r"^--adaptive_batch_max=1024 exceeds the 512 training"):
        batch_study.run_target_study(
            parse(*args, "--adaptive_batch_max=1024", f"--study_dir={tmp_path / 'out'}")
        )
    other = [*args, "--target_accuracy=0.9", f"--compare_study={tmp_path / 'one'}"]
    with pytest.raises(ConfigError, match=r"study.target_accuracy is 0.8, not this study's"):
        batch_study.run_target_study(parse(*other, f"--study_dir={tmp_path / 'out'}"))
    assert not (tmp_path / "out").exists()


def test_a_tiny_adaptive_study_trains_end_to_end(tmp_path):
    # Real trials of Adam on 256 digits at 8x8 from batch 32, in 2 micro-batches,
    # up to 128; a goal no trial reaches (every one runs its budget of epochs,
    # deciding after each but the last).
    args = [
        *QUASI,
        "--target_accuracy=1.0",
        "--optimizers=adam",
        "--end_learning_rate=0.00001",
        "--batch_sizes=32",
        "--train_examples=256",
        "--eval_examples=64",
        "--validation_examples=64",
        "--budget_epochs=2",
        "--min_budget_steps=4",
        "--trials=2",
        "--seeds=1",
        "--noise_scale_micro_batches=2",
        "--adaptive_batch=adascale",
        "--adaptive_batch_max=128",
        f"--study_dir={tmp_path}",
    ]
    rows, trained = batch_study.run_target_study(parse(*args))
    assert [r["seed"] for r in rows] == [0, 0] and len(trained) == 2
    for r in rows:
        summary = read_json(tmp_path / "trials" / f"adam-{r['key']}" / "summary.json")
        decisions = summary["adaptive_batch"]
        assert (
            len(decisions) == r["budget_epochs"] - 1 == r["decisions"]
        )  # every epoch but the last
        # Examples as the tool counts them (its RunLength), from the decisions alone.
        assert r["examples"] == summary["target"]["examples"]
        assert r["steps"] == summary["history"][-1]["steps"] and not r["reached"]
        assert r["eval_every_steps"] == 1  # floor(0.02 * 256 / 128) = 0: every step
    assert read_csv(tmp_path / "steps_to_target.csv")[0]["trials"] == "2"
    assert (tmp_path / "adaptive_batch.png").read_bytes()[:4] == b"\x89PNG"
