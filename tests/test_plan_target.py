"""keras-lars-plan in time to accuracy (tools/plan/target_curve.py,
tools/plan/time_to_accuracy.py): the curve S(B) = S_min + E_min / B from a
study's fit.json, from S_min and B_crit, from a noise scale; a measured run's
throughput scaling the step model; the batch x devices grid with gradient
accumulation, the fastest and the cheapest cell; every bad input one line.
The expected numbers are worked by hand from the equations."""

import json
import os
import re
import subprocess
import sys

import pytest

from keras_lars.tools.plan import cli
from keras_lars.tools.plan import measured_step
from keras_lars.tools.plan import report
from keras_lars.tools.plan import target_curve
from keras_lars.tools.plan import time_to_accuracy as tta
from keras_lars.tools.settings import ConfigError
from tests.plan_tool import run_plan

FIT = {
    "study": {
        "mode": "steps_to_target",
        "target_accuracy": 0.8,
        "model": "simple_cnn",
        "dataset": "digits",
        "image_size": 28,
        "train_examples": 1437,
        "optimizers": ["lamb", "sgd"],
    },
    "fits": {
        "lamb": {"s_min": 20.0, "e_min": 6400.0, "b_crit": 320.0, "batches": [32, 128, 512]},
        "sgd": None,
    },
}
# a device of 1,000 images/s, no fixed time; 1M float32 parameters (4 MB); a ring in one node
# of 8 at 50 GB/s and 5 us a message
CUSTOM = dict(
    model="custom",
    parameters=1_000_000,
    forward_gflops=1.0,
    images_per_second=1000.0,
    algorithm="ring",
    devices=8,
    devices_per_node=8,
    overlap=False,
)
ONE = dict(devices=1, devices_per_node=1)


def settings(**values):
    return cli.PlanSettings(**values)


def write_study(directory, document=FIT, table=None):
    """A study's fit.json and, given its rows, steps_to_target.json."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "fit.json"), "w") as f:
        json.dump(document, f)
    if table is not None:
        with open(os.path.join(directory, "steps_to_target.json"), "w") as f:
            json.dump({"study": document["study"], "rows": table}, f)
    return str(directory)


def tuned_row(optimizer, batch, rate, budget):
    """A row of a study's steps_to_target.json (the fields the planner reads)."""
    return dict(optimizer=optimizer, batch_size=batch, chosen_rate=rate, budget_steps=budget)


TABLE = [
    tuned_row("lamb", 32, 0.0035, 135),
    tuned_row("lamb", 128, 0.007, 34),
    tuned_row("lamb", 512, 0.0141, 20),
    tuned_row("lamb", 1024, 0.02, 20),  # not fitted (a seed missed): no tuned rate there
    tuned_row("sgd", 128, 0.05, 34),
]
# The study ran 1,024 untuned (--untuned_batch_sizes): one trial at 512's choice.
UNTUNED = [
    *TABLE[:3],
    dict(tuned_row("lamb", 1024, 0.0141, 20), tuned=False, steps_mean=30.0),
    dict(tuned_row("lamb", 1437, 0.0141, 20), tuned=False, steps_mean=None),  # missed
    dict(tuned_row("sgd", 1024, 0.05, 34), tuned=False, steps_mean=12.0),
]


def write_run(directory, rate=500.0, batch=256, replicas=1, recorded_in="summary", **config):
    """A training run's summary.json; its layout in the summary (as the tool
    writes it), in a checkpoint state beside it (as earlier versions did), or
    nowhere (`replicas`=0)."""
    os.makedirs(os.path.join(directory, "checkpoints"), exist_ok=True)
    layout = {"layout": {"workers": 1, "replicas": replicas}} if replicas else {}
    summary = {
        "train_images_per_second": rate,
        "config": {"model": "simple_cnn", "image_size": 28, "global_batch_size": batch, **config},
        **(layout if recorded_in == "summary" else {}),
    }
    with open(os.path.join(directory, "summary.json"), "w") as f:
        json.dump(summary, f)
    if recorded_in == "checkpoint":
        with open(os.path.join(directory, "checkpoints", "ckpt-0002.json"), "w") as f:
            json.dump(layout, f)
    return str(directory)


