"""keras-lars-plan --adaptive_batch (tools/plan/adaptive_plan.py): an
adaptive-batch run's steps, examples and time to accuracy from a study's fit
and its noise scale along the run. Synthetic study directories, no training;
the expected numbers are worked by hand or integrated apart (scipy)."""

import copy
import dataclasses
import itertools
import math
import os

import pytest
from scipy import integrate
from scipy import optimize

from keras_lars.adaptive_batch import next_batch_size
from keras_lars.tools.plan import adaptive_plan
from keras_lars.tools.plan import cli
from keras_lars.tools.plan import time_to_accuracy as tta
from keras_lars.tools.plan.report import duration
from keras_lars.tools.plan.target_curve import StepsCurve
from keras_lars.tools.settings import ConfigError
from keras_lars.tools.train.config import Config as TrainConfig
from tests.plan_tool import run_plan
from tests.test_plan_run_noise import FIT
from tests.test_plan_run_noise import row
from tests.test_plan_run_noise import write_study
from tests.test_plan_target import write_run

# The study's lars fit (tests/test_plan_run_noise.py): S_min 50, E_min 40,000, B_crit 800;
# here on 5,000 training examples, so that a run takes several epochs.
SMALL = copy.deepcopy(FIT)
SMALL["study"]["train_examples"] = 5000
CURVE = StepsCurve(50.0, 40000.0, "the fit")


def noise(*points):
    """A NoiseCurve through (fraction, B_simple) points."""
    fractions, values = zip(*points)
    return adaptive_plan.NoiseCurve(fractions, values)


def rows(*points, optimizer="lars", batch=1024):
    return [row(optimizer, batch, f, v, 0.8 * v, 1.2 * v) for f, v in points]


SHAPED = ((0.0, 100.0), (0.25, 300.0), (0.5, 500.0), (1.0, 900.0))  # mean 500


# --- the equations --------------------------------------------------------------------------
@pytest.mark.parametrize("curve_points", [((0.5, 400.0),), SHAPED, ((0.2, 50.0), (0.9, 2000.0))])
@pytest.mark.parametrize("batch", [64, 256, 1000, 4096])
@pytest.mark.parametrize("every", [1, 3])
def test_a_batch_that_cannot_change_takes_the_fits_steps(curve_points, batch, every):
    """B_min = B_max: whatever the shape of B_simple, ceil(S_min (1 + B_crit / B))
    steps of B examples."""
    shape = noise(*curve_points)
    run = adaptive_plan.simulate(CURVE, shape, 5000, batch, batch, batch, 2.0, 1.0, every)
    expected = math.ceil(50.0 * (1 + 800.0 / batch))  # 64: 675; 256: 207; 1000: 82; 4096: 60
    assert run.steps == expected and run.examples == expected * batch
    assert run.phases == ((batch, expected),)
    per_epoch = 5000 // batch
    assert run.epochs == math.ceil(expected / per_epoch)
    intervals = math.ceil(expected / (per_epoch * every)) - 1  # decided before the goal's
    assert len(run.decisions) == intervals
    assert all(d.new_batch == d.batch == batch for d in run.decisions)


def test_the_noise_curve_is_piecewise_linear_and_constant_beyond_its_ends():
    shape = noise((0.2, 100.0), (0.6, 500.0))
    assert [shape.at(p) for p in (0.0, 0.2, 0.4, 0.6, 1.0)] == [100.0, 100.0, 300.0, 500.0, 500.0]
    # 0.2 x 100 + 0.4 x 300 + 0.4 x 500 = 340
    assert shape.total == pytest.approx(340.0, rel=1e-15)
    # a constant B_simple: B_crit(p) = B_crit of the fit, so any stretch is S(B)'s share
    flat = noise((0.3, 250.0))
    steps = adaptive_plan.steps_between(CURVE, flat, 0.25, 0.75, 400)
    assert steps == pytest.approx(0.5 * (50.0 + 40000.0 / 400), rel=1e-14)


