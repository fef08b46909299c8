"""The training tool's --gradient_accumulation_steps and --noise_scale.

Shallue et al.'s simple CNN has no batch norm and no dropout, so an update of
k accumulated micro-batches of B / k images is one step on the batch of B
(the same examples: the stream of micro-batches is the epoch's order cut
finer), up to float rounding."""

import json
import math
import os
import signal
import subprocess
import time

import numpy as np
import pytest

import keras_lars
from keras_lars.tools import checkpoints
from keras_lars.tools import train
from keras_lars.tools.train import runtime as train_runtime
from tests.train_tool import TIMEOUT
from tests.train_tool import assert_same_weights
from tests.train_tool import h5_arrays
from tests.train_tool import run_tool
from tests.train_tool import start_tool
from tests.train_tool import untimed

RUN = dict(
    model="simple_cnn",
    image_size=8,
    global_batch_size=64,
    train_examples=256,
    eval_examples=64,
    train_epochs=2,
    warmup_epochs=0.5,
    base_learning_rate=0.01,
    lr_scaling="none",
)


def run(model_dir, **settings):
    config = train.Config(**{**RUN, **settings, "model_dir": str(model_dir)})
    return train.train_and_evaluate(config)


@pytest.mark.parametrize("optimizer", ["nesterov", "lamb"])
def test_an_accumulated_batch_equals_the_true_batch(tmp_path, optimizer):
    whole = run(tmp_path / "whole", optimizer=optimizer)
    micro = run(tmp_path / "micro", optimizer=optimizer, gradient_accumulation_steps=4)
    # The same updates at the same rates: steps and the schedule count updates.
    for a, b in zip(whole["history"], micro["history"], strict=True):
        assert (a["steps"], a["learning_rate"]) == (b["steps"], b["learning_rate"])
        assert b["val_loss"] == pytest.approx(a["val_loss"], abs=1e-5)
        assert b["loss"] == pytest.approx(a["loss"], abs=1e-5)  # the mean of the micro-batches'
    assert micro["steps"] == whole["steps"] == 8
    name = "checkpoints/ckpt-0002.weights.h5"
    a, b = h5_arrays(tmp_path / "whole" / name), h5_arrays(tmp_path / "micro" / name)
    model = [n for n in a if n.startswith("layers/")]
    assert len(model) == 8  # 4 kernels and 4 biases
    for n in model:
        np.testing.assert_allclose(b[n], a[n], rtol=0, atol=1e-5, err_msg=n)


def test_the_noise_scale_is_in_the_history_from_the_micro_batches(tmp_path):
    summary = run(
        tmp_path / "run", optimizer="lars", gradient_accumulation_steps=4, noise_scale=True
    )
    for record in summary["history"]:
        scale, gradient_sq, trace = (
            record["noise_scale"],
            record["noise_scale_gradient_sq"],
            record["noise_scale_trace"],
        )
        assert math.isfinite(scale) and trace > 0
        assert scale == pytest.approx(trace / gradient_sq, rel=1e-5)
    # Each epoch's own reading, unlagged (the monitor's test checks its value).
    first, last = summary["history"]
    assert first["noise_scale_interval"] > 0 and last["noise_scale_interval"] > 0
    assert first["noise_scale_interval_error"] > 0 and last["noise_scale_interval_error"] > 0
    assert first["noise_scale_interval"] != last["noise_scale_interval"]
    written = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert "noise_scale" in written["final"]
    assert written["history"][-1]["noise_scale_interval"] == last["noise_scale_interval"]


