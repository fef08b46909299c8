"""The training tool on Keras's JAX backend (tools/train/runtime_jax.py).

Runs the tool as users do, in child processes, on simulated devices: each
process sees 8 (or 4) CPU devices through
XLA_FLAGS=--xla_force_host_platform_device_count; no accelerator ran. Every
distributed setup ends where one device ends, up to float32 summation
order: data parallel over 8 devices, model parallel on a 2x4 (batch, model)
mesh, 2 steps per compiled call, and 2 processes x 4 devices joined by
jax.distributed on localhost. ResNet-20 (batch norm: the statistics are
the global batch's) on the single-process setups; the simple CNN on 2
processes, whose run is also the uninterrupted one: a SIGTERM to one of two
processes (both stop at one step), a rerun that loses one to SIGKILL (the
other ends with one line) and a last rerun end bit for bit where it ends.
"""

import concurrent.futures
import json
import os
import re
import signal
import subprocess
import time

import numpy as np
import pytest

from keras_lars import _internals
from keras_lars.tools import train
from keras_lars.tools.benchmark_allreduce import free_ports
from keras_lars.tools.settings import ConfigError
from tests.conftest import requires_jax
from tests.processes import CHILD_TIMEOUT
from tests.train_tool import ROOT
from tests.train_tool import assert_same_weights
from tests.train_tool import example
from tests.train_tool import h5_arrays
from tests.train_tool import jpeg_bytes
from tests.train_tool import tool_command
from tests.train_tool import write_records

# The tests that start the tool get `subprocess` and `slow` from tests/conftest.py.
pytestmark = [requires_jax]
TIMEOUT = CHILD_TIMEOUT
# 64 digits at 16x16 a step (22 steps make an epoch), a checkpoint every 4 steps.
SHORT = (
    "--image_size=16",
    "--global_batch_size=64",
    "--train_steps=12",
    "--warmup_epochs=0.25",
    "--checkpoint_every_steps=4",
    "--log_every_seconds=0",
    "--noeval",
)
# Two steps of ResNet-20 (the tool's default model), a checkpoint after each.
# Runs on different devices agree to float32 rounding only until a ReLU input
# within rounding of 0 takes the other side in one of them: then the
# gradients below that layer part. Measured 2026-12-07, one device against
# data parallel over 8 in float32: 2.7e-6 after 1 step, 5.6e-3 after 2 (the
# slots below slot 30 of 59, stage 2's second block), 1.6e-2 after 3.
# (ResNet-18 before: 6.6e-6, 4.6e-6, 3.3e-3; its 2 processes x 4 devices
# parted at step 2, from stage 4's first block down.) So the distributions
# are compared after the first step. Data parallel is compared in float64
# (FLOAT64_TWO_STEPS), where no ReLU input of a first step lay within rounding
# of 0 on the CPUs measured: one device and 8 measured 1.1e-6 apart after a
# step (the optimizers' norms stay float32; 8.2e-3 after 2; ResNet-18: 1.3e-6
# after 1); in float32 the flip's depth varied with the machine (CI's, on
# ResNet-18: slot 39 of 62, 0.13). Model parallel refuses float64
# (tools/train/config.py) and is compared in float32.
TWO_STEPS = (
    *SHORT[:2],
    "--train_steps=2",
    "--warmup_epochs=0.05",
    "--checkpoint_every_steps=1",
)
TWO_STEPS += SHORT[-2:]
FLOAT64_TWO_STEPS = (*TWO_STEPS, "--precision=float64")
FLOAT64_BOUND = 1e-5  # relative, as in largest_difference; measured 1.1e-6
# The 2-process runs, through and interrupted, and their one-device
# reference: the simple CNN in float64, 20 steps of one epoch (22 steps), a
# checkpoint every 8, so that a SIGTERM after the step-8 checkpoint stops
# both processes before the step-16 one (its steps are fast: measured step 10
# on a loaded machine; ResNet-18's stopped one step after the signal, 4 before
# the next). Compared after the last step: 2 processes and one device
# measured 9.2e-16 apart (float64 leaves no ReLU input within rounding of 0).
RESUMED_STEPS, RESUMED_CHECKPOINTS = 20, 8
RESUMED = ("--model=simple_cnn", *SHORT[:2], f"--train_steps={RESUMED_STEPS}")
RESUMED += ("--warmup_epochs=0.25",)
RESUMED += (f"--checkpoint_every_steps={RESUMED_CHECKPOINTS}", *SHORT[-2:], "--precision=float64")
# --save_weights_at_steps on 2 processes: both gather the sharded weights, the
# chief keeps the file (it hung when only the chief saved).
SAVED_AT = 5
RESUMED += (f"--save_weights_at_steps={SAVED_AT}",)
# The simple CNN's arrays in a weights file: conv1, conv2, fc1, fc2 (kernel
# and bias each: 8 variables), LARS's momentum of each, and its step count.
SIMPLE_CNN_ARRAYS = 8 + 8 + 1
# ResNet-20 (the tool's default model, models/resnet_cifar.py) at 10 classes:
# 19 convolutions (a 3x3 kernel each, no bias: the stem and 2 in each of 9
# blocks; the shortcuts hold no variable), 19 batch norms (gamma, beta, moving
# mean and variance: 4 each) and the classifier (kernel and bias).
RESNET20_VARIABLES = 19 + 19 * 4 + 2  # 97
# LARS keeps one momentum slot per trainable variable (kernels, gammas, betas,
# the classifier's two), after its step count (optimizer/vars/0).
RESNET20_SLOTS = 19 + 19 * 2 + 2  # 59
RESNET20_ARRAYS = RESNET20_VARIABLES + 1 + RESNET20_SLOTS  # 157 in a weights file
# --distribution=model_parallel shards a convolution kernel wider than 1x1 by
# its output channels and a dense kernel by its input features, where the
# model axis divides them (layout_file.model_parallel_layouts): on a model axis
# of 4, all 19 convolutions (16, 32 or 64 outputs) and the classifier (64 inputs).
RESNET20_SHARDED_OVER_4 = 19 + 1