def test_a_constant_noise_scale_worked_by_hand():
    """B_simple 400 everywhere: B_crit(p) = 800, S(B) = 50 + 40,000 / B. From
    128 on 5,000 examples, to 4,096, x2 at most, on multiples of 8:
    epoch 1 at 128: 39 steps, p = 39 / 362.5 = 0.107586; B_simple 400 ->
    min(400, 256) = 256; epoch 2 at 256: 19 steps, p += 19 / 206.25 ->
    0.199709; -> 400 (within 512); then 12 steps an epoch at 400, S(400) = 150:
    (1 - 0.199709) 150 = 120.04 steps, 121, in the 11th epoch at 400 (10 more
    decisions, each keeping 400)."""
    flat = noise((0.0, 400.0), (1.0, 400.0))
    run = adaptive_plan.simulate(CURVE, flat, 5000, 128, 128, 4096, 2.0, 1.0, 1, 8)
    assert run.phases == ((128, 39), (256, 19), (400, 121))
    assert (run.steps, run.examples, run.epochs) == (179, 39 * 128 + 19 * 256 + 121 * 400, 13)
    assert len(run.decisions) == 12
    first, second = run.decisions[:2]
    assert (first.epoch, first.step, first.batch, first.new_batch) == (1, 39, 128, 256)
    assert first.progress == pytest.approx(39 / 362.5, rel=1e-12)
    assert (second.epoch, second.step, second.batch, second.new_batch) == (2, 58, 256, 400)
    assert second.progress == pytest.approx(39 / 362.5 + 19 / 206.25, rel=1e-12)
    assert all(d.noise_scale == pytest.approx(400.0, rel=1e-12) for d in run.decisions)
    assert [d.step for d in run.decisions[2:]] == [58 + 12 * k for k in range(1, 11)]
    assert all(d.batch == d.new_batch == 400 for d in run.decisions[2:])


def _reference(s_min, e_min, b_simple, examples, batches, every):
    """The run integrated apart: B_crit(p) = (E_min / S_min) b_simple(p) /
    its mean (scipy.quad), ds/dp = S_min (1 + B_crit(p) / B); the phase k at
    batches[k] for one interval of `every` epochs each (the last to the
    goal); progress by brentq. (phases, decision progresses)."""
    mean = integrate.quad(b_simple, 0.0, 1.0)[0]

    def steps(a, b, batch):
        return integrate.quad(
            lambda p: s_min * (1 + e_min / s_min * b_simple(p) / mean / batch), a, b
        )[0]

    start, phases, progresses = 0.0, [], []
    for batch in batches:
        block = examples // batch * every
        left = steps(start, 1.0, batch)
        if left <= block:
            phases.append((batch, math.ceil(left)))
            return phases, progresses
        start = optimize.brentq(
            lambda p, a=start, b=batch, n=block: steps(a, p, b) - n, start, 1.0, xtol=1e-14
        )
        phases.append((batch, block))
        progresses.append(start)
    raise AssertionError("the batches end before the goal")


def test_a_linear_noise_scale_and_a_doubling_batch_against_integration():
    """B_simple = 100 + 800 p; target 1,000 x B_simple is always above the
    bounds, so each decision doubles the batch up to B_max: 64, 128, ...,
    2,048. The phases and the progress at each decision match scipy's."""
    shape = noise((0.0, 100.0), (1.0, 900.0))
    run = adaptive_plan.simulate(CURVE, shape, 20000, 64, 64, 2048, 2.0, 1000.0, 2)
    batches = [64, 128, 256, 512, 1024, 2048, 2048, 2048, 2048]
    phases, progresses = _reference(50.0, 40000.0, lambda p: 100 + 800 * p, 20000, batches, 2)
    merged = []  # the reference's intervals at one batch, as one phase
    for batch, steps in phases:
        if merged and merged[-1][0] == batch:
            merged[-1] = (batch, merged[-1][1] + steps)
        else:
            merged.append((batch, steps))
    assert run.phases == tuple(merged)
    assert [d.progress for d in run.decisions] == pytest.approx(progresses, rel=1e-9)
    # B_simple of an interval: the mean of 100 + 800 p over it, 100 + 400 (a + b)
    ends = [0.0, *progresses]
    assert [d.noise_scale for d in run.decisions] == pytest.approx(
        [100 + 400 * (a + b) for a, b in itertools.pairwise(ends)], rel=1e-9
    )


