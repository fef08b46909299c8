"""The training tool's --adaptive_batch (tools/train/adaptive.py): bad flags
refused in one line before training, and a run whose decision changes the
batch, recorded in summary.json and made again alike by a rerun from the
checkpoint before it; a real process killed at its decision, a SIGTERM as the
rerun rebuilds at the new batch, and the reruns' end equal to an uninterrupted
run's; on JAX (a child process) the same decisions by the same rule and resume.

`python -m tests.test_train_adaptive DIR` runs the JAX part (`_on_jax`)."""

import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys

import keras
import numpy as np
import pytest

import keras_lars
from keras_lars.tools import checkpoints
from keras_lars.tools import train
from keras_lars.tools.train import loop as train_loop
from keras_lars.tools.train import runtime as train_runtime
from keras_lars.tools.train.preemption import Preempted
from keras_lars.tools.train.preemption import Preemption
from tests import train_data
from tests.processes import finish
from tests.processes import json_report_on_jax
from tests.train_tool import TIMEOUT
from tests.train_tool import h5_arrays
from tests.train_tool import parse
from tests.train_tool import start_tool
from tests.train_tool import untimed

ADAPTIVE = ("--adaptive_batch=adascale", "--gradient_accumulation_steps=2")


# --- refused flags: one line naming the flag, before anything loads ------------------
@pytest.mark.parametrize(
    "argv, expected",
    [
        (
            ("--adaptive_batch=adascale", "--adaptive_batch_max=512"),
            "--adaptive_batch=adascale: measures the noise scale from two gradient sizes: give "
            "--gradient_accumulation_steps >= 2 on one device, or --strategy=mirrored / "
            "multi_worker with >= 2 replicas.",
        ),
        (
            ADAPTIVE,
            "--adaptive_batch=adascale: needs --adaptive_batch_max, the largest global "
            "batch to grow to.",
        ),
        (
            (*ADAPTIVE, "--adaptive_batch_max=64", "--adaptive_batch_min=96"),
            "--adaptive_batch_min=96: exceeds --adaptive_batch_max=64.",
        ),
        (
            (*ADAPTIVE, "--adaptive_batch_max=512", "--adaptive_batch_growth=1"),
            "--adaptive_batch_growth=1.0: must be > 1.",
        ),
        (
            (*ADAPTIVE, "--adaptive_batch_max=513"),
            "--adaptive_batch_max=513: is not divisible by --gradient_accumulation_steps=2.",
        ),
        (
            (*ADAPTIVE, "--adaptive_batch_max=64"),
            "--adaptive_batch_max=64: is below --global_batch_size=128, the batch to start at.",
        ),
        (
            (*ADAPTIVE, "--adaptive_batch_max=512", "--adaptive_batch_min=256"),
            "--adaptive_batch_min=256: exceeds --global_batch_size=128, the batch to start at.",
        ),
        (
            (*ADAPTIVE, "--adaptive_batch_max=512", "--steps_per_execution=2"),
            "--adaptive_batch=adascale: needs --steps_per_execution=1 (the steps of an epoch "
            "change with the batch).",
        ),
        (
            (*ADAPTIVE, "--adaptive_batch_max=512", "--train_steps=10"),
            "--adaptive_batch=adascale: counts epochs: leave --train_steps at 0 and give "
            "--train_epochs.",
        ),
        (
            ("--adaptive_batch=adascale", "--adaptive_batch_max=512", "--backend=jax"),
            "--adaptive_batch=adascale: measures the noise scale from two gradient sizes: give "
            "--gradient_accumulation_steps >= 2 on --backend=jax.",
        ),
        (
            (
                *ADAPTIVE,
                "--adaptive_batch_max=256",
                "--backend=jax",
                "--distribution=data_parallel",
            ),
            "--adaptive_batch=adascale: measures the noise scale on one device on --backend=jax: "
            "leave --distribution at none.",
        ),
        (
            (*ADAPTIVE, "--adaptive_batch_max=512", "--adaptive_batch_every_epochs=0"),
            "--adaptive_batch_every_epochs=0: must be >= 1.",
        ),
    ],
)
def test_bad_adaptive_flags_are_one_line_naming_the_flag(argv, expected):
    with pytest.raises(train.ConfigError) as error:
        parse(*argv)
    assert str(error.value) == expected


