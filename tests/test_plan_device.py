"""The planner's device model: the batch-dependent efficiency and the fixed
per-step cost, their calibration from throughputs, the memory verdict, the
defaults and what the output says it assumes."""

import pytest

from keras_lars.tools import plan
from keras_lars.tools.plan import records_table
from keras_lars.tools.settings import ConfigError
from tests.plan_tool import run_plan

TOY = plan.custom_profile(parameters=1_000_000, forward_flops=1e9)  # 3e9 FLOPs a trained image
SPEC = plan.DeviceSpec("toy", {"float16": 1e12}, 1e11, 1e9, "made up")


def test_efficiency_and_fixed_cost_enter_the_step():
    device = plan.Device(peak_flops=1e12, utilization=0.5, half_batch=5, fixed_step_seconds=0.01)
    # (b + b_half) t_image / u = (10 + 5) * 3e-3 / 0.5
    assert device.compute_seconds(TOY, 10) == pytest.approx(0.09)
    assert device.fill(10) == pytest.approx(10 / 15)
    cluster = plan.Cluster(1, 1, 1e9, 0.0, 1e9, 0.0, "ring")
    step = plan.step_time(TOY, 10, device, cluster)
    assert step.step == pytest.approx(0.09 + 0.01)
    assert step.efficiency == 1.0  # one device: nothing to wait for


def test_update_seconds_closed_form():
    # 7 float32 passes over 25.6M parameters at 900 GB/s
    assert plan.update_seconds(25_600_000, 900e9) == pytest.approx(7 * 4 * 25.6e6 / 900e9)
    assert plan.update_seconds(25_600_000, 0.0) == 0.0


def test_fit_line_recovers_a_line():
    # b / r = 0.01 + 0.002 b at b = 10 and 40
    points = [(10, 10 / 0.03), (40, 40 / 0.09)]
    assert plan.fit_line(points) == (pytest.approx(0.01), pytest.approx(0.002))
    with pytest.raises(ValueError):
        plan.fit_line([(10, 100.0), (10, 110.0)])


def test_this_machines_throughputs_lie_on_the_line():
    # benchmark_train at 64x64 here: 8.3, 19.2, 24.3 images/s at 2, 8, 32 images a step
    intercept, slope = plan.fit_line(plan.HERE)
    assert intercept == pytest.approx(0.1495, abs=0.001)  # seconds every step pays
    assert slope == pytest.approx(0.03633, abs=0.0001)  # seconds an image
    assert intercept / slope == pytest.approx(4.1, abs=0.1)  # b_half: images to half speed
    for batch, rate in plan.HERE:
        assert batch / (intercept + slope * batch) == pytest.approx(rate, rel=0.09)


def _rates(batches, utilization, half_batch):
    """Images/s of TOY on SPEC: b / (c_fixed + (b + b_half) t_image / u)."""
    fixed = 7 * 4 * 1_000_000 / 1e11  # 2.8e-4 s
    return [
        plan.Throughput(
            "toy", "float16", b, b / (fixed + (b + half_batch) * 3e-3 / utilization), ""
        )
        for b in batches
    ]


def test_calibrate_from_two_batch_sizes_gives_u_half_batch_and_fixed():
    calibration = plan.calibrate(SPEC, "float16", TOY, _rates((10, 40), 0.5, 5.0))
    assert calibration.utilization == pytest.approx(0.5)
    assert calibration.half_batch == pytest.approx(5.0)
    assert calibration.fixed_step_seconds == pytest.approx(2.8e-4)


def test_calibrate_from_one_batch_size_gives_u_only():
    calibration = plan.calibrate(SPEC, "float16", TOY, _rates((10,), 0.25, 0.0))
    assert calibration.utilization == pytest.approx(0.25)
    assert calibration.half_batch == 0.0
    assert plan.calibrate(SPEC, "float32", TOY, _rates((10,), 0.25, 0.0)) is None


