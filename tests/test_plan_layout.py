"""The hybrid plan, executed: keras-lars-plan --layout_out writes the per-layer
choice (tools/plan/hybrid.py, layout_file.py); keras-lars-train --layout
runs it (tools/train/runtime_jax.make_devices).

The slow test runs on 8 simulated CPU devices (child processes, as
tests/test_train_jax.py does): the planned layout's first step equals one
device's. Below Keras 3.10 the tool refuses the layout in one line, nothing
trained. (Its compiled collective bytes, equal to the planner's and fewer
than pure data parallelism's: tests/test_plan_hlo.py, which compiles the
other cases in the same child process.)
"""

import json
import os
import re

import keras
import pytest

from keras_lars import _internals
from keras_lars.tools import layout_file
from keras_lars.tools import train
from keras_lars.tools.plan import cli
from keras_lars.tools.plan import hlo_bytes
from keras_lars.tools.settings import ConfigError
from tests.conftest import requires_jax
from tests.test_train_jax import TWO_STEPS
from tests.test_train_jax import finish
from tests.test_train_jax import first_step_weights
from tests.test_train_jax import largest_difference
from tests.test_train_jax import start

SHAPES = {"fc6/kernel": (256, 4096), "fc6/bias": (4096,), "fc8/kernel": (4096, 10)}
ALEXNET_224 = {"model": "alexnet", "devices": 8, "global_batch_size": 256}


def write_plan(path, plan):
    with open(path, "w") as f:
        f.write(plan if isinstance(plan, str) else json.dumps(plan))
    return str(path)


def test_a_layout_file_reads_back_what_was_written(tmp_path):
    path = str(tmp_path / "plan.json")
    layout_file.write(path, (4, 2), {"fc6/kernel": ("model", None), "fc8/.*": ("model", None)})
    mesh, layouts = layout_file.read(path, SHAPES, devices=8)
    assert mesh == (4, 2)
    assert layouts == {"fc6/kernel": ("model", None), "fc8/.*": ("model", None)}


@pytest.mark.parametrize(
    "plan, problem",
    [
        ("{not json", "not JSON: Expecting property name"),
        ({"mesh": {"batch": 8, "model": 1}}, 'must hold {"mesh": {"batch": b, "model": m}'),
        ({"mesh": {"batch": 8}, "layouts": {}}, '"mesh" must give "batch" and "model"'),
        (
            {"mesh": {"batch": 2.5, "model": 2}, "layouts": {}},
            '"mesh" sizes must be positive integers',
        ),
        (
            {"mesh": {"batch": 2, "model": 2}, "layouts": {}},
            "mesh batch 2 x model 2 needs 4 devices; the run has 8",
        ),
        (
            {"mesh": {"batch": 4, "model": 2}, "layouts": {"fc9/kernel": ["model", None]}},
            '"fc9/kernel" matches no variable of the model',
        ),
        (
            {"mesh": {"batch": 4, "model": 2}, "layouts": {"fc6/(kernel": ["model", None]}},
            '"fc6/(kernel": not a regular expression',
        ),
        (
            {"mesh": {"batch": 4, "model": 2}, "layouts": {"fc6/kernel": ["rows", None]}},
            '"fc6/kernel": [\'rows\', None] must list "batch", "model" or null',
        ),
        (
            {"mesh": {"batch": 4, "model": 2}, "layouts": {"fc6/.*": ["model", None]}},
            "\"fc6/.*\": ['model', None] has 2 entries, fc6/bias is (4096,)",
        ),
        (
            {"mesh": {"batch": 1, "model": 8}, "layouts": {"fc8/kernel": [None, "model"]}},
            '"fc8/kernel": fc8/kernel (4096, 10) does not divide over model (8 devices): 10 '
            "is not a multiple",
        ),
    ],
)
def test_a_bad_layout_file_is_one_line_naming_what_is_wrong(tmp_path, plan, problem):
    path = write_plan(tmp_path / "plan.json", plan)
    with pytest.raises(ValueError) as raised:
        layout_file.read(path, SHAPES, devices=8)
    assert str(raised.value).startswith(problem) and "\n" not in str(raised.value)


def test_a_missing_layout_file_is_named():
    with pytest.raises(ValueError, match="^cannot read it: No such file or directory$"):
        layout_file.read("/nonexistent/plan.json", SHAPES, devices=8)


