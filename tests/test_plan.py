"""The time-to-train planner (keras_lars.tools.plan): the all-reduce cost models
against their closed forms, the model accounting against independent counts,
the step arithmetic, the per-layer report, bad settings, and the published
records (their sources, ranges and leave-one-out: tests/test_plan_records.py;
the device model and memory: tests/test_plan_device.py; pipelines:
tests/test_plan_pipeline.py)."""

import os
import subprocess
import sys

import pytest

from keras_lars.recipes import IMAGENET_TRAIN_EXAMPLES
from keras_lars.recipes import epochs_to_steps
from keras_lars.tools import plan
from keras_lars.tools.settings import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MB = 1e6


# --- cost models against hand-computed closed forms ---------------------------------------
def test_ring_allreduce_closed_form():
    # 2 (p-1) alpha + 2 (p-1)/p n beta = 6e-5 + 1.5 * 100e6 * 1e-9
    assert plan.ring_allreduce(100 * MB, 4, 1e-5, 1e-9) == pytest.approx(6e-5 + 0.15)
    assert plan.ring_allreduce(100 * MB, 1, 1e-5, 1e-9) == 0.0


def test_tree_allreduce_closed_form():
    # 2 ceil(log2 p) (alpha + n beta); p = 5 rounds up to 3 rounds
    assert plan.tree_allreduce(1 * MB, 8, 1e-5, 1e-9) == pytest.approx(6 * (1e-5 + 1e-3))
    assert plan.tree_allreduce(1 * MB, 5, 1e-5, 1e-9) == pytest.approx(6 * (1e-5 + 1e-3))
    assert plan.tree_allreduce(1 * MB, 1, 1e-5, 1e-9) == 0.0


def test_halving_doubling_allreduce_closed_form():
    # 2 log2 p alpha + 2 (p-1)/p n beta
    expected = 2 * 3 * 1e-5 + 2 * 7 / 8 * 100 * MB * 1e-9
    assert plan.halving_doubling_allreduce(100 * MB, 8, 1e-5, 1e-9) == pytest.approx(expected)


def test_hierarchical_allreduce_closed_form():
    n, g, m = 80 * MB, 4, 2
    a_i, b_i, a_e, b_e = 2e-6, 1 / 50e9, 5e-6, 1 / 12.5e9
    intra = 2 * 3 * a_i + 2 * 3 / 4 * n * b_i
    inter = 2 * 1 * a_e + 2 * 1 / 2 * n * b_e
    assert plan.hierarchical_allreduce(n, m, g, a_i, b_i, a_e, b_e) == pytest.approx(intra + inter)
    # one node: the intra-node ring only
    assert plan.hierarchical_allreduce(n, 1, g, a_i, b_i, a_e, b_e) == pytest.approx(intra)


def test_torus2d_allreduce_closed_form():
    n, x, y = 64 * MB, 4, 8
    a_x, b_x, a_y, b_y = 1e-6, 1e-10, 3e-6, 1e-9
    expected = 2 * 3 * a_x + 2 * 3 / 4 * n * b_x + 2 * 7 * a_y + 2 * 7 / 8 * (n / 4) * b_y
    assert plan.torus2d_allreduce(n, x, y, a_x, b_x, a_y, b_y) == pytest.approx(expected)


def test_torus_with_rows_as_nodes_costs_what_the_hierarchical_ring_costs():
    n, g, m = 100 * MB, 4, 16
    a_i, b_i, a_e, b_node = 2e-6, 1 / 50e9, 5e-6, 1 / 25e9
    torus = plan.torus2d_allreduce(n, g, m, a_i, b_i, a_e, g * b_node)
    assert torus == pytest.approx(plan.hierarchical_allreduce(n, m, g, a_i, b_i, a_e, b_node))


def _cluster(devices, per_node, algorithm, **kwargs):
    return plan.Cluster(devices, per_node, 50e9, 2e-6, 12.5e9, 5e-6, algorithm, **kwargs)