def test_the_decisions_of_a_known_curve_are_the_rule_applied_by_hand():
    """B_simple rising to 1,000 at 0.3 and falling to 20 at 0.6, target 1.5,
    x2 at most, multiples of 8 in [48, 1,200]: each decision's batch is
    B' = clip(8 floor(1.5 B_simple / 8), lo, hi), lo = max(48, 8 ceil(B / 2 / 8)),
    hi = min(1,200, 8 floor(2 B / 8)), with B_simple the curve's mean over
    the interval (integrated apart: scipy)."""
    shape = noise((0.0, 100.0), (0.3, 1000.0), (0.6, 20.0))
    run = adaptive_plan.simulate(CURVE, shape, 10000, 96, 48, 1200, 2.0, 1.5, 1, 8)
    batch, last = 96, 0.0
    for d in run.decisions:
        assert d.batch == batch
        mean = integrate.quad(shape.at, last, d.progress, points=(0.3, 0.6))[0]
        assert d.noise_scale == pytest.approx(mean / (d.progress - last), rel=1e-9)
        low = max(48, 8 * math.ceil(batch / 2 / 8))
        high = min(1200, 8 * math.floor(batch * 2 / 8))
        batch = min(max(8 * math.floor(min(1.5 * d.noise_scale, high) / 8), low), high)
        assert d.new_batch == batch
        assert d.new_batch == next_batch_size(d.batch, d.noise_scale, 1.5, 48, 1200, 2.0, 8)
        last = d.progress
    # x2 while 1.5 B_simple is above (192, 384, 768), then 1.5 B_simple (1,008: B_simple
    # 675.5; 584: 390.3), then halved at most (B_simple 45.9: 296 = 8 ceil(584 / 2 / 8))
    assert [d.new_batch for d in run.decisions] == [192, 384, 768, 1008, 584, 296]
    assert [round(d.noise_scale, 1) for d in run.decisions[3:]] == [675.5, 390.3, 45.9]
    assert run.phases[-1][0] == 296 and run.steps == sum(steps for _, steps in run.phases)


# --- the flags ------------------------------------------------------------------------------
def test_the_planners_adaptive_flags_are_the_training_tools():
    tool = {f.name: f for f in dataclasses.fields(TrainConfig)}
    planner = {f.name: f for f in dataclasses.fields(cli.PlanSettings)}
    names = [name for name in tool if name.startswith("adaptive_batch")]
    assert len(names) == 6
    for name in names:
        assert planner[name].default == tool[name].default
        assert planner[name].metadata["help"].endswith(tool[name].metadata["help"])
        assert planner[name].metadata["choices"] == tool[name].metadata["choices"]


# --- the report -----------------------------------------------------------------------------
def _study(tmp_path, points=SHAPED, fit=SMALL, **keys):
    return write_study(tmp_path / "study", rows=rows(*points, **keys), fit=fit)


def _flags(study, run, *more):
    return (
        f"--target_study={study}",
        "--target_optimizer=lars",
        f"--from_run={run}",
        "--devices=1",
        "--devices_per_node=1",
        "--adaptive_batch=adascale",
        "--global_batch_size=128",
        "--adaptive_batch_max=4096",
        *more,
    )