def test_default_v100_utilization_is_fitted_on_its_published_throughputs():
    options = plan.PlanSettings()
    assert options.device == "V100-SXM2-16GB"
    profile = plan.model_profile("resnet50")
    t_image = profile.image_seconds(125e12, 900e9, 2)
    fixed = 7 * 4 * 25_557_032 / 900e9
    # NVIDIA's 1,376 images/s at 192 a GPU; MLPerf v0.6's 60 epochs in 6,913 s on 8 at 208
    rates = [(192, 1376.0), (208, 60 * 1_281_167 / 6913.2 / 8)]
    slope = sum((b / r - fixed) / b for b, r in rates) / 2
    utilization, half, fixed_seconds, source = options.device_settings()
    assert utilization == pytest.approx(t_image / slope)
    assert (half, fixed_seconds) == (0.0, pytest.approx(fixed))
    assert source.startswith("fitted on 2 published ResNet-50 throughputs")
    # so a V100 at 192 images trains ~1,380 images/s (the issue: 638 before)
    run = plan.PlanSettings(devices=1, devices_per_node=1, global_batch_size=128).run()
    assert 128 / run.step.step == pytest.approx(1380, rel=0.03)


def test_devices_without_throughputs_fall_back_to_the_records_utilization():
    options = plan.PlanSettings(device="TPU v3", activation_dtype="bfloat16")
    utilization, _, _, source = options.device_settings()
    assert utilization == plan.CALIBRATED_UTILIZATION and "goyal2017" in source


# --- memory --------------------------------------------------------------------------------
LAYERS = plan.ModelProfile(
    "two",
    (
        plan.LayerProfile("a", "Dense", 600, 1200, 10, 100),
        plan.LayerProfile("b", "Dense", 400, 800, 100, 50),
    ),
)


@pytest.mark.parametrize(
    "capacity, verdict", [(20_000, "fits"), (17_000, "tight"), (16_000, "does not fit")]
)
def test_memory_estimate_closed_form_and_verdict(capacity, verdict):
    estimate = plan.memory_estimate(LAYERS, 8, 2, capacity)
    # weights 1000 (4 + 2), gradients 1000 * 4, one slot 1000 * 4, 8 images * 150 outputs * 2
    assert (estimate.weights, estimate.gradients, estimate.slots, estimate.activations) == (
        6000,
        4000,
        4000,
        2400,
    )
    assert estimate.total == 16_400 and estimate.verdict == verdict


def test_largest_batch_closed_form():
    # 0.9 * 20000 - 14000 = 4000 bytes for images of 150 * 2 bytes
    assert plan.largest_batch(LAYERS, 2, 20_000) == 13
    assert plan.largest_batch(LAYERS, 2, 10_000) == 0
    # a model given by its totals has no activations: any batch, once its weights fit
    totals = plan.custom_profile(parameters=1000, forward_flops=1e6)
    assert plan.largest_batch(totals, 2, 20_000) > 10**12
    assert plan.largest_batch(totals, 2, 15_000) == 0  # 14,000 bytes > 0.9 x 15,000


def test_custom_model_plans_with_the_default_batch():
    options = plan.PlanSettings(model="custom", parameters=110_000_000, forward_gflops=22)
    assert options.batch == 64 * 128
    with pytest.raises(ConfigError, match=r"^--device=V100-SXM2-16GB: not one image"):
        plan.PlanSettings(model="custom", parameters=2_000_000_000, forward_gflops=1)


def test_records_table_text_and_inputs():
    text = plan.records_text().splitlines()
    assert text[1].split()[-7:] == ["u", "LOO", "(range)", "verdict", "(a)", "/", "(b)"]
    assert text[-4].startswith("(a) one u: 6 of 18 scored records within +-30%")
    assert text[-3].startswith("(b) per device: 1 of 8 scored records within +-30%")
    assert text[-2].startswith(
        "leave-one-out: each of the 18 scored records predicted at the u fitted on the other 17"
    )
    jia = records_table._inputs_text(plan.record("jia2018"))
    assert jia == "varied: activation_dtype, overlap; assumed: devices_per_node"
    assert records_table._inputs_text(plan.record("goyal2017")) == "all published"


def test_a_batch_that_fits_and_one_that_does_not():
    fits = plan.PlanSettings(devices=8, global_batch_size=1024)
    assert fits.memory().verdict == "fits"
    assert "a device: fits" in plan.plan_text(fits)
    over = plan.PlanSettings(devices=8, global_batch_size=8192)  # planned, with a warning
    (message,) = over.memory_warnings()
    assert message == (
        "warning: --global_batch_size=8192: 1024 images a device need 80.9 GB by the memory "
        "estimate, more than the 16.0 GB of --device_memory_gb / --device; the estimate keeps "
        "every layer's output (an upper bound), so the plan goes on: lower the batch or raise "
        "--devices if the run does not fit."
    )
    assert "a device: does not fit" in plan.plan_text(over)
    # the same batch fits an 80 GB device? no: 1024 images need more than 80 GB too
    roomy = plan.PlanSettings(devices=8, global_batch_size=2048, device="A100-SXM4-80GB")
    assert roomy.memory().verdict == "fits"