@pytest.mark.parametrize("algorithm", plan.ALGORITHMS)
def test_one_device_communicates_nothing(algorithm):
    assert plan.allreduce_time(100 * MB, _cluster(1, 1, algorithm)) == 0.0


def test_flat_algorithms_price_the_slower_link_across_nodes():
    n = 100 * MB
    one_node = _cluster(8, 8, "ring")
    expected = plan.ring_allreduce(n, 8, 2e-6, 1 / 50e9)
    assert plan.allreduce_time(n, one_node) == pytest.approx(expected)
    # across nodes the ring has one flow on each node's link ...
    four_nodes = _cluster(32, 8, "ring")
    expected = plan.ring_allreduce(n, 32, 5e-6, 1 / 12.5e9)
    assert plan.allreduce_time(n, four_nodes) == pytest.approx(expected)
    # ... halving-doubling has all 8 devices of a node sending at once
    expected = plan.halving_doubling_allreduce(n, 32, 5e-6, 8 / 12.5e9)
    assert plan.allreduce_time(n, _cluster(32, 8, "halving_doubling")) == pytest.approx(expected)


def test_torus_shape_defaults():
    assert plan.torus_shape(2176, 4) == (4, 544)
    assert plan.torus_shape(1024, 1) == (32, 32)
    assert plan.torus_shape(12, 1) == (3, 4)
    assert plan.torus_shape(64, 1, torus_x=8) == (8, 8)


def test_overlap_hides_communication_up_to_the_backward_time():
    assert plan.exposed_communication(0.3, 0.2, overlap=True) == pytest.approx(0.1)
    assert plan.exposed_communication(0.1, 0.2, overlap=True) == 0.0
    assert plan.exposed_communication(0.3, 0.2, overlap=False) == 0.3


# --- the step --------------------------------------------------------------------------------
TOY = plan.custom_profile(parameters=25_000_000, forward_flops=4e9)


def test_step_splits_into_compute_exposed_communication_and_input():
    device = plan.Device(peak_flops=10e12, utilization=0.5)
    cluster = _cluster(16, 8, "hierarchical")
    step = plan.step_time(TOY, 512, device, cluster, gradient_bytes=4, overlap=False)
    compute = 32 * 3 * 4e9 / (10e12 * 0.5)  # 32 images a device
    assert step.fixed == 0.0
    assert step.compute == pytest.approx(compute)
    assert step.communication == pytest.approx(plan.allreduce_time(100 * MB, cluster))
    assert step.exposed_communication == step.communication
    assert step.step == pytest.approx(compute + step.communication)
    assert step.efficiency == pytest.approx(compute / step.step)
    overlapped = plan.step_time(TOY, 512, device, cluster, gradient_bytes=4, overlap=True)
    assert overlapped.exposed_communication == pytest.approx(
        max(0.0, step.communication - 2 / 3 * compute)
    )
    # a slow input pipeline: the step waits for the batch
    slow = plan.Device(peak_flops=10e12, utilization=0.5, input_images_per_second=10.0)
    stalled = plan.step_time(TOY, 512, slow, cluster, gradient_bytes=4, overlap=False)
    assert stalled.input == pytest.approx(32 / 10.0 - compute - step.communication)
    assert stalled.step == pytest.approx(32 / 10.0)


def test_measured_images_per_second_replace_the_peak():
    device = plan.Device(images_per_second=400.0)
    step = plan.step_time(TOY, 256, device, _cluster(1, 1, "ring"))
    assert step.compute == pytest.approx(256 / 400.0)
    assert step.communication == 0.0 and step.efficiency == 1.0


def test_run_length_follows_the_recipe_or_the_given_epochs():
    device = plan.Device(images_per_second=1000.0)
    run = plan.plan_run(TOY, 8192, 0, device, _cluster(8, 8, "ring"))
    assert run.epochs == 56  # resnet50_lars_recipe(8192)
    assert run.steps == epochs_to_steps(56, IMAGENET_TRAIN_EXAMPLES, 8192)
    assert run.seconds == pytest.approx(run.steps * run.step.step)
    assert plan.plan_run(TOY, 8192, 90, device, _cluster(8, 8, "ring")).steps == 90 * 156