@requires_jax
def test_the_tool_names_the_layout_flag_in_its_one_line(tmp_path):
    from keras_lars.tools.train import runtime_jax

    path = write_plan(tmp_path / "plan.json", {"mesh": {"batch": 2, "model": 2}, "layouts": {}})
    problem = _internals.distribution_problem("model")
    line = f"--layout={path}: " + (
        problem or "mesh batch 2 x model 2 needs 4 devices; the run has 8"
    )
    with pytest.raises(ConfigError) as raised:
        runtime_jax.planned_layouts(path, SHAPES, 8)
    assert str(raised.value) == line + "."


@requires_jax
def test_keras_lays_out_exactly_the_variables_whose_path_a_regex_fullmatches():
    """Keras up to 3.13 looks LayoutMap keys up with re.search (3.14 on with
    re.fullmatch): unanchored, the kernel "conv1/kernel" of ResNet-50 would
    lay out "stage1_block1_conv1/kernel" and 15 more 1x1 kernels as well."""
    from keras_lars.tools.train import build
    from keras_lars.tools.train import runtime_jax

    shapes = build.variable_shapes(train.Config(model="resnet50", image_size=32), 10)
    planned = layout_file.model_parallel_layouts(shapes, 2)
    assert len(planned) == 18 and "stage1_block1_conv1/kernel" not in planned
    mesh = keras.distribution.DeviceMesh((4, 2), ["batch", "model"], [f"cpu:{i}" for i in range(8)])
    for layouts in ({re.escape(path): axes for path, axes in planned.items()}, planned):
        mapped = runtime_jax.layout_map(mesh, layouts)
        laid_out = {path: tuple(mapped[path].axes) for path in shapes if mapped[path] is not None}
        assert laid_out == planned
    user_file = runtime_jax.layout_map(mesh, {"conv1/.*": ("model",), "fc/kernel": (None, "model")})
    laid_out = [path for path in shapes if user_file[path] is not None]
    assert laid_out == ["conv1/kernel", "fc/kernel"]


def test_variable_shapes_are_a_built_models_and_leave_the_next_model_as_seeded():
    """variable_shapes builds without initialising (a StatelessScope): the
    paths and shapes of a normally built model, nothing left behind, and the
    next model drawn from the seed as if no shapes had been read."""
    from keras_lars.tools.train import build

    config = train.Config(model="resnet20", image_size=32, seed=3)
    keras.utils.set_random_seed(config.seed)
    built = build.create_model(config, 10)
    expected = {v.path: tuple(v.shape) for v in built.weights}
    values = [v.numpy() for v in built.weights]
    keras.backend.clear_session()
    shapes = build.variable_shapes(config, 10)
    assert shapes == expected and len(shapes) == 19 * 1 + 19 * 4 + 2
    after = build.create_model(config, 10)
    assert [v.path for v in after.weights] == list(expected)
    assert all((v.numpy() == w).all() for v, w in zip(after.weights, values))
    keras.backend.clear_session()


def test_the_layout_flag_needs_model_parallel_on_jax():
    with pytest.raises(
        ConfigError, match="^--layout=plan.json: needs --backend=jax --distribution"
    ):
        train.Config(backend="jax", layout="plan.json")
    with pytest.raises(
        ConfigError, match="^--layout=plan.json: needs --backend=jax --distribution"
    ):
        train.Config(backend="tensorflow", layout="plan.json")


def test_the_planner_splits_alexnets_dense_layers_and_moves_fewer_bytes(tmp_path):
    path = str(tmp_path / "plan.json")
    options = cli.PlanSettings(**ALEXNET_224, layout_out=path)
    text = cli.layout_out_text(options)
    with open(path) as f:
        plan = json.load(f)
    batch, model = plan["mesh"]["batch"], plan["mesh"]["model"]
    assert batch * model == 8 and model >= 2
    # Krizhevsky's split: the convolutions data-parallel (their outputs and the pools' held
    # to the batch split), the dense layers model-parallel.
    convolutions = "conv1|pool1|conv2|pool2|conv3|conv4|conv5|pool5"
    assert plan["layouts"] == {
        **{f"fc{i}/kernel": ["model", None] for i in (6, 7, 8)},
        f"(?:{convolutions})/output": ["batch", None, None, None],
    }
    lines = text.splitlines()
    assert lines[0] == (
        f"hybrid layout -> {path}: mesh batch {batch} x model {model}; model-parallel: "
        "fc6, fc7, fc8; the rest data-parallel"
    )
    planned = hlo_bytes.planned(("alexnet", "hybrid", 8, 0, 224, 256), path)
    data_parallel = hlo_bytes.planned(("alexnet", "data_parallel", 8, 1, 224, 256))
    assert sum(planned.values()) < sum(data_parallel.values()) / 2
    assert f"{sum(planned.values()) / 1e6:10.1f} MB" in lines[1]


