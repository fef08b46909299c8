"""The planner's batch and image-size schedules (--batch_schedule,
--image_size_schedule; tools/plan/phased_plan.py): a phase is the plain plan of
its batch, image size and epochs, the run their sum, and a phase that cannot
run is refused by name."""

import importlib.util
import os

import pytest

from keras_lars.tools import plan
from keras_lars.tools.plan import report
from keras_lars.tools.settings import ConfigError
from tests.plan_tool import run_plan

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N = 1_281_167  # ImageNet's training examples, the default --examples

# A model of given totals at a measured rate, on 2 nodes of 8 joined by a ring:
# step = b / 1000 + 2 (p - 1) alpha + 2 (p - 1) / p * n / bandwidth (no overlap)
MEASURED = dict(
    model="custom",
    parameters=25_000_000,
    forward_gflops=4.0,
    images_per_second=1000.0,
    devices=16,
    devices_per_node=8,
    algorithm="ring",
    overlap=False,
)
RING = 2 * 15 * 5e-6 + 2 * 15 / 16 * (25_000_000 * 4) / 12.5e9  # 0.01515 s


def test_one_phase_is_the_plain_plan():
    plain = plan.PlanSettings(devices=64, global_batch_size=8192)
    phased = plan.PlanSettings(devices=64, batch_schedule="0:8192")
    (phase,) = phased.phased_plan().phases
    assert phase.run == plain.run()
    assert phase.memory == plain.memory()
    assert phased.phased_plan().seconds == plain.run().seconds


def test_two_phases_sum_their_closed_form_steps():
    options = plan.PlanSettings(**MEASURED, batch_schedule="0:4096,30:8192")
    first, second = options.phased_plan().phases
    assert (first.run.steps, second.run.steps) == (30 * 312, 60 * 156)  # floor(N / B) = 312, 156
    assert first.run.step.step == pytest.approx(256 / 1000 + RING, rel=1e-12)
    assert second.run.step.step == pytest.approx(512 / 1000 + RING, rel=1e-12)
    expected = 9360 * (0.256 + RING) + 9360 * (0.512 + RING)
    assert options.phased_plan().seconds == pytest.approx(expected, rel=1e-12)
    assert options.phased_plan().steps == 18720


def test_two_phases_sum_the_two_single_batch_plans():
    options = plan.PlanSettings(**MEASURED, batch_schedule="0:4096,30:8192")
    alone = [
        plan.PlanSettings(**MEASURED, global_batch_size=4096, epochs=30).run().seconds,
        plan.PlanSettings(**MEASURED, global_batch_size=8192, epochs=60).run().seconds,
    ]
    assert options.phased_plan().seconds == pytest.approx(sum(alone), rel=1e-12)