def test_the_program_plans_the_adaptive_run_beside_the_fixed_grid(tmp_path):
    study = _study(tmp_path, points=((0.0, 400.0),))
    run = write_run(tmp_path / "run")  # 500 images/s at batch 256: 2 ms an image
    status, out, err = run_plan(*_flags(study, run, "--adaptive_batch_every_epochs=1"))
    assert status == 0 and err == "", err
    options = cli.PlanSettings(
        target_study=study,
        target_optimizer="lars",
        from_run=(run,),
        devices=1,
        devices_per_node=1,
        adaptive_batch="adascale",
        global_batch_size=128,
        adaptive_batch_max=4096,
    )
    given = frozenset(
        (
            "target_study",
            "target_optimizer",
            "from_run",
            "devices",
            "devices_per_node",
            "adaptive_batch",
            "global_batch_size",
            "adaptive_batch_max",
            "adaptive_batch_every_epochs",
        )
    )
    assert out == adaptive_plan.report(options, duration, given) + "\n"
    assert out.startswith(tta.report(options, duration, given) + "\n\n")  # the grid, unchanged
    lines = out.splitlines()
    # the constant B_simple 400 worked by hand above, on multiples of 1 device: 128 -> 256 ->
    # 400; every step 2 ms an image (one run: proportional), so 179 steps of 58,256 images
    # take 116.512 s
    assert (
        "adaptive  on 1 device: 117 s, 0.0324 device-hours (179 steps, 58,256 examples, the "
        "goal in epoch 13; steps by batch 128: 39, 256: 19, 400: 121; each batch's step as "
        "the grid's)"
    ) in lines
    assert (
        "B_simple  of lars at batch 1,024 (the measured batch nearest the start) by progress p "
        f"to the goal, from {study}/noise_scales.json (rows' fraction: noise_scale): 0: 400; "
        "piecewise linear, constant beyond; its mean over the run 400"
    ) in lines
    assert (
        "B_crit    at p = 800 x B_simple(p) / 400: the fit's E_min / S_min (fit.json "
        "fits.lars) shaped by B_simple, so that a fixed batch B takes the curve's S(B)"
    ) in lines
    # The fixed batches of the same column (256 .. 4,096): by the fit 256 takes 206.25 steps,
    # 52,800 examples (<= 58,256), 512 128.125 steps, 65,600 examples (more); a step
    # proportional to its images makes the fewest examples the fastest: 256, 105.6 s.
    fixed = "batch 256 on 1 device: 106 s, 0.0293 device-hours (206 steps by the fit, of 512 ms)"
    assert f"  fixed, fewest steps at no more examples: {fixed}; 52,800 examples" in lines
    assert f"  fixed, fastest: {fixed}; 52,800 examples" in lines
    assert (
        "  decisions 12 (10 kept the batch): after epoch (step, progress), B_simple of the "
        "interval -> batch"
    ) in lines
    assert "    epoch 1 (step 39, 0.108): B_simple 400: 128 -> 256" in lines
    assert "    epoch 2 (step 58, 0.200): B_simple 400: 256 -> 400" in lines
    # a sweep: 3 devices divide none of the batches
    status, out, err = run_plan(*_flags(study, run, "--target_devices=1,3"))
    assert status == 0, err
    assert (
        "adaptive  on 3 devices: -: 3 devices do not divide --global_batch_size, "
        "--adaptive_batch_min and _max (each batch is a multiple of the devices)"
    ) in out.splitlines()


def test_the_users_noise_curve_with_given_steps(tmp_path):
    """--adaptive_noise_curve with --target_s_min and --target_b_crit, on
    --examples: the constant B_simple 400 worked by hand above (179 steps,
    58,256 examples), timed on a custom model of 1,000 images/s a device
    (no fixed time, one device: no all-reduce): 58.256 s."""
    flags = (
        "--target_s_min=50",
        "--target_b_crit=800",
        "--examples=5000",
        "--model=custom",
        "--parameters=1000000",
        "--forward_gflops=1",
        "--images_per_second=1000",
        "--fixed_step_ms=0",
        "--devices=1",
        "--devices_per_node=1",
        "--adaptive_batch=linear",
        "--global_batch_size=128",
        "--adaptive_batch_max=4096",
        "--adaptive_noise_curve=0.5:400",
    )
    status, out, err = run_plan(*flags)
    assert status == 0 and err == "", err
    lines = out.splitlines()
    assert (
        "B_simple  by progress p to the goal, from --adaptive_noise_curve (fraction: B_simple): "
        "0.5: 400; piecewise linear, constant beyond; its mean over the run 400"
    ) in lines
    assert (
        "B_crit    at p = 800 x B_simple(p) / 400: the curve's E_min / S_min (its line above) "
        "shaped by B_simple, so that a fixed batch B takes the curve's S(B)"
    ) in lines
    adaptive = next(line for line in lines if line.startswith("adaptive  on 1 device: "))
    assert adaptive.startswith("adaptive  on 1 device: 58 s, 0.0162 device-hours (179 steps, ")
    assert "58,256 examples, the goal in epoch 13; steps by batch 128: 39, 256: 19, 400: 121" in (
        adaptive
    )
    assert "deciding every 1 epoch of 5,000 examples (--examples)" in out
    # with a study, the user's curve replaces its noise_scales.json (here: none)
    bare = write_study(tmp_path / "bare", rows=None, fit=SMALL)
    run = write_run(tmp_path / "run")
    status, out, err = run_plan(*_flags(bare, run, "--adaptive_noise_curve=0:400"))
    assert status == 0 and err == "", err
    assert "179 steps, 58,256 examples, the goal in epoch 13" in out


def test_the_measured_batch_nearest_the_start_gives_the_curve(tmp_path):
    points = rows((0.0, 100.0), (1.0, 200.0), batch=256) + rows((0.5, 900.0), batch=4096)
    study = write_study(tmp_path / "study", rows=points, fit=SMALL)
    near = adaptive_plan.study_noise(study, "lars", 512)  # 256 is 2x away, 4,096 8x
    assert (near.batch, near.fractions, near.values) == (256, (0.0, 1.0), (100.0, 200.0))
    far = adaptive_plan.study_noise(study, "lars", 2048)
    assert (far.batch, far.fractions, far.values) == (4096, (0.5,), (900.0,))