# --- the curve ---------------------------------------------------------------------------------
def test_a_study_fit_gives_the_curve_and_its_measured_batches(tmp_path):
    curve = target_curve.study_curve(write_study(tmp_path / "study"), "lamb")
    assert curve.steps(128) == 20 + 6400 / 128 == 70.0
    assert curve.b_crit == 320.0
    assert curve.measured == (32, 128, 512) and curve.max_batch == 1437
    assert [curve.extrapolated(b) for b in (16, 32, 512, 1024)] == [True, False, False, True]
    assert curve.target == "accuracy 0.8 of simple_cnn on digits" and curve.model == "simple_cnn"
    assert curve.source.endswith("lamb, fitted on batches 32, 128, 512")
    noise = dict(FIT, noise_scales={"lamb": {"batch_size": 512, "noise_scale": 250.4}})
    measured = target_curve.study_curve(write_study(tmp_path / "noise", noise), "lamb")
    assert measured.source.endswith(
        "lamb, fitted on batches 32, 128, 512; noise-scale average B_simple 250 at batch 512 "
        "(the study's moving average at the target step, lagged toward early training: not a "
        "B_crit)"
    )
    unmeasured = dict(FIT, noise_scales={"lamb": {"batch_size": 512, "noise_scale": None}})
    diverged = target_curve.study_curve(write_study(tmp_path / "diverged", unmeasured), "lamb")
    assert diverged.source.endswith("lamb, fitted on batches 32, 128, 512")


def test_a_study_table_gives_the_rates_it_tuned_at_the_fitted_batches(tmp_path):
    curve = target_curve.study_curve(write_study(tmp_path / "study", table=TABLE), "lamb")
    assert curve.tuned == ((32, 0.0035, 135), (128, 0.007, 34), (512, 0.0141, 20))
    assert curve.tuned_at(128) == (0.007, 34) and curve.tuned_at(1024) is None
    assert curve.untuned == ()  # a table without untuned batches
    assert target_curve.study_curve(write_study(tmp_path / "old"), "lamb").tuned == ()
    # Untuned batches: their measured steps (None: missed), never a tuned rate.
    curve = target_curve.study_curve(write_study(tmp_path / "untuned", table=UNTUNED), "lamb")
    assert curve.tuned == ((32, 0.0035, 135), (128, 0.007, 34), (512, 0.0141, 20))
    assert curve.untuned == ((1024, 30.0, 0.0141, 20), (1437, None, 0.0141, 20))
    assert curve.tuned_at(1024) is None
    assert curve.measured_steps == {1024: 30.0}  # the tuned rows here carry no steps_mean
    bad = write_study(tmp_path / "bad", table=[{"optimizer": "lamb", "batch_size": 32}])
    with pytest.raises(ConfigError) as raised:
        target_curve.study_curve(bad, "lamb")
    assert str(raised.value) == (
        f"--target_study={bad}: {bad}/steps_to_target.json: rows[0].chosen_rate: missing."
    )
    no_steps = [dict(tuned_row("lamb", 1024, 0.0141, 20), tuned=False)]
    with pytest.raises(ConfigError) as raised:
        target_curve.study_curve(write_study(tmp_path / "no_steps", table=no_steps), "lamb")
    assert str(raised.value).endswith("steps_to_target.json: rows[0].steps_mean: missing.")


def test_s_min_with_b_crit_or_e_min():
    by_b_crit = target_curve.given_curve(100.0, 0.0, 1000.0)
    by_e_min = target_curve.given_curve(100.0, 100_000.0, 0.0)
    assert by_b_crit.e_min == by_e_min.e_min == 100_000.0
    assert by_b_crit.steps(250) == 100 + 400 == 500.0
    assert not by_b_crit.extrapolated(10**6)  # given, not measured: nothing to flag


def test_a_noise_scale_and_one_point():
    # S_1 = S_min (1 + B_noise / B_1): 300 = S_min (1 + 500 / 250) -> S_min 100, E_min 50,000
    curve = target_curve.noise_scale_curve(500.0, 300.0, 250)
    assert curve.s_min == pytest.approx(100.0) and curve.e_min == pytest.approx(50_000.0)
    assert curve.steps(1000) == pytest.approx(150.0)
    assert curve.measured == (250,) and curve.extrapolated(1000)