def test_good_flags_parse():
    config = parse(*ADAPTIVE, "--adaptive_batch_max=512", "--adaptive_batch_growth=1.5")
    assert (config.adaptive_batch, config.adaptive_batch_max) == ("adascale", 512)
    assert config.adaptive_batch_growth == 1.5


def _two_cpus(monkeypatch, devices=("/cpu:0", "/cpu:1")):
    monkeypatch.setattr(
        train_runtime,
        "strategy_of_flags",
        lambda config: keras_lars.make_strategy("mirrored", devices=list(devices)),
    )


@pytest.mark.parametrize(
    "devices, settings, expected",
    [
        (
            ("/cpu:0",),
            dict(adaptive_batch_max=256),
            "--adaptive_batch=linear: measures the noise scale from two gradient sizes, but "
            "--strategy=mirrored has 1 replica",
        ),
        (
            ("/cpu:0", "/cpu:1"),
            dict(adaptive_batch_max=257, train_examples=0),  # all 1438
            "--adaptive_batch_max=257 is not divisible by the 2 replicas of --strategy=mirrored",
        ),
        (
            ("/cpu:0", "/cpu:1"),
            dict(adaptive_batch_max=256, adaptive_batch_min=127, train_examples=0),
            "--adaptive_batch_min=127 is not divisible by the 2 replicas",
        ),
        (
            ("/cpu:0", "/cpu:1"),
            dict(adaptive_batch_max=256, train_examples=200),
            "--adaptive_batch_max=256 exceeds the 200 training examples",
        ),
    ],
)
def test_what_the_replicas_cannot_divide_is_refused_before_training(
    monkeypatch, tmp_path, devices, settings, expected
):
    _two_cpus(monkeypatch, devices)
    with pytest.raises(train.ConfigError) as error:
        train_data.short_run(
            tmp_path / "r", strategy="mirrored", adaptive_batch="linear", **settings
        )
    assert str(error.value).startswith(expected)
    assert "\n" not in str(error.value)
    assert not os.path.exists(tmp_path / "r" / "checkpoints")  # nothing written