# --- bad input: one line, before any work ----------------------------------------------------
def _error(*flags):
    status, out, err = run_plan(*flags)
    assert status == 1 and out == "", out
    assert len(err.strip().splitlines()) == 1, err
    return err.strip()


def test_bad_settings_are_one_line(tmp_path):
    study = _study(tmp_path)
    run = write_run(tmp_path / "run")
    flags = _flags(study, run)
    assert _error(*flags, "--adaptive_batch_min=256", "--adaptive_batch_max=128") == (
        "error: --adaptive_batch_min=256: exceeds --adaptive_batch_max=128."
    )
    assert _error(*flags, "--adaptive_batch_growth=1") == (
        "error: --adaptive_batch_growth=1.0: must be > 1."
    )
    assert _error(*flags, "--adaptive_batch_target=0") == (
        "error: --adaptive_batch_target=0.0: must be > 0."
    )
    assert _error(*flags, "--adaptive_batch_every_epochs=0") == (
        "error: --adaptive_batch_every_epochs=0: must be >= 1."
    )
    assert _error(*flags, "--adaptive_batch_min=256") == (
        "error: --adaptive_batch_min=256: exceeds --global_batch_size=128, the batch to start at."
    )
    assert _error(*flags, "--batch_schedule=0:128,1:256", "--epochs=2") == (
        "error: --adaptive_batch=adascale: plans one adaptive run's time to accuracy: not with "
        "--batch_schedule."
    )
    assert _error(*flags, "--target_noise_from_run") == (
        "error: --adaptive_batch=adascale: plans one adaptive run's time to accuracy: not with "
        "--target_noise_from_run."
    )
    assert _error("--adaptive_batch=sqrt", "--global_batch_size=64") == (
        "error: --adaptive_batch=sqrt: plans from steps to the target and a noise-scale curve: "
        "give --target_study (its fit.json, and its noise_scales.json unless "
        "--adaptive_noise_curve), or --target_s_min or --target_noise_scale with "
        "--adaptive_noise_curve."
    )
    assert _error("--adaptive_batch=sqrt", "--target_s_min=50", "--target_b_crit=800") == (
        "error: --adaptive_batch=sqrt: needs B_simple along the run: --target_study's "
        "noise_scales.json, or --adaptive_noise_curve."
    )
    for curve, why in (
        ("0:100,x", "'x' is not FRACTION:B_SIMPLE"),
        ("0:100,0.5", "'0.5' is not FRACTION:B_SIMPLE"),
        ("-0.5:100", "'-0.5:100': the fraction must be a finite number >= 0"),
        ("0:100,1:0", "'1:0': B_simple must be a finite number > 0"),
        ("0:nan", "'0:nan': B_simple must be a finite number > 0"),
        ("0:100,1:inf", "'1:inf': B_simple must be a finite number > 0"),
        ("0:100,0.0:200", "fraction 0 given twice"),
    ):
        assert _error(*flags, f"--adaptive_noise_curve={curve}") == (
            f"error: --adaptive_noise_curve={curve}: must be FRACTION:B_SIMPLE pairs separated "
            f"by commas, e.g. 0:100,1:900: {why}."
        )
    assert _error(f"--target_study={study}", "--adaptive_batch=none") == (
        "error: --adaptive_batch=none: needs --global_batch_size, the batch to start at (as "
        "keras-lars-train's)."
    )
    assert _error(f"--target_study={study}", "--adaptive_batch=none", "--global_batch_size=64") == (
        "error: --adaptive_batch=none: needs --adaptive_batch_max, the largest global batch to "
        "grow to."
    )
    assert _error(*flags, "--adaptive_batch_max=8192") == (
        "error: --adaptive_batch_max=8192 exceeds the 5,000 training examples (the study's "
        "fit.json study.train_examples): an epoch would have no step."
    )