# --- a cell ------------------------------------------------------------------------------------
def test_a_cell_is_steps_times_the_step():
    options = settings(**CUSTOM)
    curve = target_curve.given_curve(100.0, 0.0, 1000.0)
    cell = tta.cell(options, curve, 1024, 4)
    # 256 images a device at 1,000/s; ring over 4 of one node: 2*3*5e-6 + 2*3/4 * 4e6 / 50e9
    step = 0.256 + 6 * 5e-6 + 1.5 * 4e6 / 50e9
    steps = 100 + 100_000 / 1024
    assert cell.step.step == pytest.approx(step, rel=1e-12)
    assert cell.seconds == pytest.approx(steps * step, rel=1e-12)
    assert cell.device_hours == pytest.approx(steps * step * 4 / 3600, rel=1e-12)


@pytest.mark.parametrize(
    "batch, devices, refused",
    [(1000, 3, "-"), (2, 4, "-"), (1024, 12, "-"), (2048, 4, "")],
    ids=["not divisible", "fewer images than devices", "partial node", "runs"],
)
def test_cells_that_cannot_run(batch, devices, refused):
    options = settings(**CUSTOM)
    curve = target_curve.given_curve(100.0, 0.0, 1000.0)
    assert tta.cell(options, curve, batch, devices).refused == refused