# --- a run that decides, and its rerun from the checkpoint before the last -------------
def test_a_decision_changes_the_batch_and_a_rerun_from_its_checkpoint_decides_alike(
    tmp_path, capsys
):
    """128 digits, batch 64 in 2 micro-batches of 32 (the noise scale's two
    sizes): epoch 1 has 2 updates; the decision after it takes the batch to
    its cap 64 x 2 (target 1e6 x B_simple), the rate to AdaScale's gain, and
    epoch 2 has 1 update of 128. The simple CNN (327k parameters at 8x8):
    the decision is any model's."""
    settings = dict(
        model="simple_cnn",
        global_batch_size=64,
        gradient_accumulation_steps=2,
        adaptive_batch="adascale",
        adaptive_batch_max=128,
        adaptive_batch_target=1e6,
    )
    run = tmp_path / "run"
    config, summary = train_data.short_run(run, **settings)
    (decision,) = summary["adaptive_batch"]
    scale = decision["noise_scale"]
    gain = (1 + scale / 64) / (1 + scale / 128)  # AdaScale's r for S = 2
    assert decision == {
        "step": 2,
        "epoch": 1,
        "noise_scale": scale,
        "standard_error": decision["standard_error"],
        "measurements": 2,
        "batch_size": 128,
        "rate_factor": gain,
        "learning_rate": decision["learning_rate"],
    }
    error = decision["standard_error"]
    assert scale > 0 and error > 0
    # The rate of step 2 (epoch 1 done, no warmup, total 2): end + (peak - end) (1 - 1/2)^2.
    peak, end = config.peak_learning_rate, config.end_learning_rate
    expected = gain * (end + (peak - end) * 0.25)
    assert decision["learning_rate"] == pytest.approx(expected, rel=1e-6)
    assert [h["global_batch_size"] for h in summary["history"]] == [64, 128]
    assert [h["steps"] for h in summary["history"]] == [2, 3]
    assert [p["global_batch_size"] for p in summary["phases"]] == [64, 128]
    # The reading, at the epoch that decided, in the history and TensorBoard's logs.
    reading = {"adaptive_noise_scale": scale, "adaptive_noise_scale_error": error}
    assert [{k: h.get(k) for k in reading} for h in summary["history"]] == [
        reading,
        dict.fromkeys(reading),
    ]
    logged = _tensorboard_scalars(run / "logs" / "train")
    for tag, value in reading.items():
        assert logged["epoch_" + tag] == [(0, pytest.approx(value, rel=1e-6))]
    out = capsys.readouterr().out
    assert (
        f"adaptive batch: after epoch 1 (step 2), B_simple {scale:.4g} +- "
        f"{decision['standard_error']:.2g} from 2 measurements: batch 64 -> 128, rate "
        f"x{gain:.4g} (learning rate {decision['learning_rate']:.4g})"
    ) in out

    # Killed after epoch 1: its checkpoint holds the decision; the rerun goes on from it.
    rerun = tmp_path / "rerun"
    shutil.copytree(run, rerun)
    for name in os.listdir(rerun / "checkpoints"):
        if name.startswith("ckpt-0002"):
            os.remove(rerun / "checkpoints" / name)
    os.remove(rerun / "summary.json")
    _, again = train_data.short_run(rerun, **settings)
    assert again["adaptive_batch"] == summary["adaptive_batch"]
    assert untimed(again["history"]) == untimed(summary["history"])
    _assert_same_weights(*(d / "checkpoints" / "ckpt-0002.weights.h5" for d in (run, rerun)))
    assert json.loads((rerun / "summary.json").read_text())["adaptive_batch"] == [decision]
    np.testing.assert_equal(again["phases"], summary["phases"])


# --- killed around its changes: the rerun makes the same decisions and weights ---------
# 256 digits, batch 64 in 2 micro-batches: epoch 1 has 4 updates, the decision
# after it takes the batch to 128 (2 updates an epoch), the one after epoch 2
# keeps it and sets a new rate (AdaScale's gain of the new B_simple); a
# checkpoint after every update. The simple CNN at 8x8.
AROUND = dict(
    model="simple_cnn",
    train_examples=256,
    train_epochs=3,
    global_batch_size=64,
    gradient_accumulation_steps=2,
    adaptive_batch="adascale",
    adaptive_batch_max=128,
    adaptive_batch_target=1e6,
    checkpoint_every_steps=1,
)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """AROUND's run, uninterrupted: (model dir, summary)."""
    run = tmp_path_factory.mktemp("adaptive") / "whole"
    _, summary = train_data.short_run(run, **AROUND)
    assert [d["batch_size"] for d in summary["adaptive_batch"]] == [128, 128]
    assert [p["global_batch_size"] for p in summary["phases"]] == [64, 128, 128]
    return run, summary


