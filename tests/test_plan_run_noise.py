"""keras-lars-plan --target_noise_from_run (tools/plan/run_noise.py): the
user's run's last unlagged noise-scale reading times a study's ratio
B_crit / B_simple measured at fixed weights nearest its goal, as the critical
batch of the run's model; every bad input one line. Synthetic study and run
files, no training; the expected numbers are worked by hand."""

import json
import math
import os

import pytest

from keras_lars import noise_scale
from keras_lars.tools.model_dir_names import NOISE_READINGS
from keras_lars.tools.plan import cli
from keras_lars.tools.plan import run_noise
from keras_lars.tools.plan.report import duration
from keras_lars.tools.plan.time_to_accuracy import report
from keras_lars.tools.train import adaptive

# The study's lars fit: S_min 50, E_min 40,000, so B_crit 800.
FIT = {
    "study": {
        "mode": "steps_to_target",
        "target_accuracy": 0.9,
        "model": "simple_cnn",
        "dataset": "fashion_mnist",
        "image_size": 28,
        "train_examples": 55000,
    },
    "fits": {
        "lars": {"s_min": 50.0, "e_min": 40000.0, "batches": [256, 1024, 4096]},
        "lamb": {"s_min": 40.0, "e_min": 40000.0, "batches": [256, 1024, 4096]},
    },
}


def row(optimizer, batch, fraction, scale, low, high):
    return dict(
        optimizer=optimizer,
        batch_size=batch,
        fraction=fraction,
        noise_scale=scale,
        low=low,
        high=high,
    )


ROWS = [
    row("lars", 1024, 0.5, 100.0, 90.0, 110.0),
    row("lars", 1024, 1.0, 200.0, 160.0, 250.0),  # nearest the goal at the run's batch
    row("lars", 4096, 1.0, 400.0, 300.0, 500.0),  # as near the goal, farther from batch 256
    row("lars", 64, 0.75, 300.0, 200.0, 400.0),
    row("lamb", 1024, 1.0, None, None, None),  # not resolved: no measurement
]


def write_study(directory, rows=ROWS, fit=FIT):
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "fit.json"), "w") as f:
        json.dump(fit, f)
    if rows is not None:
        with open(os.path.join(directory, "noise_scales.json"), "w") as f:
            json.dump({"noise": {"confidence": 0.95}, "rows": rows}, f)
    return str(directory)


HISTORY = [
    {"loss": 1.0, "noise_scale": 30.0, "noise_scale_interval": 60.0},
    {
        "loss": 0.5,
        "noise_scale": 40.0,
        "noise_scale_interval": 120.0,
        "noise_scale_interval_error": 10.0,
    },
    {"loss": 0.4, "noise_scale": 45.0},  # no reading this epoch
]


def write_run(directory, history=HISTORY, target=None, text=None):
    """A run's summary.json: 1,000 images/s at batch 256 on one device."""
    os.makedirs(directory, exist_ok=True)
    summary = {
        "train_images_per_second": 1000.0,
        "config": {"model": "simple_cnn", "image_size": 28, "global_batch_size": 256},
        "layout": {"workers": 1, "replicas": 1},
        "history": history,
        **({"target": target} if target else {}),
    }
    with open(os.path.join(directory, "summary.json"), "w") as f:
        f.write(text if text is not None else json.dumps(summary))
    return str(directory)


def flags(study, run, **values):
    given = dict(target_study=study, target_optimizer="lars", target_noise_from_run=True)
    return cli.PlanSettings(**{**given, "from_run": (run,), **values})


def test_the_names_read_are_those_the_tool_writes():
    assert NOISE_READINGS == (
        tuple(noise_scale.INTERVAL_LOG_KEYS.values()),
        tuple(adaptive.LOGGED.values()),
    )