def test_a_stop_inside_an_epoch_resumes_at_an_update_and_ends_as_the_uninterrupted_run(tmp_path):
    """SIGTERM inside the first epoch, with accumulation, evaluations every 5
    updates and a target: the rerun's history, evaluations, target and last
    weights are the uninterrupted run's. 3 epochs of 16 updates, 9 evaluations
    (was 6 epochs at 16x16: the same claims at 8x the compute)."""
    args = [
        "--model=simple_cnn",
        "--image_size=8",
        "--global_batch_size=64",
        "--gradient_accumulation_steps=4",
        "--train_examples=1024",
        "--eval_examples=64",
        "--train_epochs=3",
        "--warmup_epochs=1",
        "--optimizer=lamb",
        "--base_learning_rate=0.01",
        "--lr_scaling=none",
        "--checkpoint_every_steps=3",
        "--eval_every_steps=5",
        "--target_accuracy=1.0",
    ]
    whole = tmp_path / "whole"
    assert run_tool([*args, f"--model_dir={whole}"]).returncode == 0
    stopped = tmp_path / "stopped"
    victim = start_tool(
        [*args, f"--model_dir={stopped}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )

    def inside_first_epoch():
        return any(e == 0 and s >= 3 for e, s in checkpoints.saved(str(stopped / "checkpoints")))

    deadline = time.time() + TIMEOUT
    while not inside_first_epoch() and victim.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    victim.send_signal(signal.SIGTERM)
    _, stderr = victim.communicate(timeout=TIMEOUT)
    assert victim.returncode == train.EXIT_PREEMPTED, stderr[-3000:]
    epoch, step = checkpoints.saved(str(stopped / "checkpoints"))[-1]
    assert (epoch, step) < (3, 0)
    resumed = run_tool([*args, f"--model_dir={stopped}"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a, b = (json.loads((d / "summary.json").read_text()) for d in (whole, stopped))
    keys = ("val_loss", "val_accuracy", "learning_rate", "steps")
    assert [{k: h[k] for k in keys} for h in a["history"]] == [
        {k: h[k] for k in keys} for h in b["history"]
    ]

    # The evaluations and the target too (both features resume exactly).
    assert untimed(a["evaluations"]) == untimed(b["evaluations"])
    assert len(a["evaluations"]) > 6 and untimed([a["target"]]) == untimed([b["target"]])
    last = checkpoints.saved(str(whole / "checkpoints"))[-1]
    assert checkpoints.saved(str(stopped / "checkpoints"))[-1] == last
    name = os.path.basename(checkpoints.stem(str(whole / "checkpoints"), *last)) + ".weights.h5"
    assert_same_weights(whole / "checkpoints" / name, stopped / "checkpoints" / name, 5)


@pytest.mark.parametrize(
    "settings, line",
    [
        ({"gradient_accumulation_steps": 0}, "--gradient_accumulation_steps=0: must be >= 1."),
        (
            {"gradient_accumulation_steps": 3},
            "--gradient_accumulation_steps=3: does not divide --global_batch_size=128.",
        ),
        (
            {"gradient_accumulation_steps": 2, "batch_schedule": "0:128,1:256"},
            "--gradient_accumulation_steps=2: takes one batch for the whole run: leave "
            "--batch_schedule and --image_size_schedule.",
        ),
        (
            {"gradient_accumulation_steps": 2, "precision": "float16"},
            "--gradient_accumulation_steps=2: is not combined with --precision=float16 "
            "(loss scaling); use bfloat16.",
        ),
    ],
)
def test_bad_accumulation_settings_are_one_line_naming_the_flag(settings, line):
    with pytest.raises(train.ConfigError) as raised:
        train.Config(**settings)
    assert str(raised.value) == line


def test_an_execution_that_splits_an_update_is_refused():
    config = train.Config(gradient_accumulation_steps=4, steps_per_execution=3)
    with pytest.raises(train.ConfigError) as raised:
        train.run_length(config, 1438)
    assert str(raised.value) == (
        "--steps_per_execution=3: with --gradient_accumulation_steps=4 one must divide the "
        "other, so that an execution ends where an update does."
    )


@pytest.mark.parametrize("devices", [["/cpu:0"], ["/cpu:0", "/cpu:1"]])
def test_accumulation_under_mirrored_is_one_line_before_training(monkeypatch, tmp_path, devices):
    # tf.distribute refuses the update's merge_call inside Keras's tf.cond
    # under MirroredStrategy on one device too: that was a ValueError traceback.
    monkeypatch.setattr(
        train_runtime,
        "strategy_of_flags",
        lambda config: keras_lars.make_strategy("mirrored", devices=devices),
    )
    with pytest.raises(train.ConfigError) as raised:
        run(tmp_path / "run", gradient_accumulation_steps=2, strategy="mirrored")
    replicas = "1 replica" if len(devices) == 1 else "2 replicas"
    assert str(raised.value) == (
        f"--gradient_accumulation_steps=2 with --strategy=mirrored ({replicas}): Keras "
        "all-reduces inside the tf.cond of its update step, which tf.distribute's "
        "MirroredStrategy refuses, on one replica too; accumulate under "
        "--strategy=one_device or default, or on --backend=jax."
    )
    assert not (tmp_path / "run").exists()  # refused before anything


def test_the_noise_scale_on_one_device_needs_micro_batches(tmp_path):
    with pytest.raises(train.ConfigError) as raised:
        run(tmp_path / "run", noise_scale=True)
    assert str(raised.value) == (
        "--noise_scale on one device needs two gradient sizes: --gradient_accumulation_steps "
        ">= 2 (its micro-batches), or several TensorFlow replicas."
    )
    assert not (tmp_path / "run" / "config.json").exists()  # refused before anything


def test_on_the_jax_backend_too(tmp_path):
    """The tool on --backend=jax: the accumulated batch equals the true batch,
    and the noise scale comes from the micro-batches."""
    args = [f"--{k}={v}" for k, v in RUN.items()] + ["--backend=jax", "--optimizer=lamb"]
    whole = run_tool([*args, f"--model_dir={tmp_path / 'whole'}"])
    assert whole.returncode == 0, whole.stderr[-3000:]
    micro = run_tool(
        [
            *args,
            "--gradient_accumulation_steps=4",
            "--noise_scale",
            f"--model_dir={tmp_path / 'micro'}",
        ]
    )
    assert micro.returncode == 0, micro.stderr[-3000:]
    name = "checkpoints/ckpt-0002.weights.h5"
    a, b = h5_arrays(tmp_path / "whole" / name), h5_arrays(tmp_path / "micro" / name)
    model = [n for n in a if n.startswith("layers/")]
    assert len(model) == 8
    for n in model:
        np.testing.assert_allclose(b[n], a[n], rtol=0, atol=1e-5, err_msg=n)
    summary = json.loads((tmp_path / "micro" / "summary.json").read_text())
    assert summary["config"]["backend"] == "jax"
    assert all(math.isfinite(h["noise_scale"]) for h in summary["history"])
    assert all(h["noise_scale_interval"] > 0 for h in summary["history"])  # on JAX too