def test_killed_at_a_decision_and_stopped_by_sigterm_at_its_rebuild_it_resumes_alike(
    uninterrupted, tmp_path, capsys
):
    """SIGKILL to the tool's process as it prints its first decision; its
    epoch checkpoint removed if it was written (a kill a moment sooner): the
    rerun goes on from the step before, decides again from the restored
    sums, and gets SIGTERM (in this process) while it rebuilds the model at
    the new batch: the preemption path, a checkpoint and Preempted. A last
    rerun goes on from that checkpoint and its decision to the end: the
    decisions, the evaluations and the final weights are the uninterrupted
    run's."""
    run = tmp_path / "run"
    flags = [f"--{k}={v}" for k, v in {**train_data.SHORT_RUN, **AROUND}.items()]
    with open(tmp_path / "stderr.txt", "w") as errors:
        victim = start_tool(
            [*flags, f"--model_dir={run}"], stdout=subprocess.PIPE, stderr=errors, text=True
        )
    try:
        for line in victim.stdout:  # the event: the first decision's line
            if line.startswith("adaptive batch: after epoch 1 (step 4)"):
                victim.send_signal(signal.SIGKILL)
                break
    finally:
        ((returncode, _, _),) = finish([victim], TIMEOUT)
    assert returncode == -signal.SIGKILL, (tmp_path / "stderr.txt").read_text()[-3000:]
    assert not (run / "summary.json").exists()
    assert (0, 3) in _killed_before_the_epochs_checkpoint(run)

    stopped = _stopped_at_the_rebuild(run, AROUND)
    assert str(stopped) == (
        f"stopped by SIGTERM before training resumed from {run / 'checkpoints' / 'ckpt-0001'}; "
        "run the same command to resume"
    )
    out, err = capsys.readouterr()
    assert f"resuming {run} after epoch 0, step 3 of epoch 1" in out
    assert "SIGTERM received: saving a checkpoint" in err and "Traceback" not in err
    _, summary = train_data.short_run(run, **AROUND)
    whole, expected = uninterrupted
    _assert_same_decisions(summary["adaptive_batch"], expected["adaptive_batch"])
    # (A resumed epoch's training metrics are those of its rest.)
    keys = ("val_loss", "val_accuracy", "learning_rate", "steps", "global_batch_size")
    for a, e in zip(summary["history"], expected["history"], strict=True):
        assert {k: a[k] for k in keys} == {k: e[k] for k in keys}
    np.testing.assert_equal(summary["phases"], expected["phases"])
    _assert_same_weights(*(d / "checkpoints" / "ckpt-0003.weights.h5" for d in (whole, run)))


def _killed_before_the_epochs_checkpoint(run):
    """Removes epoch 1's checkpoint of `run` (if any); returns what is left."""
    for path in (run / "checkpoints").glob("ckpt-0001.*"):
        path.unlink()
    return checkpoints.saved(str(run / "checkpoints"))


def _stopped_at_the_rebuild(run, settings):
    """Reruns `run` and raises SIGTERM in this process as the loop rebuilds
    the model after a decision (its second restore); returns the Preempted
    that the run ended with (only if the run's handler held the signal)."""
    restore, handlers = train_loop._restore, []

    def signalled(*args):
        handlers.append(signal.getsignal(signal.SIGTERM))
        if len(handlers) == 2 and isinstance(getattr(handlers[-1], "__self__", None), Preemption):
            signal.raise_signal(signal.SIGTERM)
        return restore(*args)

    train_loop._restore = signalled
    try:
        train_data.short_run(run, **settings)
    except Preempted as stopped:
        return stopped
    finally:
        train_loop._restore = restore
    raise AssertionError(f"not preempted; SIGTERM's handlers at the restores: {handlers}")


# --- on JAX: the same decisions by the same rule, and the same resume -----------------
# AROUND's first decision, on one JAX device (its micro-batches measure),
# without evaluations (fewer steps to compile).
ON_JAX = dict(AROUND, backend="jax", train_epochs=2, eval=False)