def test_roofline_takes_the_slower_of_compute_and_memory_per_layer():
    layers = (
        plan.LayerProfile("conv", "Conv2D", 10, 1_000_000, 100, 100),  # compute-bound
        plan.LayerProfile("pool", "MaxPooling2D", 0, 0, 1000, 1000),  # memory-bound
    )
    profile = plan.ModelProfile("toy", layers)
    seconds = profile.image_seconds(1e9, memory_bandwidth=1e9, activation_bytes=2)
    assert seconds == pytest.approx(max(3e6 / 1e9, 3 * 200 * 2 / 1e9) + 3 * 2000 * 2 / 1e9)
    assert profile.image_seconds(1e9) == pytest.approx(3e6 / 1e9)


def test_fused_memory_passes_of_each_layer():
    conv = plan.LayerProfile("conv", "Conv2D", 10, 0, 100, 400)
    bn = plan.LayerProfile("bn", "BatchNormalization", 2, 0, 400, 400)
    relu = plan.LayerProfile("relu", "ReLU", 0, 0, 400, 400)
    add = plan.LayerProfile("add", "Add", 0, 0, 800, 400)
    pad = plan.LayerProfile("pad", "ZeroPadding2D", 0, 0, 400, 484)
    pool = plan.LayerProfile("pool", "MaxPooling2D", 0, 0, 484, 121)
    moved = plan.moved_elements
    assert moved(conv) == 3 * (100 + 400)  # forward I + O, backward O + I + I
    assert moved(bn, conv) == 8 * 400  # statistics 1, normalize 2, reductions 2, gradient 3
    assert (moved(relu, bn), moved(relu, add), moved(relu, conv)) == (0, 0, 0)
    assert moved(add, bn) == 2 * 400
    assert moved(pad, relu) == 0
    assert moved(relu, pool) == moved(relu) == 3 * (400 + 400)  # no producer to fuse into
    profile = plan.ModelProfile("toy", (conv, bn, relu, add, relu, pad, pool))
    elements = 1500 + 3200 + 800 + 3 * (484 + 121)
    assert profile.image_seconds(1e12, 1e9, 2) == pytest.approx(elements * 2 / 1e9)


def _resnet50_batch_norm_and_add_outputs():
    """ResNet-50 v1.5's batch-norm and residual-add output elements an image."""
    norms, adds, size = 64 * 112 * 112, 0, 56
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for block in range(blocks):
            out_size = size // stride if block == 0 else size
            norms += width * size * size + (width + 4 * width) * out_size * out_size
            if block == 0:
                norms += 4 * width * out_size * out_size  # the projection's batch norm
            adds += 4 * width * out_size * out_size
            size = out_size
    return norms, adds


def test_resnet50_fused_passes_in_closed_form():
    profile = plan.model_profile("resnet50")
    norms, adds = _resnet50_batch_norm_and_add_outputs()
    kinds = {"BatchNormalization", "ReLU", "Add", "ZeroPadding2D"}
    elementwise = [
        plan.moved_elements(layer, previous)
        for previous, layer in zip((None, *profile.layers), profile.layers)
        if layer.kind in kinds
    ]
    assert (norms, adds) == (11_113_984, 5_519_360)
    assert sum(elementwise) == 8 * norms + 2 * adds  # every ReLU and pad fused


# --- model accounting ----------------------------------------------------------------------
def _resnet50_v15_multiply_adds():
    """ResNet-50 v1.5 multiply-adds at 224x224, from its architecture table."""
    total = 7 * 7 * 3 * 64 * 112 * 112  # stem
    channels, size = 64, 56
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for block in range(blocks):
            out_size = size // stride if block == 0 else size
            total += channels * width * size * size  # 1x1 reduce
            total += 9 * width * width * out_size * out_size  # 3x3 (carries the stride)
            total += width * 4 * width * out_size * out_size  # 1x1 expand
            if block == 0:
                total += channels * 4 * width * out_size * out_size  # projection shortcut
            channels, size = 4 * width, out_size
    return total + 2048 * 1000  # classifier