def test_the_reading_the_ratio_and_the_curve(tmp_path):
    study = write_study(tmp_path / "study")
    run = write_run(tmp_path / "run")
    options = flags(study, run, target_measured_steps=900.0, target_measured_batch=256)
    curve = run_noise.run_noise_curve(options)
    # The last epoch with a reading: history[1], B_simple 120 +- 10. The
    # study's row at fraction 1 nearest batch 256 (1,024 before 4,096): ratio
    # 800 / 200 = 4 [800 / 250 .. 800 / 160] = [3.2 .. 5]; B_crit 4 x 120 = 480;
    # S_min = 900 / (1 + 480 / 256) = 313.04..., E_min = 480 S_min.
    assert curve.b_crit == pytest.approx(480.0, rel=1e-12)
    assert curve.s_min == pytest.approx(900.0 / (1 + 480.0 / 256), rel=1e-12)
    assert curve.steps(256) == pytest.approx(900.0, rel=1e-12)
    assert curve.steps(1024) == pytest.approx(curve.s_min * (1 + 480 / 1024), rel=1e-12)
    assert (curve.model, curve.image_size, curve.measured) == ("simple_cnn", 28, (256,))
    path = f"{study}/noise_scales.json"
    assert curve.details == (
        f"B_crit    = ratio x your B_simple = 4 x 120 = 480 (ratio 4 [3.2..5] measured by "
        f"{path} for lars at batch 1,024: its B_crit 800 over B_simple 200 at fixed weights, "
        "100% of the steps to its goal (accuracy 0.9), on simple_cnn)",
        f"B_simple  120 +- 10 (standard error), unlagged, measured by --from_run={run}: "
        "summary.json: history[1].noise_scale_interval, epoch 2 of 3",
        "spread    B_crit 384 .. 600 over the ratio's interval (your B_simple's error not "
        "included)",
    )
    text = report(options, duration)
    assert text.splitlines()[0] == (
        "time to the target: S(B) = S_min + E_min / B = 313.0 + 150,261 / B steps, "
        "B_crit = E_min / S_min = 480"
    )
    assert curve.details[0] in text.splitlines()
    assert "curve     B_crit = r x your B_simple, through 900 steps at batch 256 " in text


def test_an_adaptive_reading_counts_and_the_run_target_is_the_point(tmp_path):
    study = write_study(tmp_path / "study")
    history = [
        {"noise_scale_interval": 60.0, "noise_scale_interval_error": 5.0},
        {"adaptive_noise_scale": 80.0, "adaptive_noise_scale_error": 8.0},
        {"loss": 0.1},
    ]
    target = {"target_accuracy": 0.9, "reached": True, "step": 600, "examples": 153600}
    run = write_run(tmp_path / "run", history, target)
    curve = run_noise.run_noise_curve(flags(study, run))
    assert curve.b_crit == pytest.approx(320.0, rel=1e-12)  # 4 x 80
    assert curve.s_min == pytest.approx(600 / (1 + 320 / 256), rel=1e-12)
    assert "history[1].adaptive_noise_scale, epoch 2 of 3" in curve.details[1]
    alone = write_run(tmp_path / "alone", [{"noise_scale_interval": 50.0}], target)
    assert run_noise.run_noise_curve(flags(study, alone)).details[1] == (
        f"B_simple  50 (no standard error: fewer than 2 measurements), unlagged, measured by "
        f"--from_run={alone}: summary.json: history[0].noise_scale_interval, epoch 1 of 1"
    )
    assert "through 600 steps at batch 256 (the run's steps to accuracy 0.9)" in curve.source
    assert curve.target == "accuracy 0.9 of simple_cnn"


def test_an_interval_reaching_zero_leaves_the_ratio_unbounded_above(tmp_path):
    study = write_study(tmp_path / "study", [row("lars", 256, 1.0, 100.0, -20.0, 220.0)])
    run = write_run(tmp_path / "run")
    ratio = run_noise.study_ratio(study, "lars", 256)
    assert (ratio.ratio, ratio.high) == (8.0, math.inf)
    assert ratio.low == pytest.approx(800 / 220, rel=1e-12)
    assert "ratio 8 [3.64..inf]" in ratio.text()
    options = flags(study, run, target_measured_steps=900.0, target_measured_batch=256)
    assert "spread    B_crit 436 .. inf " in run_noise.run_noise_curve(options).details[2]


def _main(monkeypatch, capsys, options):
    monkeypatch.setattr(cli.settings, "options_from_flags", lambda schema: options)
    with pytest.raises(SystemExit) as stopped:
        cli.main(["keras-lars-plan"])
    assert capsys.readouterr().out == ""
    return str(stopped.value.code)


POINT = dict(target_measured_steps=900.0, target_measured_batch=256)


def _bad_history(value):
    return [{"noise_scale_interval": value, "noise_scale_interval_error": 1.0}]


@pytest.mark.parametrize(
    "history, field",
    [
        (_bad_history(-5.0), "history[0].noise_scale_interval: -5.0 must be > 0"),
        (_bad_history(True), "history[0].noise_scale_interval: true is not a number"),
        (_bad_history("12"), 'history[0].noise_scale_interval: "12" is not a number'),
        (
            [{"noise_scale_interval": 5.0, "noise_scale_interval_error": -1.0}],
            "history[0].noise_scale_interval_error: -1.0 must be >= 0",
        ),
        (
            [{"noise_scale": 40.0}, {"loss": 1.0}],
            "no noise-scale reading in its history (no noise_scale_interval or "
            "adaptive_noise_scale): train it with keras-lars-train --noise_scale (its moving "
            "average noise_scale lags toward early training and is not used)",
        ),
        ({"0": 1}, "history: not a list of epochs"),
    ],
)
def test_bad_runs_are_one_line(tmp_path, monkeypatch, capsys, history, field):
    study = write_study(tmp_path / "study")
    run = write_run(tmp_path / "run", history)
    assert _main(monkeypatch, capsys, flags(study, run, **POINT)) == (
        f"error: --from_run={run}: summary.json: {field}."
    )