def test_on_jax_it_decides_by_the_rule_and_a_stopped_run_resumes_alike(uninterrupted, tmp_path):
    """`_on_jax` in a JAX process. Keras draws other initial weights there,
    so its B_simple is its own: the decision is TensorFlow's (step, epoch,
    measurements, batch) with AdaScale's gain of that B_simple."""
    report = json_report_on_jax("tests.test_train_adaptive", str(tmp_path))
    assert report["backend"] == "jax"
    whole, run = tmp_path / "whole", tmp_path / "run"
    assert report["stopped"] == (
        f"stopped by SIGTERM before training resumed from {run / 'checkpoints' / 'ckpt-0001'}; "
        "run the same command to resume"
    )
    assert report["left"][-1] == [0, 3]  # the rerun went on from step 3 of epoch 1
    summary, again = (json.loads((d / "summary.json").read_text()) for d in (whole, run))
    (decision,) = summary["adaptive_batch"]
    on_tensorflow = uninterrupted[1]["adaptive_batch"][0]
    scale = decision["noise_scale"]
    gain = (1 + scale / 64) / (1 + scale / 128)
    config = train.Config(**{**train_data.SHORT_RUN, **ON_JAX})
    peak, end = config.peak_learning_rate, config.end_learning_rate
    assert scale > 0 and decision["standard_error"] > 0
    assert decision == dict(
        on_tensorflow,
        noise_scale=scale,
        standard_error=decision["standard_error"],
        rate_factor=pytest.approx(gain, rel=1e-12),
        # The rate of step 4 (1 of 2 epochs, no warmup): end + (peak - end) (1 - 1/2)^2.
        learning_rate=pytest.approx(gain * (end + (peak - end) * 0.25), rel=1e-6),
    )
    assert [h["global_batch_size"] for h in summary["history"]] == [64, 128]
    logged = _tensorboard_scalars(whole / "logs" / "train")
    assert logged["epoch_adaptive_noise_scale"] == [(0, pytest.approx(scale, rel=1e-6))]
    _assert_same_decisions(again["adaptive_batch"], summary["adaptive_batch"])
    np.testing.assert_equal(again["phases"], summary["phases"])
    _assert_same_weights(*(d / "checkpoints" / "ckpt-0002.weights.h5" for d in (whole, run)))


def _on_jax(root):
    """On JAX: ON_JAX's run uninterrupted in ROOT/whole; in ROOT/run the same
    run stopped by SIGTERM at its rebuild after the decision, its epoch
    checkpoint removed, and rerun to the end. Prints a JSON line."""
    import jax

    # Each rebuild compiles its steps again: the same programs, from this cache.
    jax.config.update("jax_compilation_cache_dir", str(root / "jax_cache"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    train_data.short_run(root / "whole", **ON_JAX)
    stopped = _stopped_at_the_rebuild(root / "run", ON_JAX)
    left = _killed_before_the_epochs_checkpoint(root / "run")
    train_data.short_run(root / "run", **ON_JAX)
    print(json.dumps({"backend": keras.backend.backend(), "stopped": str(stopped), "left": left}))


def _assert_same_decisions(actual, expected):
    """Alike, their readings within 1e-4 (`_assert_same_weights` says why)."""
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert a.keys() == e.keys()
        for key, value in e.items():
            assert a[key] == (pytest.approx(value, rel=1e-4) if isinstance(value, float) else value)


def _assert_same_weights(expected_path, actual_path):
    """Bit for bit, but the optimizer's scalars and 6 interval sums within
    1e-4: the squared norms of the gradients that the noise scale sums were
    seen to round differently from run to run (ResNet-18's: 1 ulp, the
    weights bit-equal), and the estimate of |G|^2 subtracts two of them."""
    expected, actual = h5_arrays(expected_path), h5_arrays(actual_path)
    assert expected.keys() == actual.keys() and len(expected) > 20
    for name, value in expected.items():
        if name.startswith("optimizer/vars/") and value.size <= 6:
            np.testing.assert_allclose(actual[name], value, rtol=1e-4, atol=0, err_msg=name)
        else:
            np.testing.assert_array_equal(actual[name], value, err_msg=name)


def _tensorboard_scalars(log_dir):
    """{tag: [(step, value)]} of the event files in `log_dir`."""
    import tensorflow as tf

    series = {}
    for path in sorted(log_dir.glob("events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                scalar = float(tf.make_ndarray(value.tensor))
                series.setdefault(value.tag, []).append((event.step, scalar))
    return series


if __name__ == "__main__":
    _on_jax(pathlib.Path(sys.argv[1]))