def test_steps_per_phase_are_its_epochs_times_floor_n_over_b():
    options = plan.PlanSettings(devices=128, batch_schedule="0:4096,30:8192,60:16384", epochs=85.5)
    steps = [phase.run.steps for phase in options.phased_plan().phases]
    # 312, 156, 78 steps an epoch; the last phase's 25.5 epochs round to whole steps
    assert steps == [30 * 312, 30 * 156, 1989]
    assert [N // b for b in (4096, 8192, 16384)] == [312, 156, 78]


def test_each_phase_computes_and_holds_at_its_image_size():
    options = plan.PlanSettings(devices=64, image_size_schedule="0:128,40:224")
    assert options.image_size == 128  # at its default, --image_size takes the first phase's
    small, large = options.phased_plan().phases
    for phase, size, epochs in ((small, 128, 40.0), (large, 224, 50.0)):
        alone = plan.PlanSettings(devices=64, image_size=size, epochs=epochs)
        assert phase.run == alone.run()
        assert phase.memory == alone.memory()
    # the same gradients every step; the compute and activations grow with the area
    assert small.run.step.communication == large.run.step.communication
    assert 2.5 < large.run.step.compute / small.run.step.compute < (224 / 128) ** 2
    assert large.memory.activations / small.memory.activations == pytest.approx(
        (224 / 128) ** 2, rel=0.05
    )


def test_the_flags_merge_into_phases_where_either_changes():
    options = plan.PlanSettings(
        devices=128,
        batch_schedule="0:4096,30:8192,60:16384",
        image_size_schedule="0:128,40:192,80:224",
    )
    spans = [
        (s.first_epoch, s.end_epoch, s.global_batch, s.image_size) for s in options.phase_spans()
    ]
    assert spans == [
        (0, 30, 4096, 128),
        (30, 40, 8192, 128),
        (40, 60, 8192, 192),
        (60, 80, 16384, 192),
        (80, 90.0, 16384, 224),
    ]


def test_the_phased_report_starts_with_its_assumptions_and_ends_with_the_total():
    options = plan.PlanSettings(devices=64, batch_schedule="0:4096,30:8192")
    lines = plan.report_text(options).splitlines()
    assert lines[0] == "assumes"
    assert lines[5] == "  batch         4,096 -> 8,192 = 64 x 64 -> 128 (--batch_schedule)"
    assert lines[6] == "  image size    224 (--image_size)"
    rows = lines[lines.index(report.PHASE_HEADER) + 1 :]
    assert rows[0].split()[:6] == ["1", "0-30", "4,096", "64", "224", "9,360"]
    assert rows[1].split()[:6] == ["2", "30-90", "8,192", "128", "224", "9,360"]
    seconds = options.phased_plan().seconds
    assert rows[2].split() == ["total", "0-90", "18,720", *plan.duration(seconds).split()]
    assert rows[3].split()[:5] == ["time", "to", "train", *plan.duration(seconds).split()]
    assert len(rows) == 4


def test_a_tight_phase_says_so_in_its_row():
    options = plan.PlanSettings(devices=8, batch_schedule="0:1024,30:1440")  # 180 a device
    rows = plan.phased_text(options).splitlines()
    assert rows[-4].endswith("GB fits") and rows[-3].endswith("GB tight")


# --- refusals -------------------------------------------------------------------------------
def test_a_phase_that_does_not_fit_is_planned_with_a_warning_naming_it():
    options = plan.PlanSettings(devices=8, batch_schedule="0:1024,30:8192")
    assert options.memory_warnings() == [
        "warning: --batch_schedule=0:1024,30:8192: phase 2 (epochs 30-90: global batch 8,192, "
        "image size 224): 1024 images a device need 80.9 GB by the memory estimate, more than "
        "the 16.0 GB of --device_memory_gb / --device; the estimate keeps every layer's output "
        "(an upper bound), so the plan goes on: lower the batch or raise --devices if the run "
        "does not fit."
    ]
    assert plan.phased_text(options).splitlines()[-3].endswith("GB does not fit")


def test_an_image_size_that_does_not_fit_is_a_warning_naming_it():
    options = plan.PlanSettings(
        devices=8, global_batch_size=1024, image_size_schedule="0:224,30:448"
    )
    (warning,) = options.memory_warnings()
    assert warning.startswith(
        "warning: --image_size_schedule=0:224,30:448: phase 2 (epochs 30-90: global batch "
        "1,024, image size 448): 128 images a device need "
    )


def test_a_batch_the_devices_do_not_divide_is_refused_by_name():
    with pytest.raises(ConfigError) as error:
        plan.PlanSettings(devices=64, batch_schedule="0:4096,30:8200")
    assert str(error.value) == (
        "--batch_schedule=0:4096,30:8200: phase 2 (epochs 30-90: global batch 8,200, image "
        "size 224): the global batch is not divisible by --devices (64)."
    )


@pytest.mark.parametrize(
    "values, message",
    [
        (
            dict(batch_schedule="0:4096,x"),
            "--batch_schedule=0:4096,x: batch schedule phase 2 'x': expected epoch:global "
            "batch, two whole numbers (e.g. 30:1024).",
        ),
        (
            dict(batch_schedule="30:4096"),
            "--batch_schedule=30:4096: batch schedule phase 1 (epoch 30): the first phase must "
            "start at epoch 0.",
        ),
        (
            dict(batch_schedule="0:4096,30:2048,20:8192"),
            "--batch_schedule=0:4096,30:2048,20:8192: batch schedule phase 3 (epoch 20): "
            "epochs must increase; phase 2 starts at epoch 30.",
        ),
        (
            dict(batch_schedule="0:4096,95:8192"),
            "--batch_schedule=0:4096,95:8192: phase 2 starts at epoch 95, at or beyond "
            "--epochs=90.",
        ),
        (
            dict(batch_schedule="0:4096", epochs=0.0),
            "--batch_schedule=0:4096: needs --epochs > 0 (0: the recipe's epochs, which are for "
            "one batch).",
        ),
        (
            dict(batch_schedule="0:4096", global_batch_size=2048),
            "--batch_schedule=0:4096: the first phase's batch 4096 differs from "
            "--global_batch_size=2048 (leave that at its default or make them equal).",
        ),
        (
            dict(devices=1, devices_per_node=1, batch_schedule="0:2000000"),
            "--batch_schedule=0:2000000: batch schedule phase 1 (epoch 0): the global batch "
            "2000000 exceeds the 1281167 training examples: an epoch would have no step.",
        ),
        (
            dict(image_size_schedule="0:128,40:3"),
            "--image_size_schedule=0:128,40:3: phase 2: the image size 3 must be >= 7.",
        ),
        (
            dict(image_size_schedule="0:128,forty:192"),
            "--image_size_schedule=0:128,forty:192: image size schedule phase 2 'forty:192': "
            "expected epoch:image size, two whole numbers (e.g. 30:1024).",
        ),
        (
            dict(model="alexnet", image_size_schedule="0:128,40:192"),
            "--image_size_schedule=0:128,40:192: --model=alexnet flattens a feature map of one "
            "size; use a resnet (global pooling takes any size).",
        ),
        (
            dict(batch_schedule="0:4096", layers=True),
            "--layers=True: plans one batch and image size: not with --batch_schedule / "
            "--image_size_schedule.",
        ),
    ],
)
def test_bad_schedules_name_the_flag_in_one_line(values, message):
    with pytest.raises(ConfigError) as error:
        plan.PlanSettings(**values)
    assert str(error.value) == message


def test_a_bad_schedule_ends_the_program_in_one_line():
    status, out, err = run_plan("--batch_schedule=0:4096,30:8200")
    assert status == 1 and out == ""
    assert err == (
        "error: --batch_schedule=0:4096,30:8200: phase 2 (epochs 30-90: global batch 8,200, "
        "image size 224): the global batch is not divisible by --devices (64).\n"
    )


# --- the worked example of docs/planning.md ------------------------------------------------
def _generator():
    spec = importlib.util.spec_from_file_location(
        "docs_generate", os.path.join(ROOT, "docs", "generate.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_mikami_example_plans_the_records_hardware_and_batches():
    generator = _generator()
    options = generator.plan_options([flag for line in generator.MIKAMI2018 for flag in line])
    rec = plan.record("mikami2018")
    for name in ("device", "devices", "devices_per_node", "algorithm", "overlap", "epochs"):
        assert getattr(options, name) == getattr(rec, name), name
    assert (options.activation_dtype, options.gradient_dtype) == (
        rec.activation_dtype,
        rec.gradient_dtype,
    )
    assert options.intra_node_bandwidth * plan.GB == rec.intra_bandwidth
    assert options.inter_node_bandwidth * plan.GB == rec.inter_bandwidth
    spans = options.phase_spans()
    assert [span.global_batch for span in spans] == [rec.global_batch, rec.grown_batch]
    assert spans[1].first_epoch == rec.switch_epoch  # the record's nominal switch
    # the same plan as the record's own under the V100's calibration
    record_plan = plan.predict_record(rec, plan.PER_DEVICE)
    assert options.phased_plan().seconds == pytest.approx(record_plan.seconds, rel=1e-12)


def test_the_planning_page_shows_the_programs_own_output():
    generator = _generator()
    argv = [flag for line in generator.MIKAMI2018 for flag in line]
    status, out, err = run_plan(*argv)
    assert status == 0 and err == "", err
    with open(os.path.join(ROOT, "docs", "planning.md")) as f:
        page = f.read()
    assert out in page
    assert out.splitlines()[-1].startswith("time to train")