def test_a_non_finite_reading_is_one_line(tmp_path, monkeypatch, capsys):
    study = write_study(tmp_path / "study")
    text = json.dumps(
        {
            "train_images_per_second": 1000.0,
            "config": {"model": "simple_cnn", "image_size": 28, "global_batch_size": 256},
            "layout": {"replicas": 1},
            "history": [{"noise_scale_interval": 1e999, "noise_scale_interval_error": 1.0}],
        }
    )
    run = write_run(tmp_path / "run", text=text.replace("Infinity", "1e999"))
    assert _main(monkeypatch, capsys, flags(study, run, **POINT)) == (
        f"error: --from_run={run}: summary.json: history[0].noise_scale_interval: inf is not "
        "a finite number."
    )


def test_bad_studies_and_flags_are_one_line(tmp_path, monkeypatch, capsys):
    run = write_run(tmp_path / "run")
    bare = write_study(tmp_path / "bare", rows=None)
    assert _main(monkeypatch, capsys, flags(bare, run, **POINT)) == (
        f"error: --target_study={bare}: {bare}/noise_scales.json: missing: the study measured "
        "no noise scale at fixed weights (keras-lars-study --noise_batch_sizes), so no ratio "
        "B_crit / B_simple for --target_noise_from_run."
    )
    study = write_study(tmp_path / "study")
    options = flags(study, run, **{**POINT, "target_optimizer": "lamb"})
    assert _main(monkeypatch, capsys, options) == (
        f"error: --target_study={study}: {study}/noise_scales.json: no fixed-weight "
        "measurement of lamb (rows with a noise_scale): no ratio B_crit / B_simple for it."
    )
    for value, problem in ((-1.0, "-1.0 must be > 0"), (False, "false is not a number")):
        bad = write_study(tmp_path / f"bad{value}", [row("lars", 256, 1.0, value, 1.0, 2.0)])
        assert _main(monkeypatch, capsys, flags(bad, run, **POINT)) == (
            f"error: --target_study={bad}: {bad}/noise_scales.json: rows[0].noise_scale: {problem}."
        )
    outside = write_study(tmp_path / "outside", [row("lars", 256, 1.0, 5.0, 6.0, 9.0)])
    assert _main(monkeypatch, capsys, flags(outside, run, **POINT)) == (
        f"error: --target_study={outside}: {outside}/noise_scales.json: rows[0].low, high: "
        "[6, 9] does not hold noise_scale 5."
    )
    goal = {**FIT, "study": {**FIT["study"], "target_accuracy": True}}
    odd = write_study(tmp_path / "odd", fit=goal)
    assert _main(monkeypatch, capsys, flags(odd, run, **POINT)) == (
        f"error: --target_study={odd}: {odd}/fit.json: study.target_accuracy: true is not a number."
    )
    flat = write_study(tmp_path / "flat", rows={"lars": 1})
    assert _main(monkeypatch, capsys, flags(flat, run, **POINT)) == (
        f'error: --target_study={flat}: {flat}/noise_scales.json: "rows": not a list of '
        "measurements."
    )
    assert _main(monkeypatch, capsys, flags(study, run)) == (
        f"error: --from_run={run}: summary.json: the run reached no --target_accuracy (its "
        '"target"): give --target_measured_steps and --target_measured_batch, the steps a '
        "run took to the target at a batch."
    )
    no_study = cli.PlanSettings(target_noise_from_run=True, from_run=(run,), **POINT)
    assert _main(monkeypatch, capsys, no_study) == (
        "error: --target_noise_from_run: give --target_study, the study whose ratio "
        "B_crit / B_simple turns the run's noise scale into a critical batch."
    )
    no_run = cli.PlanSettings(target_noise_from_run=True, target_study=study, **POINT)
    assert _main(monkeypatch, capsys, no_run) == (
        "error: --target_noise_from_run: give the run that measured its noise scale: --from_run."
    )
    assert _main(monkeypatch, capsys, flags(study, run, target_measured_steps=900.0)) == (
        "error: --target_measured_batch=0: must be > 0 (--target_noise_from_run needs "
        "--target_measured_steps and --target_measured_batch: the steps one run took to the "
        "target at that batch)."
    )