def _alexnet_multiply_adds():
    convs = [(11, 3, 64, 55), (5, 64, 192, 27), (3, 192, 384, 13), (3, 384, 256, 13)]
    convs.append((3, 256, 256, 13))
    total = sum(k * k * cin * cout * size * size for k, cin, cout, size in convs)
    return total + 9216 * 4096 + 4096 * 4096 + 4096 * 1000


def test_resnet50_accounting_matches_independent_counts():
    profile = plan.model_profile("resnet50")
    assert profile.parameters == 25_557_032  # torchvision's published count
    assert profile.forward_flops == 2 * _resnet50_v15_multiply_adds() == 2 * 4_089_184_256
    # the usual "4.1 GFLOPs" of ResNet-50 are multiply-adds (torchvision: 4.09 G)
    assert profile.forward_flops / 2 == pytest.approx(4.09e9, rel=0.001)
    convs = [layer for layer in profile.layers if layer.kind == "Conv2D"]
    assert len(convs) == 53 and profile.layers[-1].name == "fc"


def test_alexnet_accounting_matches_independent_counts():
    profile = plan.model_profile("alexnet")
    assert profile.parameters == 61_100_840  # torchvision's published count
    assert profile.forward_flops == 2 * _alexnet_multiply_adds()
    fc6 = next(layer for layer in profile.layers if layer.name == "fc6")
    assert fc6.parameters == 9216 * 4096 + 4096
    assert (fc6.input_elements, fc6.output_elements) == (9216, 4096)
    assert plan.model_profile("alexnet_bn").parameters == 62_379_720


# --- data or model parallelism, layer by layer -----------------------------------------------
def test_alexnet_fully_connected_layers_prefer_model_parallelism_at_krizhevskys_batch():
    profile = plan.model_profile("alexnet")
    choices = {c.layer.name: c for c in plan.layer_choices(profile, 1024)}
    assert {name: c.cheaper for name, c in choices.items()} == {
        "conv1": "data",
        "conv2": "data",
        "conv3": "data",
        "conv4": "data",
        "conv5": "data",
        "fc6": "model",
        "fc7": "model",
        "fc8": "data",  # 4,097,000 parameters over 4096 inputs: break-even batch 1000
    }
    fc6 = choices["fc6"]
    assert fc6.data_parallel_bytes == 2 * 37_752_832 * 4
    assert fc6.model_parallel_bytes == 2 * 1024 * 9216 * 4
    assert fc6.break_even_batch == pytest.approx(37_752_832 / 9216)


def test_large_batches_make_data_parallelism_cheaper_for_every_layer():
    choices = plan.layer_choices(plan.model_profile("alexnet"), 32768)
    assert {c.cheaper for c in choices} == {"data"}
    resnet = plan.layer_choices(plan.model_profile("resnet50"), 1024)
    assert {c.cheaper for c in resnet if c.layer.kind == "Conv2D"} == {"data"}


# --- settings -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "values, message",
    [
        (dict(devices=64, devices_per_node=3), "--devices_per_node=3: must divide --devices (64)."),
        (dict(devices=64, global_batch_size=32), "--global_batch_size=32: must be >= --devices"),
        (dict(model="custom"), "--parameters=0: is required (> 0) with --model=custom."),
        (dict(utilization=3.0), "--utilization=3.0: must be in [0, 2] (0: fitted)."),
        (dict(utilization=-0.5), "--utilization=-0.5: must be in [0, 2] (0: fitted)."),
        (dict(algorithm="ring", torus_x=8), "--torus_x=8: is only used with --algorithm=torus2d."),
        (dict(algorithm="gossip"), "--algorithm=gossip: 'gossip' is not one of ring"),
        (dict(peak_tflops=-1.0), "--peak_tflops=-1.0: must be >= 0 (0: --device's)."),
        (dict(device="V200"), "--device=V200: 'V200' is not one of P100-SXM2"),
        (dict(half_batch=-2.0), "--half_batch=-2.0: must be >= -1.0."),
        (dict(fixed_step_ms=-3.0), "--fixed_step_ms=-3.0: must be >= -1.0."),
        (dict(device_memory_gb=-1.0), "--device_memory_gb=-1.0: must be >= 0 (0: --device's)."),
        (dict(global_batch_size=2_000_000), "--global_batch_size=2000000: must be <= --examples"),
        (
            dict(devices=64, global_batch_size=100),
            "--global_batch_size=100: must be divisible by --devices (64): a device takes whole "
            "images, not 1.56.",
        ),
    ],
)
def test_bad_settings_name_the_flag(values, message):
    with pytest.raises(ConfigError) as error:
        plan.PlanSettings(**values)
    assert str(error.value).startswith(message)