def test_the_batch_of_the_devices_own_calibration_is_planned_with_a_warning():
    # NVIDIA's MLPerf v0.6 DGX-1 trains 208 images a 16 GB V100 (calibration.THROUGHPUTS); the
    # estimate, every output kept: 25,557,032 x (4 + 2 + 4 + 4) bytes + 208 x 39.3M x 2 bytes
    assert any(t.batch == 208 for t in plan.THROUGHPUTS if t.device == "V100-SXM2-16GB")
    options = plan.PlanSettings(devices=8, global_batch_size=8 * 208)
    expected = 25_557_032 * 14 + 208 * 39.3e6 * 2
    assert options.memory().total == pytest.approx(expected, rel=2e-3)  # 16.7 GB > 16.0
    (warning,) = options.memory_warnings()
    assert warning.startswith(
        "warning: --global_batch_size=1664: 208 images a device need 16.7 GB by the memory "
        "estimate, more than the 16.0 GB"
    )
    assert plan.PlanSettings(devices=8, global_batch_size=8 * 192).memory_warnings() == []


# --- defaults ------------------------------------------------------------------------------
def test_default_batch_is_128_a_device_or_what_fits():
    assert plan.PlanSettings().batch == 64 * 128
    assert plan.PlanSettings(devices=8).batch == 8 * 128
    # float32 activations: 128 images need ~21 GB of a 16 GB V100; 64 fit
    assert plan.PlanSettings(devices=8, activation_dtype="float32").batch == 8 * 64
    assert plan.PlanSettings().epochs == 90


def test_default_epochs_do_not_grow_with_the_batch():
    options = plan.PlanSettings(devices=256)
    small, large = options.run(32768), options.run(65536)
    assert small.epochs == large.epochs == 90
    assert (small.steps, large.steps) == (90 * (1_281_167 // 32768), 90 * (1_281_167 // 65536))
    assert large.seconds < small.seconds  # the same images, fewer fixed costs and all-reduces


def test_the_output_starts_with_what_it_assumes():
    text = plan.plan_text(plan.PlanSettings(devices=8)).splitlines()
    assert text[0] == "assumes"
    for line, flag in zip(text[1:5], ("--device", "--utilization", "--epochs", "--overlap")):
        assert flag in line, line
    assert text[5] == "  batch         1,024 = 8 x 128 (the default)"


@pytest.mark.parametrize(
    "half_batch, printed",
    [(-1.0, "0.0"), (4.14, "4.1"), (1234.56, "1,234.6")],  # -1: the V100's calibrated 0
)
def test_the_half_speed_batch_is_printed_with_one_decimal(half_batch, printed):
    speed = plan.plan_text(plan.PlanSettings(devices=8, half_batch=half_batch)).splitlines()[2]
    assert speed.endswith(f"half speed at {printed} images (--half_batch)"), speed


def test_devices_8_prints_its_assumptions_and_a_memory_verdict():
    status, out, err = run_plan("--devices=8")
    assert status == 0 and err == "", err
    lines = out.splitlines()
    assert lines[0] == "assumes" and "V100-SXM2-16GB" in lines[1]
    memory = next(line for line in lines if line.startswith("memory"))
    assert memory.startswith("memory    10.4 GB of 16.0 GB a device: fits")


def test_a_batch_that_does_not_fit_is_planned_with_one_warning_line():
    """In this process (tests/test_plan_target.py runs the program's own)."""
    status, out, err = run_plan("--devices=8", "--global_batch_size=8192")
    assert status == 0, err
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and err == warnings[0] + "\n"
    assert warnings[0].startswith("warning: --global_batch_size=8192: 1024 images a device need ")
    memory = next(line for line in out.splitlines() if line.startswith("memory"))
    assert memory.startswith("memory    80.9 GB of 16.0 GB a device: does not fit")
