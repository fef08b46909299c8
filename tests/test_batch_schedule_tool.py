"""The training tool's batch schedule (--batch_schedule, --batch_coupling):
refused phases, the run length per phase, and a two-phase run whose rates
are the closed form of EpochWarmupPolyDecay. (A SIGTERM, a kill and the
reruns inside the second phase, bit-equal to an uninterrupted run:
tests/test_train_resume.py; two workers with a batch change against one
process: tests/test_elastic_resume.py, whose runs carry one.)"""

import os

import keras
import numpy as np
import pytest

import keras_lars
from keras_lars.tools import input_pipeline
from keras_lars.tools import train
from keras_lars.tools.train import build as train_build
from keras_lars.tools.train import feed
from keras_lars.tools.train import runtime as train_runtime
from keras_lars.tools.train.length import PhaseLength
from keras_lars.tools.train.length import run_length
from tests import train_data

DIGITS_TRAIN = 1438  # the digits' training examples (the held-out fifth aside)


def closed_form_rate(step, phases, num_train, peak, warmup, total, end, factors):
    """The rate of EpochWarmupPolyDecay at `step` from its equations, in
    float64: phases ((E_k, B_k), ...), epochs done e(s) = E_k + (s - S_k) / n_k."""
    per_epoch = [num_train // batch for _, batch in phases]
    starts = [0]
    for k in range(1, len(phases)):
        starts.append(starts[-1] + (phases[k][0] - phases[k - 1][0]) * per_epoch[k - 1])

    def phase(s):
        return max(k for k, start in enumerate(starts) if start <= s)

    def done(s):
        k = phase(s)
        return phases[k][0] + (s - starts[k]) / per_epoch[k]

    e = done(step)
    if e < warmup:
        rate = peak * done(step + 1) / warmup
    elif e < total:
        rate = end + (peak - end) * (1 - (e - warmup) / (total - warmup)) ** 2
    else:
        rate = end
    return rate * factors[phase(step)]


# --- refused phases: one line each, naming the flag and the phase -------------------
@pytest.mark.parametrize(
    "settings, expected",
    [
        (dict(batch_schedule="0:64,2:x"), r"--batch_schedule=0:64,2:x: .*phase 2 '2:x'"),
        (dict(batch_schedule="1:64"), r"--batch_schedule=1:64: .*phase 1 .*epoch 0"),
        (dict(batch_schedule="0:64,0:128"), r"phase 2 .*epochs must increase"),
        (dict(batch_schedule="0:64,0:0"), r"phase 2 .*epochs must increase"),
        (
            dict(batch_schedule="0:64,5:128", train_epochs=5),
            r"--batch_schedule=0:64,5:128: phase 2 starts at epoch 5, .*--train_epochs=5",
        ),
        (
            dict(batch_schedule="0:64,2:128", global_batch_size=32),
            r"first phase's batch 64 differs from --global_batch_size=32",
        ),
        (dict(batch_schedule="0:64,2:128", train_steps=10), r"leave --train_steps at 0"),
        (dict(batch_schedule="0:64", batch_coupling="cubic"), r"--batch_coupling=cubic: "),
        (
            dict(image_size_schedule="0:16,1:y"),
            r"--image_size_schedule=0:16,1:y: image size schedule phase 2 '1:y'",
        ),
        (
            dict(image_size_schedule="0:16,4:32"),
            r"--image_size_schedule=0:16,4:32: phase 2 starts at epoch 4, .*--train_epochs=4",
        ),
        (
            dict(image_size_schedule="0:16,1:4"),
            r"--image_size_schedule=0:16,1:4: phase 2: the image size 4 must be between 8 and 4096",
        ),
        (
            dict(image_size_schedule="0:16,1:32", image_size=24),
            r"first phase's image size 16 differs from --image_size=24",
        ),
        (
            dict(image_size_schedule="0:16,1:32", model="alexnet_bn"),
            r"--model=alexnet_bn flattens a feature map of one size",
        ),
    ],
)
def test_a_bad_schedule_is_one_line_naming_the_flag_and_phase(settings, expected):
    with pytest.raises(train.ConfigError, match=expected) as error:
        train.Config(**{"train_epochs": 4, **settings})
    assert "\n" not in str(error.value)


def test_a_phase_that_steps_per_execution_does_not_divide_is_refused():
    # 640 examples: phase 1 (batch 64) has 10 steps an epoch, phase 2 (batch 128) 5.
    config = train.Config(batch_schedule="0:64,1:128", train_epochs=3, steps_per_execution=2)
    with pytest.raises(train.ConfigError) as error:
        run_length(config, 640)
    assert str(error.value) == (
        "--batch_schedule=0:64,1:128: phase 2 (epoch 1, global batch 128) has 5 steps per "
        "epoch, which --steps_per_execution=2 does not divide (checkpoints and evaluation "
        "happen at epoch ends)."
    )
    run_length(
        train.Config(batch_schedule="0:64,1:128", train_epochs=3, steps_per_execution=5), 640
    )


def test_a_phase_batch_beyond_the_training_set_is_refused():
    config = train.Config(batch_schedule="0:64,1:700", train_epochs=3)
    with pytest.raises(train.ConfigError, match=r"phase 2 \(epoch 1\): the global batch 700 "):
        run_length(config, 640)


def test_a_phase_batch_that_does_not_divide_among_replicas_is_refused(monkeypatch, tmp_path):
    monkeypatch.setattr(
        train_runtime,
        "strategy_of_flags",
        lambda config: keras_lars.make_strategy("mirrored", devices=["/cpu:0", "/cpu:1"]),
    )
    before = os.listdir(tmp_path)
    with pytest.raises(train.ConfigError) as error:  # refused before a step
        train_data.short_run(
            tmp_path / "r",
            global_batch_size=128,
            batch_schedule="0:512,1:511",
            train_epochs=2,
            train_examples=0,  # all 1438
        )
    assert str(error.value).startswith(  # the runtime's flag follows (patched here)
        "--batch_schedule=0:512,1:511: phase 2 (epoch 1) has global batch 511, not divisible "
        "by the 2 replicas of --strategy="
    )
    assert os.listdir(tmp_path) == before


# --- the run length, per phase ------------------------------------------------------
def test_the_run_length_counts_each_phase_at_its_own_batch():
    config = train.Config(batch_schedule="0:64,2:128,3:200", train_epochs=5, warmup_epochs=2.25)
    assert config.global_batch_size == 64  # the first phase's batch, the default left
    assert config.peak_learning_rate == 10.0 * 64 / 256
    length = run_length(config, 1000)  # 15, 7 and 5 steps an epoch
    assert length.phases == (
        PhaseLength(0, 2, 64, 15),
        PhaseLength(2, 3, 128, 7),
        PhaseLength(3, 5, 200, 5),
    )
    assert length.epochs == 5
    assert [length.steps_in(e) for e in range(5)] == [15, 15, 7, 5, 5]
    assert length.total_steps == 2 * 15 + 7 + 2 * 5
    assert length.warmup_steps == 32  # 2 * 15 + 0.25 * 7 = 31.75
    assert length.steps_per_epoch == 15


def test_image_sizes_split_the_phases_where_they_change():
    config = train.Config(
        batch_schedule="0:64,2:128", image_size_schedule="0:16,1:24,3:32", train_epochs=4
    )
    assert (config.global_batch_size, config.image_size) == (64, 16)  # defaults left: taken
    length = run_length(config, 1000)
    assert length.phases == (
        PhaseLength(0, 1, 64, 15, 16),
        PhaseLength(1, 2, 64, 15, 24),
        PhaseLength(2, 3, 128, 7, 24),
        PhaseLength(3, 4, 128, 7, 32),
    )
    assert length.total_steps == 15 + 15 + 7 + 7
    sizes_only = run_length(train.Config(image_size_schedule="0:16,1:24", train_epochs=2), 1000)
    assert sizes_only.phases == (PhaseLength(0, 1, 128, 7, 16), PhaseLength(1, 2, 128, 7, 24))


def test_without_a_schedule_the_length_and_rate_are_the_constant_batch_ones():
    config = train.Config(global_batch_size=100, train_epochs=3, warmup_epochs=1)
    length = run_length(config, 1000)
    assert (length.steps_per_epoch, length.total_steps, length.warmup_steps) == (10, 30, 10)
    assert length.phases == ()
    schedule = train_build.learning_rate_schedule(config, length, 1000)
    assert type(schedule) is keras_lars.WarmupPolyDecay


@pytest.mark.parametrize(
    "coupling, factors", [("grow", (1, 1)), ("linear", (1, 4)), ("sqrt", (1, 2))]
)
def test_the_schedule_is_the_closed_form_at_every_step(coupling, factors):
    config = train.Config(
        batch_schedule="0:100,2:400",
        train_epochs=4,
        warmup_epochs=1.5,
        base_learning_rate=2.56,
        end_learning_rate=1e-3,
        batch_coupling=coupling,
    )
    length = run_length(config, 1000)  # 10 then 2 steps an epoch: 24 steps
    schedule = train_build.learning_rate_schedule(config, length, 1000, rate_factor=0.5)
    assert type(schedule) is keras_lars.EpochWarmupPolyDecay
    steps = np.arange(length.total_steps + 2)
    rates = keras.ops.convert_to_numpy(schedule(keras.ops.convert_to_tensor(steps, "int64")))
    expected = [
        closed_form_rate(s, ((0, 100), (2, 400)), 1000, 0.5, 1.5, 4, 0.5e-3, factors) for s in steps
    ]
    np.testing.assert_allclose(rates, expected, rtol=2e-6, atol=1e-9)


def test_each_image_size_phase_reads_its_images_at_its_size():
    config = train.Config(image_size_schedule="0:8,1:16", train_epochs=2)
    data = input_pipeline.load(config)
    assert feed.data_at(data, config, 8) is data and feed.data_at(data, config, None) is data
    larger = feed.data_at(data, config, 16)
    images, labels = next(iter(larger.train(1, 32)))
    assert images.shape == (32, 16, 16, 3) and labels.shape == (32,)
    assert next(iter(data.train(1, 32)))[0].shape == (32, 8, 8, 3)
    np.testing.assert_array_equal(next(iter(data.train(1, 32)))[1], labels)  # same order


# --- a two-phase run ----------------------------------------------------------------
def test_a_phased_run_feeds_each_batch_and_size_and_follows_the_closed_form(tmp_path):
    # ResNet-20 on the short run's 128 digits: 2 steps at batch 64, then 2
    # epochs of 1 at 128, the last at 16x16 (the first two at 8x8). (Was
    # 512 and 1024 of all 1438: the same steps at 8x the compute.)
    config, summary = train_data.short_run(
        tmp_path / "run",
        batch_schedule="0:64,1:128",  # the first phase's batch replaces the 128 given
        image_size_schedule="0:8,2:16",
        train_epochs=3,
        warmup_epochs=0.5,
        batch_coupling="linear",
    )
    assert config.global_batch_size == 64 and config.train_examples == 128
    assert summary["phases"] == [
        dict(first_epoch=0, end_epoch=1, global_batch_size=64, steps_per_epoch=2, image_size=8),
        dict(first_epoch=1, end_epoch=2, global_batch_size=128, steps_per_epoch=1, image_size=8),
        dict(first_epoch=2, end_epoch=3, global_batch_size=128, steps_per_epoch=1, image_size=16),
    ]
    assert (summary["epochs"], summary["steps"]) == (3, 4)
    history = summary["history"]
    assert [h["global_batch_size"] for h in history] == [64, 128, 128]
    assert [h["image_size"] for h in history] == [8, 8, 16]
    assert [h["steps"] for h in history] == [2, 3, 4]  # optimizer.iterations runs on
    # The rate logged at an epoch's end is that of the next step.
    phases, peak = ((0, 64), (1, 128)), config.peak_learning_rate
    expected = [
        closed_form_rate(s, phases, config.train_examples, peak, 0.5, 3, 1e-4, (1, 2))
        for s in (2, 3, 4)
    ]
    np.testing.assert_allclose([h["learning_rate"] for h in history], expected, rtol=2e-6)
    assert expected[0] == pytest.approx(2 * (1e-4 + (1 - 1e-4) * 0.8**2))  # the doubled rate
    events = os.listdir(tmp_path / "run" / "logs" / "train")
    assert events  # TensorBoard's epoch_global_batch_size and epoch_learning_rate go there