@pytest.mark.subprocess
def test_bad_flag_gives_one_error_line():
    process = subprocess.run(
        [sys.executable, "-m", "keras_lars.tools.plan", "--devices=64", "--devices_per_node=3"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert process.returncode == 1
    assert process.stderr.strip().splitlines()[-1] == (
        "error: --devices_per_node=3: must divide --devices (64)."
    )


def test_report_and_table_of_the_default_plan():
    options = plan.PlanSettings(devices=64, global_batch_size=64)
    text = plan.plan_text(options)
    for part in ("compute", "communication", "input stall", "scaling efficiency", "time to train"):
        assert part in text
    grid = plan.grid_text(options).splitlines()
    assert len(grid) == 2 + 5  # title, header, five batches
    assert grid[1].split() == ["16", "32", "64", "128", "256"]
    # "-": fewer images than devices
    assert [row.split().count("-") for row in grid[2:]] == [4, 3, 2, 1, 0]
    layer_table = plan.layers_text(options).split("\n\n")[0]
    assert layer_table.count("\n") == 2 + 53  # 2 header lines, 54 layers


# --- published records (more in tests/test_plan_records.py) -------------------------------
def test_calibration_constant_is_fitted_on_its_record():
    fitted = plan.fit_utilization(plan.record(plan.CALIBRATION_RECORD))
    assert round(fitted, 3) == plan.CALIBRATED_UTILIZATION


def test_the_planning_page_holds_the_current_records_table():
    with open(os.path.join(ROOT, "docs", "planning.md")) as f:
        page = f.read()
    assert plan.records_markdown() in page, "docs/planning.md: run python docs/generate.py"
    misses = page.split("## Misses")[1]
    for row in plan.records_rows():
        if row.record.scored and not row.within:
            assert f"`{row.record.key}`" in misses, row.record.key


def test_the_table_leaves_out_batches_the_devices_do_not_divide():
    options = plan.PlanSettings(devices=6, devices_per_node=1, global_batch_size=600)
    grid = plan.grid_text(options).splitlines()
    assert grid[1].split() == ["2", "3", "6", "12", "24"]
    row = grid[2].split()  # 150 images: 12.5 and 6.25 a device on 12 and 24
    assert row[0] == "150" and row[-2:] == ["-", "-"] and "-" not in row[1:-2]


@pytest.mark.parametrize(
    "flag, message",
    [
        (
            "--model=resnet9000",
            "error: flag --model=resnet9000: value should be one of <resnet18|resnet34|resnet50|"
            "resnet101|resnet152|resnet20|resnet32|resnet44|resnet56|resnet110|alexnet|alexnet_bn|"
            "simple_cnn|custom>.",
        ),
        ("--device=V200", "error: flag --device=V200: value should be one of <"),
        ("--devices=many", "error: flag --devices=many: invalid literal for int() with base 10"),
    ],
)
def test_a_value_absl_refuses_is_the_planners_one_line(flag, message):
    from absl import flags

    from keras_lars.tools import settings

    values = flags.FlagValues()
    settings.define_flags(plan.PlanSettings, values)
    with pytest.raises(SystemExit) as stopped:
        settings.parse_flags(["keras-lars-plan", flag], values)
    assert str(stopped.value.code).startswith(message)
    assert "\n" not in str(stopped.value.code)