def test_the_layout_prices_data_parallelism_as_the_plan_does(tmp_path):
    # 64 AlexNets (8 nodes of 8): the plan's step is 44.3 ms (its hierarchical all-reduce
    # overlapping the backward pass); the layout's report said 309.8 ms, every byte at one
    # node link's share of a device (12.5 / 8 GB/s) and no overlap
    options = cli.PlanSettings(
        model="alexnet", devices=64, global_batch_size=2048, layout_out=str(tmp_path / "p.json")
    )
    step = options.run().step
    assert round(step.step * 1e3, 1) == 44.3
    line = cli.layout_out_text(options).splitlines()[2]
    assert line.endswith("(data parallel 44.3 ms: the plan's step)")
    # the bytes of pure data parallelism over the plan's all-reduce time
    planned = hlo_bytes.planned(("alexnet", "data_parallel", 64, 1, 224, 2048))
    assert f"bytes at {sum(planned.values()) / step.communication / 1e9:.3g} GB/s" in line


def test_no_layout_for_a_model_given_by_its_totals(tmp_path):
    options = cli.PlanSettings(
        model="custom", parameters=1000, forward_gflops=1.0, layout_out=str(tmp_path / "p.json")
    )
    with pytest.raises(ConfigError, match="^--layout_out needs a keras_lars.models --model"):
        cli.layout_out_text(options)
    assert not os.path.exists(tmp_path / "p.json")


# --- executed on 8 simulated devices --------------------------------------------------------
@pytest.fixture(scope="module")
def alexnet_plan(tmp_path_factory):
    """The planner's layout for AlexNet, 224x224, batch 256 on 8 devices."""
    path = str(tmp_path_factory.mktemp("plan") / "plan.json")
    cli.layout_out_text(cli.PlanSettings(**ALEXNET_224, layout_out=path))
    with open(path) as f:
        mesh = json.load(f)["mesh"]
    return path, (mesh["batch"], mesh["model"])


@requires_jax
def test_the_planned_layout_steps_as_one_device(alexnet_plan, tmp_path):
    """AlexNet (16x16 digits, batch 64) with the plan's layout: the first
    step's variables and slots equal one device's to float32 summation
    order; a plan for other devices ends in one line, nothing trained."""
    path, (batch, model) = alexnet_plan
    flags = [*TWO_STEPS, "--model=alexnet"]
    laid_out = ["--distribution=model_parallel", f"--layout={path}"]
    other = write_plan(tmp_path / "other.json", {"mesh": {"batch": 2, "model": 2}, "layouts": {}})
    other_dir = tmp_path / "other"
    runs = {  # at once
        "one": start([*flags, "--distribution=none", f"--model_dir={tmp_path / 'one'}"]),
        "plan": start([*flags, *laid_out, f"--model_dir={tmp_path / 'plan'}"]),
        "other": start([*flags, laid_out[0], f"--layout={other}", f"--model_dir={other_dir}"]),
    }
    (status, output), (planned, planned_output), (refused, refused_output) = (
        finish(p) for p in runs.values()
    )
    assert status == 0, output[-3000:]
    problem = _internals.distribution_problem("model")
    if problem:
        last = planned_output.strip().splitlines()[-1]
        assert planned == 1 and last == f"error: --distribution=model_parallel: {problem}."
        assert not os.path.exists(tmp_path / "plan" / "checkpoints")
        return
    assert planned == 0, planned_output[-3000:]
    assert (
        f"--distribution=model_parallel: 8 cpu devices, mesh batch {batch} x model {model}, "
        f"3 of 16 variables sharded over model (--layout={path})"
    ) in planned_output
    difference, arrays = largest_difference(
        first_step_weights(str(tmp_path / "one")), first_step_weights(str(tmp_path / "plan"))
    )
    assert difference <= 5e-5 and arrays > 30, (difference, arrays)
    assert refused == 1 and refused_output.strip().splitlines()[-1] == (
        f"error: --layout={other}: mesh batch 2 x model 2 needs 4 devices; the run has 8."
    ), refused_output[-3000:]
    assert not os.path.exists(other_dir / "checkpoints")