def jax_env(devices=8):
    """A JAX tool process's environment: `devices` simulated CPU devices and
    the session's compilation cache (tests/conftest.py), every step cached
    (which the tool turns off for several devices on jax below 0.6:
    runtime_jax.without_a_hanging_cache)."""
    return dict(
        os.environ,
        KERAS_BACKEND="jax",
        JAX_PLATFORMS="cpu",
        XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
        TF_CPP_MIN_LOG_LEVEL="2",
        JAX_COMPILATION_CACHE_DIR=os.environ["KERAS_LARS_TEST_JAX_CACHE"],
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
    )


def start(args, devices=8, **environment):
    """The tool on JAX in the background; stdout and stderr in one text stream."""
    return subprocess.Popen(
        tool_command(*args),
        cwd=ROOT,
        env=dict(jax_env(devices), **environment),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finish(process):
    output, _ = process.communicate(timeout=TIMEOUT)
    return process.returncode, output


def final_weights(model_dir):
    return os.path.join(model_dir, "checkpoints", "ckpt-0001.weights.h5")


def first_step_weights(model_dir):
    return os.path.join(model_dir, "checkpoints", "ckpt-0000-000001.weights.h5")


def largest_difference(expected_path, actual_path):
    """max |a - e| / max |e| over the arrays of both files (every variable
    and optimizer slot), and the number of arrays."""
    expected, actual = h5_arrays(expected_path), h5_arrays(actual_path)
    assert expected.keys() == actual.keys()
    worst = 0.0
    for name, value in expected.items():
        if value.dtype.kind == "f":
            scale = max(float(np.max(np.abs(value))), 1e-30)
            worst = max(worst, float(np.max(np.abs(actual[name] - value))) / scale)
        else:
            np.testing.assert_array_equal(actual[name], value, err_msg=name)
    return worst, len(expected)


def flip_depth(expected_path, actual_path, bound=5e-5):
    """(d, K): the optimizer's slots optimizer/vars/1..K are in the model's
    forward order; d is the last one more than `bound` (relative, as in
    largest_difference) from the expected run's, 0 if none. Every slot
    after d must be within `bound`.

    Why a depth: where one ReLU input lies within float32 rounding of 0,
    one run's other summation order puts it on the other side, and every
    gradient below that ReLU parts (by ~1-25%) while every layer above it,
    which the flip cannot reach, still agrees to rounding. Measured on this
    project's CI machine, --distribution=model_parallel on 2x4 devices
    against one device (ResNet-18, then the model here, digits at 16x16,
    batch 64; 2026-12-01): slots 1-16 and 18 of 62 part (0.236 at stage 2's
    first convolution, 0.07 at its batch norm's beta, 3.8e-6 at its gamma,
    whose input x-hat is ~0 where gamma * x-hat + beta ~ 0 at beta's initial
    0), the 44 above within 1e-5. ResNet-20, 2026-12-07, on the 2-core
    machine: none of 59 parted (every slot within 4.5e-6, the largest at the
    stem's convolution). A real difference in sharded training (Keras < 3.10
    kept the slots of sharded variables replicated: 0.5 and more) reaches
    the top."""
    expected, actual = h5_arrays(expected_path), h5_arrays(actual_path)
    count = sum(1 for name in expected if name.startswith("optimizer/vars/")) - 1
    parted = [0]
    for index in range(1, count + 1):
        name = f"optimizer/vars/{index}"
        scale = max(float(np.max(np.abs(expected[name]))), 1e-30)
        if float(np.max(np.abs(actual[name] - expected[name]))) / scale > bound:
            parted.append(index)
    return max(parted), count


def assert_float32_first_steps_alike(expected_path, actual_path):
    """Every variable and slot of two float32 first steps: summed in another
    order, measured <= 4.5e-6 apart (ResNet-20; ResNet-18: 6.6e-6), but below
    a ReLU that one run's rounding flipped (flip_depth) only the layers above
    the flip, the upper half of the network at least, are compared (to 5e-5)."""
    difference, arrays = largest_difference(expected_path, actual_path)
    depth, slots = flip_depth(expected_path, actual_path)
    assert (arrays, slots) == (RESNET20_ARRAYS, RESNET20_SLOTS)
    assert difference <= 5e-5 or 0 < depth <= slots // 2, (difference, depth, slots)


def run_processes(arg_lists, devices=8, stop=None):
    """Starts the tool on JAX once per argument list (the processes of one
    run) and waits for all; with `stop` = (signal, file), sends the signal to
    the last process once the file exists. Returns [(exit status, output)]."""
    processes = [start(args, devices) for args in arg_lists]
    try:
        if stop:
            deadline = time.time() + TIMEOUT
            while not os.path.exists(stop[1]) and time.time() < deadline:
                assert processes[-1].poll() is None, processes[-1].communicate()[0][-3000:]
                time.sleep(0.05)
            processes[-1].send_signal(stop[0])
        return [finish(process) for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()


def cluster_flags(port, model_dir):
    """The flags of both processes of a 2-process x 4-device run."""
    flags = ["--distribution=data_parallel", "--num_processes=2"]
    flags += [f"--coordinator_address=localhost:{port}", f"--model_dir={model_dir}"]
    return [[*flags, f"--process_id={i}"] for i in range(2)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{setup: (model_dir, exit status, output)} of ResNet-20's TWO_STEPS run
    on each single-process setup (FLOAT64_TWO_STEPS for data parallel and its
    reference, one_device_float64), and of RESUMED on 2 processes x 4 devices
    and on one device. Two runs at a time, the two-process one first (2 cores).
    Where this Keras and jax refuse a setup, its one-device reference is not
    run (one_device always is), nor data_parallel_8_spe2, whose refusal is
    data_parallel_8's line."""
    root = tmp_path_factory.mktemp("jax")
    port = free_ports(1)[0]
    setups = {  # name: ([flags of each process], devices, flags of the run's length)
        "two_processes_x4": (cluster_flags(port, root / "two_processes_x4"), 4, RESUMED),
        "one_device_simple_cnn": ([["--distribution=none"]], 8, RESUMED),
        "one_device": ([["--distribution=none"]], 8, TWO_STEPS),
        "one_device_float64": ([["--distribution=none"]], 8),
        "data_parallel_8": ([["--distribution=data_parallel"]], 8),
        "model_parallel_2x4": (
            [["--distribution=model_parallel", "--model_axis_size=4"]],
            8,
            TWO_STEPS,
        ),
        "data_parallel_8_spe2": ([["--distribution=data_parallel", "--steps_per_execution=2"]], 8),
    }

    refused = {setup: refusal(*DISTRIBUTION_OF[setup]) for setup in DISTRIBUTION_OF}
    needed = {"one_device", *refused, *(REFERENCE_OF[s] for s, why in refused.items() if not why)}
    if refused["data_parallel_8_spe2"]:
        needed.remove("data_parallel_8_spe2")
    setups = {name: setup for name, setup in setups.items() if name in needed}

    def run(name):
        flag_lists, devices, length = (*setups[name], FLOAT64_TWO_STEPS)[:3]
        if len(flag_lists) == 1:
            flag_lists = [[*flag_lists[0], f"--model_dir={root / name}"]]
        outcomes = run_processes([[*length, *flags] for flags in flag_lists], devices)
        status = max(code for code, _ in outcomes)
        return str(root / name), status, "\n".join(out for _, out in outcomes)

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        return dict(zip(setups, pool.map(run, setups)))


def refusal(distribution, processes=1):
    """The one line in which the tool refuses --distribution in `processes`
    processes on this Keras and jax (keras_lars._internals.distribution_problem),
    or None."""
    problem = _internals.distribution_problem(distribution.split("_")[0], processes)
    return problem and f"error: --distribution={distribution}: {problem}."


DISTRIBUTION_OF = {  # setup: (--distribution, processes)
    "data_parallel_8": ("data_parallel", 1),
    "data_parallel_8_spe2": ("data_parallel", 1),
    "model_parallel_2x4": ("model_parallel", 1),
    "two_processes_x4": ("data_parallel", 2),
}
REFERENCE_OF = {  # setup: the one-device run it is compared with
    "data_parallel_8": "one_device_float64",
    "data_parallel_8_spe2": "one_device_float64",
    "model_parallel_2x4": "one_device",
    "two_processes_x4": "one_device_simple_cnn",
}


def assert_refused(run, distribution, processes=1):
    """The run (model dir, status, output) ended in the one refusal line,
    with nothing trained."""
    model_dir, status, output = run
    line = refusal(distribution, processes)
    assert status == 1 and output.strip().splitlines()[-1] == line, output[-3000:]
    assert not os.path.exists(os.path.join(model_dir, "checkpoints"))


@pytest.mark.parametrize("setup", ["data_parallel_8", "model_parallel_2x4", "two_processes_x4"])
def test_every_distribution_steps_as_one_device(runs, setup):
    float64 = setup != "model_parallel_2x4"
    simple = setup == "two_processes_x4"  # RESUMED, compared after its last step
    refused = refusal(*DISTRIBUTION_OF[setup])
    reference_dir, status, output = runs["one_device" if refused else REFERENCE_OF[setup]]
    assert status == 0, output[-3000:]
    assert "--distribution=none: one device (cpu)" in output
    if refused:
        assert_refused(runs[setup], *DISTRIBUTION_OF[setup])
        return
    model_dir, status, output = runs[setup]
    assert status == 0, output[-3000:]
    weights = final_weights if simple else first_step_weights
    dirs = (reference_dir, model_dir)
    expected, actual = weights(reference_dir), weights(model_dir)
    difference, arrays = largest_difference(expected, actual)
    assert arrays == (SIMPLE_CNN_ARRAYS if simple else RESNET20_ARRAYS), arrays
    if float64:  # every variable and slot
        assert difference <= FLOAT64_BOUND, difference
        assert {array.dtype.name for array in h5_arrays(actual).values()} == {"float64", "int32"}
    else:
        assert_float32_first_steps_alike(expected, actual)
    with open(os.path.join(model_dir, "summary.json")) as f:
        summary = json.load(f)
    assert summary["config"]["backend"] == "jax"
    assert summary["steps"] == (RESUMED_STEPS if simple else 2)
    if simple:  # the weights saved after step SAVED_AT, as one device's
        saved = f"weights/step-{SAVED_AT:06d}.weights.h5"
        assert os.listdir(os.path.join(model_dir, "weights")) == [os.path.basename(saved)]
        difference, arrays = largest_difference(*(os.path.join(d, saved) for d in dirs))
        assert (arrays, difference <= FLOAT64_BOUND) == (SIMPLE_CNN_ARRAYS, True), difference


def test_two_steps_per_execution_equal_one(runs):
    if refusal("data_parallel"):  # data_parallel_8_spe2 not run: the same line
        assert_refused(runs["data_parallel_8"], "data_parallel")
        assert "data_parallel_8_spe2" not in runs
        return
    (one, status, output), (two, status_two, _) = (
        runs["data_parallel_8"],
        runs["data_parallel_8_spe2"],
    )
    assert status == status_two == 0, output[-3000:]
    assert_same_weights(final_weights(one), final_weights(two), at_least=RESNET20_ARRAYS - 1)


def test_the_meshes_are_the_ones_asked_for(runs):
    described = {
        "data_parallel_8": "--distribution=data_parallel: 8 cpu devices, mesh batch",
        "model_parallel_2x4": "--distribution=model_parallel: 8 cpu devices, mesh batch 2 x "
        f"model 4, {RESNET20_SHARDED_OVER_4} of {RESNET20_VARIABLES} variables sharded over model",
        "two_processes_x4": "--distribution=data_parallel: 8 cpu devices in 2 processes, "
        "mesh batch",
    }
    for setup, line in described.items():
        if refusal(*DISTRIBUTION_OF[setup]):
            assert_refused(runs[setup], *DISTRIBUTION_OF[setup])
        else:
            assert line in runs[setup][2], (setup, runs[setup][2][-2000:])


def two_processes(model_dir, port, stop=None, after=None):
    """Runs RESUMED on 2 processes x 4 devices; with `stop` (a signal), sends
    it to process 1 once the file `after` exists. Returns [(exit status,
    output)] of the two."""
    flag_lists = [[*RESUMED, *flags] for flags in cluster_flags(port, model_dir)]
    return run_processes(flag_lists, devices=4, stop=stop and (stop, after))


@pytest.fixture(scope="module")
def uninterrupted(runs):
    """The model dir of RESUMED on 2 processes x 4 devices, run through (None
    where this Keras refuses data parallelism: both processes said so)."""
    if refusal(*DISTRIBUTION_OF["two_processes_x4"]):
        assert_refused(runs["two_processes_x4"], *DISTRIBUTION_OF["two_processes_x4"])
        return None
    model_dir, status, output = runs["two_processes_x4"]
    assert status == 0, output[-3000:]
    return model_dir


def test_a_sigterm_then_a_killed_process_and_the_reruns_end_as_the_uninterrupted_run(
    uninterrupted, tmp_path
):
    """A SIGTERM to process 1 after the step-8 checkpoint makes both save at
    one step (JAX's preemption sync point) and exit 75. The rerun loses
    process 1 to a SIGKILL after the step-16 checkpoint: process 0's next
    collective fails, and it exits 75 at once with one line naming that
    checkpoint (not at JAX's heartbeat timeout, with an abort). The last
    rerun ends bit for bit as the uninterrupted run. (Below Keras 3.10 the
    tool refuses data parallelism: the `uninterrupted` fixture checks it.)"""
    if uninterrupted is None:
        return
    model_dir, port = str(tmp_path / "interrupted"), free_ports(1)[0]
    checkpoint = os.path.join(model_dir, "checkpoints", "ckpt-0000-{:06d}.weights.h5")
    first, second = RESUMED_CHECKPOINTS, 2 * RESUMED_CHECKPOINTS
    stops = set()
    for status, output in two_processes(model_dir, port, signal.SIGTERM, checkpoint.format(first)):
        assert status == train.EXIT_PREEMPTED, output[-3000:]
        stops.add(re.search(r"preempted: stopped by SIGTERM at step (\d+)", output).group(1))
    # One step for both, before the next checkpoint.
    assert len(stops) == 1 and first <= int(stops.pop()) < second
    (survivor, output), (killed, _) = two_processes(
        model_dir, port, signal.SIGKILL, checkpoint.format(second)
    )
    assert killed == -signal.SIGKILL and "resuming" in output, output[-3000:]
    assert survivor == train.EXIT_PREEMPTED, output[-3000:]
    line = output.strip().splitlines()[-1]
    assert line == (
        "error: a step across the run's processes failed, most likely because another one "
        f"stopped ({line.split('(', 1)[1].split(');')[0]}); run every one again with the same "
        "command: the run resumes from its last checkpoint, "
        f"{checkpoint.format(second).removesuffix('.weights.h5')}"
    ), output[-3000:]
    assert not os.path.exists(final_weights(model_dir))
    for status, output in two_processes(model_dir, port):
        assert status == 0 and "resuming" in output, output[-3000:]
    expected, actual = final_weights(uninterrupted), final_weights(model_dir)
    assert_same_weights(expected, actual, at_least=SIMPLE_CNN_ARRAYS - 1)


def test_the_backend_flag_restarts_the_program_on_jax(tmp_path):
    """--backend=jax from a TensorFlow environment: the tool runs on JAX
    (KERAS_BACKEND set before Keras loads), whose devices then decide (one
    CPU device here): a model axis that does not divide them is one line,
    with nothing written."""
    env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("XLA_FLAGS", None)
    flags = ["--distribution=model_parallel", "--model_axis_size=3", f"--model_dir={tmp_path}"]
    bad = subprocess.run(
        tool_command("--backend=jax", *flags),
        cwd=ROOT,
        env=dict(env, JAX_PLATFORMS="cpu"),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert bad.returncode == 1, bad.stderr[-3000:]
    last = bad.stderr.strip().splitlines()[-1]
    expected = "error: --model_axis_size=3 must divide the 1 devices of the process."
    assert last == (refusal("model_parallel") or expected)  # on JAX: its check ran there
    assert not os.listdir(tmp_path) or os.listdir(tmp_path) == ["checkpoints"]


def test_a_bad_record_is_one_line_naming_it_on_jax(tmp_path):
    """AlexNet (dropout: its seed generators are uint32 on JAX) on TFRecords
    whose record 5 is not a JPEG: the error names the file and the record."""
    jpeg = jpeg_bytes(np.full((20, 20, 3), 128))
    data = tmp_path / "bad_middle"
    data.mkdir()
    records = [example(jpeg, 1 + i % 2) for i in range(12)]
    records[5] = example(b"\xff\xd8 broken", 1)
    write_records(data / "train-00000-of-00001", records)
    write_records(data / "validation-00000-of-00001", [example(jpeg, 1)])
    flags = ["--dataset=imagenet", f"--data_dir={data}", "--model=alexnet", "--num_classes=2"]
    flags += ["--image_size=16", "--global_batch_size=4", "--warmup_epochs=0"]
    flags += ["--train_examples=12", "--eval_examples=1", "--train_steps=3"]
    status, output = finish(start([*flags, f"--model_dir={tmp_path / 'run'}"], devices=1))
    last = output.strip().splitlines()[-1]
    assert status == 1, output[-3000:]
    assert last.startswith(f"error: {data}/train-00000-of-00001: record 5: image/encoded is not")


def test_process_settings_come_from_the_environment_unless_given(monkeypatch):
    monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "host0:1234")
    monkeypatch.setenv("JAX_NUM_PROCESSES", "4")
    monkeypatch.setenv("JAX_PROCESS_ID", "3")
    values = {"backend": "jax", "distribution": "data_parallel", "process_id": 2}
    config = train.config_from_flags(values, given={"backend", "distribution", "process_id"})
    assert (config.coordinator_address, config.num_processes, config.process_id) == (
        "host0:1234",
        4,
        2,
    )
    assert train.config_from_flags({"backend": "tensorflow"}).num_processes == 1  # JAX only
    monkeypatch.setenv("JAX_NUM_PROCESSES", "four")
    with pytest.raises(ConfigError, match="JAX_NUM_PROCESSES='four' .for --num_processes.: not"):
        train.config_from_flags(values, given={"backend"})


def test_jax_settings_are_checked_against_the_backend():
    with pytest.raises(ConfigError, match="--distribution=data_parallel: needs --backend=jax"):
        train.Config(backend="tensorflow", distribution="data_parallel")
    with pytest.raises(ConfigError, match="--strategy=mirrored: needs --backend=tensorflow"):
        train.Config(backend="jax", strategy="mirrored")
    with pytest.raises(ConfigError, match="--allreduce_dtype=bfloat16: needs --backend=tensorflow"):
        train.Config(backend="jax", allreduce_dtype="bfloat16")
    with pytest.raises(ConfigError, match="--num_processes=2: .*needs --coordinator_address"):
        train.Config(backend="jax", num_processes=2, distribution="data_parallel")
    with pytest.raises(ConfigError, match=r"--process_id=2: must be in \[0, --num_processes\)"):
        train.Config(
            backend="jax", num_processes=2, process_id=2, coordinator_address="localhost:1"
        )
    assert train.Config().backend == "tensorflow"  # the loaded backend


@pytest.mark.parametrize(
    "flags, devices, line",
    [
        (
            ["--distribution=data_parallel", "--global_batch_size=60"],
            8,
            "error: --global_batch_size=60 is not divisible by the 8 replicas of "
            "--distribution=data_parallel.",
        ),
        (
            [
                "--distribution=data_parallel",
                "--num_processes=2",
                "--process_id=1",
                "--coordinator_address=localhost:PORT",
                "--worker_start_timeout_minutes=0.1",
            ],
            4,
            "error: --coordinator_address=localhost:PORT --num_processes=2 --process_id=1: "
            "cannot join the other processes within --worker_start_timeout_minutes=0.1: "
            "process 0 at localhost:PORT did not start within 6 s",
        ),
    ],
)
def test_bad_jax_setups_are_one_line_naming_the_flag(flags, devices, line, tmp_path):
    port = str(free_ports(1)[0])
    flags = [flag.replace("PORT", port) for flag in flags]
    status, output = finish(start([*SHORT, f"--model_dir={tmp_path}", *flags], devices))
    last = output.strip().splitlines()[-1]
    settings = dict(flag[2:].split("=") for flag in flags)
    refused = refusal(settings["distribution"], int(settings.get("num_processes", 1)))
    line = refused or line  # where this Keras/jax refuse, that line comes first
    assert status == 1 and last.startswith(line.replace("PORT", port)), output[-3000:]
    assert not os.listdir(tmp_path) or os.listdir(tmp_path) == ["checkpoints"]


def test_a_batch_schedule_runs_on_jax_at_the_closed_form_rate(tmp_path):
    """--batch_schedule on JAX's one device: each phase at its own batch, and
    the rate at every epoch's end the closed form of EpochWarmupPolyDecay
    (the equations, from test_batch_schedule_tool)."""
    from tests.test_batch_schedule_tool import DIGITS_TRAIN
    from tests.test_batch_schedule_tool import closed_form_rate

    model_dir = str(tmp_path / "run")
    code, output = finish(
        start(
            [
                "--model=simple_cnn",  # the rates' closed form is any model's; compiles fast
                "--image_size=8",
                "--batch_schedule=0:256,1:512",
                "--batch_coupling=linear",
                "--train_epochs=3",
                "--warmup_epochs=0.5",
                "--log_every_seconds=0",
                "--noeval",
                f"--model_dir={model_dir}",
            ],
            devices=1,
        )
    )
    assert code == 0, output[-3000:]
    with open(os.path.join(model_dir, "summary.json")) as f:
        summary = json.load(f)
    per_epoch = [DIGITS_TRAIN // 256, DIGITS_TRAIN // 512]  # 5, 2
    assert [(p["global_batch_size"], p["steps_per_epoch"]) for p in summary["phases"]] == [
        (256, per_epoch[0]),
        (512, per_epoch[1]),
    ]
    history = summary["history"]
    steps = [per_epoch[0], per_epoch[0] + per_epoch[1], per_epoch[0] + 2 * per_epoch[1]]
    assert [h["steps"] for h in history] == steps
    assert [h["global_batch_size"] for h in history] == [256, 512, 512]
    peak = 10.0 * 256 / 256  # --base_learning_rate's default, linear scaling
    expected = [
        closed_form_rate(s, ((0, 256), (1, 512)), DIGITS_TRAIN, peak, 0.5, 3, 1e-4, (1, 2))
        for s in steps
    ]
    np.testing.assert_allclose([h["learning_rate"] for h in history], expected, rtol=2e-6)


@pytest.mark.parametrize("version, cached", [((0, 5, 3), False), ((0, 6, 0), True)])
def test_a_cache_that_hangs_several_devices_is_off_with_one_line(
    version, cached, monkeypatch, capsys, tmp_path
):
    import jax

    from keras_lars.tools.train import runtime_jax

    monkeypatch.setattr(_internals, "installed_version", {"jax": version}.__getitem__)
    settings = ("jax_compilation_cache_dir", "jax_enable_compilation_cache")
    before = [getattr(jax.config, name) for name in settings]
    try:
        jax.config.update(settings[0], str(tmp_path))
        jax.config.update(settings[1], True)
        runtime_jax.without_a_hanging_cache()
        assert jax.config.jax_enable_compilation_cache is cached
    finally:
        for name, value in zip(settings, before):
            jax.config.update(name, value)
    assert capsys.readouterr().out == (
        ""
        if cached
        else "warning: jax 0.5.3 can hang running a multi-device step it loaded from its "
        f"persistent compilation cache: this run does not use {tmp_path} "
        "(JAX_COMPILATION_CACHE_DIR); jax >= 0.6 does\n"
    )


# Makes `import tensorflow` fail as on a JAX-only install (a sitecustomize).
HIDE_TENSORFLOW = """
import importlib.abc, sys
class NoTensorFlow(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "tensorflow":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, NoTensorFlow())
"""


def test_the_tool_trains_on_jax_without_tensorflow(tmp_path):
    """Before, --backend=jax on a JAX-only install was a traceback: Keras
    loaded on TensorFlow (no KERAS_BACKEND), then the tool imported it for
    tf.data, tf.io.gfile and tf.distribute.InputContext."""
    hider = tmp_path / "hide"
    hider.mkdir()
    (hider / "sitecustomize.py").write_text(HIDE_TENSORFLOW)
    env = dict(jax_env(devices=1), PYTHONPATH=os.pathsep.join([str(hider), ROOT]))
    env.pop("KERAS_BACKEND")  # the flag alone chooses it
    model_dir = tmp_path / "run"
    flags = ["--model=simple_cnn", "--global_batch_size=64", "--train_examples=128"]
    flags += ["--eval_examples=100", "--train_epochs=1", "--warmup_epochs=0"]
    process = subprocess.run(
        tool_command("--backend=jax", *flags, f"--model_dir={model_dir}"),
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert process.returncode == 0, process.stderr[-3000:]
    assert process.stdout.splitlines()[0] == (
        "training simple_cnn with lars on digits (8 px), batch 64, 2 steps (1 epoch x 2), "
        f"model_dir {model_dir}, backend jax"
    )
    assert "warning: no TensorBoard logs: Keras writes them through TensorFlow, which " in (
        process.stderr
    )
    summary = json.loads((model_dir / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["config"]["backend"] == "jax"
    assert 0 <= summary["final"]["val_accuracy"] <= 1
    assert sorted(os.listdir(model_dir / "checkpoints")) == [
        "ckpt-0001.json",
        "ckpt-0001.weights.h5",
    ]