def test_a_batch_that_does_not_fit_accumulates_the_fewest_micro_batches():
    # 62 MB: the weights, gradients and slots take 60.07 MB, 18 float16 images fit (tight)
    options = settings(
        model="simple_cnn", image_size=28, device_memory_gb=0.062, global_batch_size=1, **ONE
    )
    per_image = tta.memory_estimate(options.profile(), 1, 2, 1.0).activations
    fixed = tta.memory_estimate(options.profile(), 0, 2, 1.0).total
    fits = int((0.062e9 - fixed) // per_image)
    assert fits == 18  # 64 images need 4 micro-batches of 16
    k = 4
    curve = target_curve.given_curve(10.0, 0.0, 100.0)
    cell = tta.cell(options, curve, 64, 1)
    assert cell.accumulation == k > 1
    one = tta.cell_step(options, 64 // k, 1)
    assert cell.step.compute == pytest.approx(k * one.compute, rel=1e-12)
    assert cell.step.fixed == one.fixed


def test_an_accumulated_step_hides_the_all_reduce_behind_its_last_micro_batch_only():
    # 2 devices of one node, 64 images each, 18 fit (above): 4 micro-batches of 16; a ring of
    # 2 at 50 GB/s: 2 * 5 us + 4 bytes x 4,290,984 parameters / 50 GB/s
    options = settings(
        model="simple_cnn",
        image_size=28,
        device_memory_gb=0.062,
        global_batch_size=2,
        devices=2,
        devices_per_node=2,
        algorithm="ring",
    )
    assert options.profile().parameters == 4_290_984
    comm = 2 * 5e-6 + 4 * 4_290_984 / 50e9
    micro = tta.cell_step(options, 32, 2)  # one micro-batch of 16 a device
    cell = tta.cell(options, target_curve.given_curve(10.0, 0.0, 100.0), 128, 2)
    assert cell.accumulation == 4
    assert cell.step.communication == pytest.approx(comm, rel=1e-12)
    hidden = 2 / 3 * micro.compute  # the backward pass of the last micro-batch
    assert cell.step.exposed_communication == pytest.approx(comm - hidden, rel=1e-9)
    assert cell.step.step == pytest.approx(4 * micro.compute + micro.fixed + comm - hidden)


def test_the_fastest_and_the_cheapest():
    options = settings(**CUSTOM, target_batches="256,1024", target_devices="1,4")
    curve = target_curve.given_curve(100.0, 0.0, 1000.0)
    cells = tta.grid(options, curve, tta.columns(options, None, frozenset()))
    comm = 6 * 5e-6 + 1.5 * 4e6 / 50e9
    seconds = {
        (256, 1): (100 + 100_000 / 256) * 0.256,
        (256, 4): (100 + 100_000 / 256) * (0.064 + comm),
        (1024, 1): (100 + 100_000 / 1024) * 1.024,
        (1024, 4): (100 + 100_000 / 1024) * (0.256 + comm),
    }
    got = {(c.batch, c.devices): c.seconds for row in cells for c in row}
    assert got == pytest.approx(seconds, rel=1e-12)
    fastest, cheapest = tta.best(cells)
    assert (fastest.batch, fastest.devices) == (256, 4)  # 491 steps x 64.2 ms = 31.5 s
    assert (cheapest.batch, cheapest.devices) == (256, 1)  # 125.7 s on one: 0.0349 device-h


def test_the_columns_are_the_devices_asked_for():
    line = measured_step.StepLine(0.0, 0.001, ((64, 0.064, "run"),), (2,), "--from_run")
    sweep = settings(**CUSTOM, target_devices="1,4")
    assert tta.columns(sweep, line, frozenset({"devices"})) == (1, 4)  # a sweep asked for
    options = settings(**CUSTOM)  # --devices=8
    assert tta.columns(options, line, frozenset({"devices"})) == (8,)
    assert tta.columns(options, line, frozenset()) == (2,)  # where the step was measured
    assert tta.columns(options, None, frozenset()) == (8,)


def test_the_table_stays_aligned_at_every_width():
    # a 62 MB device: 16,384 images on one take 1,024 micro-batches ("... a1024")
    options = settings(
        model="simple_cnn",
        image_size=28,
        device_memory_gb=0.062,
        global_batch_size=1,
        target_batches="64,16384",
        **ONE,
    )
    curve = target_curve.given_curve(100.0, 0.0, 1000.0)
    cells = tta.grid(options, curve, (1,))
    lines = tta._table(cells, curve, lambda c: f"{c.seconds:.0f}-seconds", "title")[1:]
    assert lines[-1].endswith("-seconds a1024") and len({len(line) for line in lines}) == 1
    # two spaces at least between columns, however wide their texts
    fields = [re.split(r"\s{2,}", line.strip()) for line in lines]
    assert [len(f) for f in fields] == [3, 3, 3] and fields[0] == ["batch", "S(B)", "1"]


def test_a_studys_own_trials_time_its_host(tmp_path):
    study = write_study(tmp_path / "study")

    def trial(batch, steps, seconds, strategy="default"):
        return {
            "config": {"strategy": strategy, "num_processes": 1},
            "row": {"optimizer": "lamb", "batch_size": batch, "steps": steps, "seconds": seconds},
        }

    # 50 ms a step at 32 (the median of three), 80 ms at 128: 40 ms + 0.3125 ms an image
    trials = [trial(32, 100, 5.0), trial(32, 10, 0.4), trial(32, 20, 2.0), trial(128, 50, 4.0)]
    path = os.path.join(study, "trials.jsonl")
    with open(path, "w") as f:
        f.write("\n".join(json.dumps(t) for t in trials) + "\n")
    line = measured_step.study_host_line(study, "lamb", {32, 128})
    assert [(b, d) for b, d, _ in line.points] == [(32, 0.05), (128, 0.08)]
    assert line.fixed == pytest.approx(0.04) and line.per_image == pytest.approx(0.0003125)
    assert line.devices == (1,)
    with open(path, "a") as f:
        f.write(json.dumps(trial(32, 10, 1.0, strategy="mirrored")) + "\n")
    assert measured_step.study_host_line(study, "lamb", {32, 128}) is None  # several devices


# --- measured runs -----------------------------------------------------------------------------
def test_one_run_is_taken_as_proportional_to_the_images_a_device(tmp_path):
    run = measured_step.read_run(write_run(tmp_path / "run", rate=500.0, batch=256))
    assert (run.replicas, run.accumulation, run.step_seconds) == (1, 1, 256 / 500)
    line = measured_step.runs_line([run], lambda run: 0.0, True)
    assert line.proportional and (line.fixed, line.per_image) == (0.0, 0.512 / 256)
    options = settings(**ONE, model="simple_cnn", image_size=28)
    assert tta.cell_step(options, 256, 1, 1, line).step == pytest.approx(0.512, rel=1e-12)
    assert tta.cell_step(options, 1024, 1, 1, line).step == pytest.approx(2.048, rel=1e-12)
    assert measured_step.line_text(line)[1].startswith(
        "fit       one batch measured: the step taken as proportional to the images a device"
    )


def test_two_runs_fit_the_fixed_and_the_per_image_time(tmp_path):
    # 100 ms + 1 ms an image: 164 ms at 64, 612 ms at 512 (b_half = 100 images a device)
    runs = [
        measured_step.read_run(write_run(tmp_path / str(b), rate=b / (0.1 + 0.001 * b), batch=b))
        for b in (64, 512)
    ]
    line = measured_step.runs_line(runs, lambda run: 0.0, True)
    assert line.fixed == pytest.approx(0.1, rel=1e-9)
    assert line.per_image == pytest.approx(0.001, rel=1e-9)
    assert line.half_batch == pytest.approx(100.0, rel=1e-9) and not line.proportional
    options = settings(**ONE, model="simple_cnn", image_size=28)
    assert tta.cell_step(options, 256, 1, 1, line).step == pytest.approx(0.356, rel=1e-9)
    # a third point off the line: the relative errors, not the seconds, are balanced
    third = (128, 0.228 * 1.1, "off")
    fixed, per_image = measured_step.relative_line([*line.points, third])
    points = [(b, d, (fixed + per_image * b - d) / d) for b, d, _ in [*line.points, third]]
    # the least squares' normal equations: sum e / d = 0 and sum b e / d = 0
    assert sum(e / d for _, d, e in points) == pytest.approx(0.0, abs=1e-9)
    assert sum(b * e / d for b, d, e in points) == pytest.approx(0.0, abs=1e-6)
    assert max(abs(e) for _, _, e in points) > 0.01  # off the line: a real fit
    slow_at_large = [(64, 0.2, "a"), (512, 0.1, "b")]
    with pytest.raises(ConfigError, match="the steps do not grow with the images a device"):
        measured_step.fit(slow_at_large, (1,), "--from_run")


def test_a_runs_replicas_come_from_the_flag_its_summary_or_its_checkpoint(tmp_path):
    summary = write_run(tmp_path / "summary", replicas=2)
    earlier = write_run(tmp_path / "earlier", replicas=4, recorded_in="checkpoint")
    read = measured_step.read_run
    assert [read(summary).replicas, read(earlier).replicas] == [2, 4]
    assert [read(summary, 8).replicas, read(earlier, 8).replicas] == [8, 8]
    with open(os.path.join(earlier, "checkpoints", "ckpt-0003.json"), "w") as f:
        f.write("{not json")  # the newest state unreadable: the one before it
    assert read(os.path.join(earlier, "summary.json")).replicas == 4


def test_a_run_on_two_replicas_keeps_the_communication_unscaled(tmp_path):
    run = measured_step.read_run(write_run(tmp_path / "run", rate=500.0, batch=256, replicas=2))
    options = settings(**dict(CUSTOM, model="simple_cnn", image_size=28))
    line = measured_step.runs_line(
        [run], lambda run: tta.communication_seconds(options, run.replicas), options.overlap
    )
    step = tta.cell_step(options, 256, 2, 1, line)
    # no overlap: measured = the device's time + the all-reduce (4 bytes a parameter)
    parameters = options.profile().parameters
    comm = 2 * 5e-6 + 4 * parameters / 50e9
    assert step.communication == pytest.approx(comm, rel=1e-12)
    assert line.points[0][1] == pytest.approx(0.512 - comm, rel=1e-12)
    assert step.step == pytest.approx(0.512, rel=1e-9)


def test_the_report_from_a_study_and_a_run(tmp_path):
    options = settings(
        target_study=write_study(tmp_path / "study"),
        target_optimizer="lamb",
        from_run=(write_run(tmp_path / "run"),),
        target_devices="1,2",
        **ONE,
    )
    text = tta.report(options, report.duration)
    lines = text.splitlines()
    assert lines[0] == (
        "time to accuracy 0.8 of simple_cnn on digits: S(B) = S_min + E_min / B = 20.0 + "
        "6,400 / B steps, B_crit = E_min / S_min = 320"
    )
    assert (
        f"step      simple_cnn at 28, measured (--from_run): {tmp_path}/run/summary.json: 500.0 "
        "images/s at batch 256 on 1"
    ) in lines
    assert "devices   1, 2 (--target_devices)" in lines
    rows = [line.split() for line in lines if line.lstrip().startswith(("32 ", "1,024*"))]
    assert rows[0][:2] == ["32", "220"] and rows[1][:2] == ["1,024*", "26.2"]  # 20 + 6400/1024
    assert "*: outside the batches fitted (32 .. 512): S(B) extrapolated" in lines
    assert "device time (devices x time to accuracy; / 3600 s: device-hours):" in lines
    assert report.duration(0.25) == "250 ms" and report.duration(4.25) == "4.2 s"
    assert not any(line.startswith("mismatch ") for line in lines)  # the run's model is the study's
    # Without a run the study's own model is planned, on --device's model.
    alone = settings(target_study=options.target_study, target_optimizer="lamb", **ONE)
    alone = tta.report(alone, report.duration)
    assert (
        "step      the planner's model of simple_cnn at 28 on a V100-SXM2-16GB (--device; "
        "fitted on 2 published ResNet-50 throughputs of a V100-SXM2-16GB in float16), no "
        "measured run (--from_run)"
    ) in alone.splitlines()
    assert "devices   1 (--devices' default; --target_devices for a sweep)" in alone.splitlines()
    # Another model: refused, unless asked for, and then said on every answer.
    other = dict(target_study=options.target_study, target_optimizer="lamb", **ONE)
    other = settings(**other, model="resnet18", image_size=32)
    with pytest.raises(ConfigError) as raised:
        tta.report(other, report.duration, frozenset({"model", "image_size"}))
    assert str(raised.value) == (
        "--model: the step would be timed for resnet18 at 32, but --target_study's steps to "
        "the target are simple_cnn's at 28: another model's curve; plan simple_cnn (leave out "
        "--model), or give --target_from_other_model to time this curve for it anyway."
    )
    with pytest.raises(ConfigError) as raised:  # the runs' model is the one timed
        tta.report(settings(**dict(vars(options), model="resnet18")), report.duration, {"model"})
    assert str(raised.value) == (
        "--model=resnet18: the --from_run runs trained simple_cnn at 28, and the step is "
        "theirs: leave out --model."
    )
    asked = dict(vars(other), target_from_other_model=True)
    crossed = tta.report(settings(**asked), report.duration, frozenset({"model"})).splitlines()
    mismatch = "curve of simple_cnn at 28, timed for resnet18 at 32"
    assert f"mismatch  {mismatch} (--target_from_other_model)" in crossed
    assert all(line.endswith(f"; {mismatch}") for line in crossed[-2:])
    assert lines[-2].startswith("fastest   batch ") and lines[-1].startswith("cheapest  batch ")
    assert not any(line.lstrip().startswith("2,048") for line in lines)  # > the 1,437 examples
    assert not any(line.startswith("rates ") for line in lines)  # no table: no rates
    # With the study's table: its tuned rates, and those of the choices where it tuned one.
    tuned = dict(vars(options), target_study=write_study(tmp_path / "tuned", table=TABLE))
    lines = tta.report(settings(**tuned), report.duration).splitlines()
    assert lines[2] == (
        "rates     the study's tuned peak rate and schedule length by batch: 32: 0.0035 over "
        "135 steps, 128: 0.007 over 34 steps, 512: 0.0141 over 20 steps"
    )
    expected = {32: "0.0035 over a 135", 128: "0.007 over a 34", 512: "0.0141 over a 20"}
    for line in lines[-2:]:  # fastest, cheapest
        batch = int(line.split()[2].replace(",", ""))
        assert line.endswith(
            f"; peak rate {expected[batch]}-step schedule (tuned by the study)"
            if batch in expected
            else "; the study tuned no rate at this batch"
        ), line
    # With untuned batches: the steps measured there beside S(B); a choice at
    # one of them says what the study ran there.
    untuned = dict(tuned, target_study=write_study(tmp_path / "untuned", table=UNTUNED))
    lines = tta.report(settings(**untuned), report.duration).splitlines()
    assert lines[3] == (
        "untuned   the study's batches run at the batch before's choice, not fitted: 1,024: 30 "
        "steps at 0.0141 over 20 steps (S(B) 26.2), 1,437: not reached at 0.0141 over 20 steps "
        "(S(B) 24.5)"
    )
    only = settings(**dict(untuned, target_batches="1024"))
    for line in tta.report(only, report.duration).splitlines()[-2:]:  # fastest, cheapest
        assert line.split()[2] == "1,024" and line.endswith(
            "; the study tuned no rate at this batch (30 steps at 0.0141 over 20 steps, untuned)"
        ), line


# --- bad input: one line naming the flag and the file --------------------------------------------
def _main(monkeypatch, capsys, **values):
    options = settings(**values)
    monkeypatch.setattr(cli.settings, "options_from_flags", lambda schema: options)
    with pytest.raises(SystemExit) as stopped:
        cli.main(["keras-lars-plan"])
    assert capsys.readouterr().out == ""
    return str(stopped.value.code)


def test_bad_studies_are_one_line(tmp_path, monkeypatch, capsys):
    missing = str(tmp_path / "missing")
    assert _main(monkeypatch, capsys, target_study=missing) == (
        f"error: --target_study={missing}: no such directory."
    )
    empty = str(tmp_path / "empty")
    os.makedirs(empty)
    assert _main(monkeypatch, capsys, target_study=empty) == (
        f"error: --target_study={empty}: {empty}/fit.json: cannot read it: No such file or "
        "directory."
    )
    study = write_study(tmp_path / "study")
    path = f"{study}/fit.json"
    assert _main(monkeypatch, capsys, target_study=study) == (
        f"error: --target_optimizer: the study {path} has several optimizers (lamb, sgd): name one."
    )
    assert _main(monkeypatch, capsys, target_study=study, target_optimizer="adam") == (
        f"error: --target_optimizer=adam: the study {path} has no adam (it has lamb, sgd)."
    )
    assert _main(monkeypatch, capsys, target_study=study, target_optimizer="sgd") == (
        f"error: --target_optimizer=sgd: the study {path} has no fit for sgd: fewer than 3 "
        "batches where every seed reached the target."
    )
    with open(path, "w") as f:
        f.write("{")
    message = _main(monkeypatch, capsys, target_study=study)
    assert message.startswith(f"error: --target_study={study}: {path}: it is not JSON: ")
    assert "\n" not in message


def test_bad_curves_and_runs_are_one_line(tmp_path, monkeypatch, capsys):
    assert _main(monkeypatch, capsys, target_b_crit=100.0) == (
        "error: --target_s_min=0: must be > 0 with --target_b_crit or --target_e_min."
    )
    assert _main(monkeypatch, capsys, target_s_min=10.0) == (
        "error: --target_s_min: give one of --target_b_crit and --target_e_min with it "
        "(given: --target_b_crit=0, --target_e_min=0)."
    )
    assert _main(monkeypatch, capsys, target_noise_scale=100.0, target_measured_batch=32) == (
        "error: --target_measured_steps=0: must be > 0 (--target_noise_scale needs "
        "--target_measured_steps and --target_measured_batch: the steps one run took to the "
        "target at that batch)."
    )
    with pytest.raises(ConfigError, match=r"^--target_s_min=-1.0: must be > 0 \(0: not given\)\.$"):
        settings(target_s_min=-1.0)
    given = dict(target_s_min=10.0, target_b_crit=100.0)
    missing = str(tmp_path / "nothing")
    assert _main(monkeypatch, capsys, **given, from_run=(missing,)) == (
        f"error: --from_run={missing}: cannot read it: No such file or directory."
    )
    untimed = write_run(tmp_path / "untimed", rate=None)
    assert _main(monkeypatch, capsys, **given, from_run=(untimed,)) == (
        f"error: --from_run={untimed}: summary.json: no train_images_per_second (no epoch of "
        "the run was timed): train at least 2 epochs, or a longer epoch."
    )
    unknown = write_run(tmp_path / "unknown", replicas=0)
    assert _main(monkeypatch, capsys, **given, from_run=(unknown,)) == (
        f"error: --from_run={unknown}: summary.json: the run's replica count is not "
        "recorded (no layout in it or in a checkpoints/ckpt-*.json beside it): give "
        "--from_run_devices."
    )
    assert _main(monkeypatch, capsys, **given, layers=True) == (
        "error: --target_s_min: time to accuracy plans its own batch x devices grid: not with "
        "--layers."
    )
    accumulated = write_run(tmp_path / "accumulated", batch=256, gradient_accumulation_steps=3)
    assert _main(monkeypatch, capsys, **given, from_run=(accumulated,)) == (
        f"error: --from_run={accumulated}: summary.json: global batch 256 does not divide "
        "into 1 replicas x 3 micro-batches (--from_run_devices?)."
    )
    phased = write_run(tmp_path / "phased", batch_schedule="0:64,2:128")
    assert _main(monkeypatch, capsys, **given, from_run=(phased,)) == (
        f"error: --from_run={phased}: summary.json: config.batch_schedule: the run changed its "
        "batch (0:64,2:128): its throughput is not one batch's."
    )
    with pytest.raises(ConfigError) as raised:
        settings(target_batches="64,lots")
    assert str(raised.value) == (
        "--target_batches=64,lots: must be whole numbers >= 1, separated by commas: 'lots' is "
        "not a whole number >= 1."
    )
    assert _main(monkeypatch, capsys, **given, target_noise_scale=5.0) == (
        "error: --target_s_min: one source of steps to the target, not also --target_noise_scale."
    )


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STUDY = "docs/batch_study/fashion_mnist_steps"  # committed; the page's paths are relative


def _page_block(name):
    """(the command, the printed lines) of planning.md's transcript `name`."""
    with open(os.path.join(ROOT, "docs", "planning.md")) as f:
        page = f.read()
    block = page.split(f"<!-- time to accuracy {name}")[1].split("```\n", 1)[1]
    command, printed = block.split("```\n")[0].split("\n", 1)
    return command, printed


def test_the_planning_page_examples_are_what_the_planner_prints(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    lars = dict(target_study=STUDY, target_optimizer="lars")
    command, printed = _page_block("example:")
    assert command == f"$ keras-lars-plan --target_study={STUDY} --target_optimizer=lars"
    assert printed == tta.report(settings(**lars), report.duration) + "\n"
    # --devices=8: the table and the answers, the lines between them left out
    command, printed = _page_block("on 8 devices:")
    assert command.endswith("--target_optimizer=lars --devices=8")
    text = tta.report(settings(**lars, devices=8), report.duration, frozenset({"devices"}))
    shown, answers = printed.split("...\n", 1)[1].split("\n...\n")
    assert f"\n{shown}\n" in text and text.endswith(answers.rstrip("\n"))
    # two runs, as the page's commands recorded them (2026-12-07), replayed
    command, printed = _page_block("from runs:")
    assert command.endswith("--from_run=/tmp/run64,/tmp/run512")
    runs = tuple(
        write_run(tmp_path / f"run{batch}", rate=rate, batch=batch)
        for batch, rate in ((64, 511.5), (512, 539.24))
    )
    text = tta.report(settings(**lars, from_run=runs), report.duration)
    shown, answers = printed.split("...\n", 1)[1].split("\n...\n")
    text = text.replace(str(tmp_path), "/tmp")
    assert f"\n{shown}\n" in text and text.endswith(answers.rstrip("\n"))


def test_the_program_prints_the_grid(tmp_path):
    study = write_study(tmp_path / "study")
    flags = (f"--target_study={study}", "--target_optimizer=lamb", "--target_devices=1,2")
    status, out, err = run_plan(*flags)
    assert status == 0 and err == "", err
    given = frozenset({"target_study", "target_optimizer", "target_devices"})
    options = settings(target_study=study, target_optimizer="lamb", target_devices="1,2")
    assert out == tta.report(options, report.duration, given) + "\n"
    assert out.startswith("time to accuracy 0.8 of simple_cnn on digits: ")


@pytest.mark.subprocess
def test_the_console_script_ends_bad_input_in_one_line_exit_1(tmp_path):
    """The program's own processes: a study's error after Keras loads, and a
    value absl refuses before it."""
    study = write_study(tmp_path / "study")

    def plan(*flags):
        return subprocess.run(
            [sys.executable, "-m", "keras_lars.tools.plan", *flags],
            capture_output=True,
            text=True,
            timeout=300,
        )

    bad = plan(f"--target_study={study}", "--target_optimizer=adam")
    assert bad.returncode == 1 and bad.stdout == ""
    assert bad.stderr.strip().splitlines()[-1] == (
        f"error: --target_optimizer=adam: the study {study}/fit.json has no adam (it has "
        "lamb, sgd)."
    )
    assert "Traceback" not in bad.stderr
    unknown = plan("--model=resnet9000")
    assert unknown.returncode == 1 and "FATAL" not in unknown.stderr
    assert (
        unknown.stderr.strip()
        .splitlines()[-1]
        .startswith("error: flag --model=resnet9000: value should be one of <resnet18|")
    )