def test_bad_studies_are_one_line(tmp_path, monkeypatch, capsys):
    run = write_run(tmp_path / "run")
    bare = write_study(tmp_path / "bare", rows=None, fit=SMALL)
    missing = (
        f"error: --target_study={bare}: {bare}/noise_scales.json: missing: the study measured "
        "no noise scale at fixed weights (keras-lars-study --noise_batch_sizes), so no "
        "noise-scale curve for --adaptive_batch."
    )
    assert _error(*_flags(bare, run)) == missing
    # the same through the program's main, as the console script calls it
    options = cli.PlanSettings(
        target_study=bare,
        target_optimizer="lars",
        adaptive_batch="adascale",
        global_batch_size=128,
        adaptive_batch_max=4096,
    )
    with monkeypatch.context() as patched, pytest.raises(SystemExit) as stopped:
        patched.setattr(cli.settings, "options_from_flags", lambda schema: options)
        cli.main(["keras-lars-plan"])
    assert stopped.value.code == missing and capsys.readouterr().out == ""
    other = write_study(tmp_path / "other", rows=rows((0.5, 100.0), optimizer="lamb"), fit=SMALL)
    assert _error(*_flags(other, run)) == (
        f"error: --target_study={other}: {other}/noise_scales.json: no fixed-weight measurement "
        "of lars (rows with a noise_scale): no noise-scale curve for it."
    )
    for value, shown in ((-5.0, "-5.0 must be > 0"), (0.0, "0.0 must be > 0")):
        bad = rows((0.0, 100.0)) + [row("lars", 1024, 0.5, value, -10.0, 10.0)]
        study = write_study(tmp_path / f"bad{value}", rows=bad, fit=SMALL)
        assert _error(*_flags(study, run)) == (
            f"error: --target_study={study}: {study}/noise_scales.json: rows[1].noise_scale: "
            f"{shown}."
        )
    for value in (math.inf, math.nan):
        bad = [row("lars", 1024, 0.5, value, 1.0, 2.0)]
        study = write_study(tmp_path / f"bad{value}", rows=bad, fit=SMALL)
        assert _error(*_flags(study, run)) == (
            f"error: --target_study={study}: {study}/noise_scales.json: rows[0].noise_scale: "
            f"{value} is not a finite number."
        )
    twice = write_study(tmp_path / "twice", rows=rows((0.5, 100.0), (0.5, 120.0)), fit=SMALL)
    assert _error(*_flags(twice, run)) == (
        f"error: --target_study={twice}: {twice}/noise_scales.json: rows: lars at batch 1,024 "
        "has two measurements at fraction 0.5: one a point."
    )


def test_a_run_of_too_many_decisions_is_refused_before_planning(tmp_path, monkeypatch):
    """From 160: at most S(160) = 50 + 40,000 / 160 = 300 steps; B_max 4,096:
    one step an epoch on 5,000 examples, so up to 300 decisions."""
    options = cli.PlanSettings(
        target_study=_study(tmp_path),
        target_optimizer="lars",
        adaptive_batch="adascale",
        global_batch_size=160,
        adaptive_batch_max=4096,
        devices=1,
        devices_per_node=1,
    )
    monkeypatch.setattr(adaptive_plan, "MAX_DECISIONS", 299)
    with pytest.raises(ConfigError) as raised:
        adaptive_plan.report(options, duration)
    assert str(raised.value) == (
        "--adaptive_batch_every_epochs=1: the run could take up to 300 decisions to the goal, "
        "more than the 299 planned: decide less often."
    )
    monkeypatch.setattr(adaptive_plan, "MAX_DECISIONS", 300)
    assert adaptive_plan.report(options, duration).startswith("time to accuracy 0.9 of ")


# --- the page -------------------------------------------------------------------------------
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_planning_pages_example_is_what_the_planner_prints(tmp_path):
    """docs/planning.md's adaptive example: its command run on the study it
    describes, its lines the report's from the adaptive run's first."""
    with open(os.path.join(ROOT, "docs", "planning.md")) as f:
        page = f.read()
    block = page.split("<!-- adaptive batch example")[1].split("```\n", 1)[1].split("```\n")[0]
    command, printed = block.split("\n...\n")
    study, run = _study(tmp_path, points=SHAPED), write_run(tmp_path / "run")
    flags = command.replace("STUDY", study).replace("RUN", run).split()
    assert flags[:2] == ["$", "keras-lars-plan"]
    assert flags[2:] == list(_flags(study, run))
    status, out, err = run_plan(*flags[2:])
    assert status == 0 and err == "", err
    shown = out[out.index("\nadaptive  --") + 1 :].replace(study, "STUDY")
    assert printed == shown
