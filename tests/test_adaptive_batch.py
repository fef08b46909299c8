"""keras_lars.AdaptiveBatchSize: decisions from known noise-scale readings,
its bad arguments, its state, and the callback inside model.fit."""

import math

import keras
import numpy as np
import pytest

import keras_lars
from keras_lars import adaptive_batch

# Start 64, bounds [32, 512], at most x2 or /2 a decision, multiples of 16,
# target 1.5 B_simple, base batch 64.
SETTINGS = dict(
    batch_size=64,
    minimum_batch_size=32,
    maximum_batch_size=512,
    growth_factor=2.0,
    target_multiple=1.5,
    every_steps=10,
    multiple_of=16,
)
# (B_simple read, the batch the equations give, why)
READINGS = [
    (float("nan"), 64, "no reading: keep"),
    (100.0, 128, "target 150 -> 144, capped at 64 * 2"),
    (120.0, 176, "target 180 -> 176 (a multiple of 16)"),
    (30.0, 96, "target 45 -> 32, capped at 176 / 2 -> 96 (rounded up to 16)"),
    (1e4, 192, "capped at 96 * 2"),
    (1e4, 384, "capped at 192 * 2"),
    (1e4, 512, "capped at the maximum"),
    (-5.0, 512, "|G|^2 not resolved: keep"),
    (10.0, 256, "target 15, capped at 512 / 2"),
    (10.0, 128, "target 15 -> 0, capped at 256 / 2"),
    (10.0, 64, "capped at 128 / 2"),
    (10.0, 32, "capped at the minimum"),
]


def _rate(rule, scale, batch):
    base = 64
    return {
        "adascale": (1 + scale / base) / (1 + scale / batch),
        "linear": batch / base,
        "sqrt": math.sqrt(batch / base),
        "none": 1.0,
    }[rule]


def _reading(scale, count=10):
    return {"noise_scale": scale, "standard_error": 0.1, "count": count}


@pytest.mark.parametrize("rule", adaptive_batch.RATE_RULES)
def test_decisions_follow_the_equations_for_each_rate_rule(rule):
    controller = keras_lars.AdaptiveBatchSize(**SETTINGS, rate_rule=rule)
    factor = 1.0
    for number, (scale, batch, why) in enumerate(READINGS, 1):
        decision = controller.decide(10 * number, _reading(scale))
        if scale > 0:
            factor = _rate(rule, scale, batch)
        assert decision == {
            "step": 10 * number,
            "noise_scale": scale if scale == scale else decision["noise_scale"],
            "standard_error": 0.1,
            "measurements": 10,
            "batch_size": batch,
            "rate_factor": factor,
        }, why
        assert (controller.batch_size, controller.rate_factor) == (batch, factor)
    assert len(controller.decisions) == len(READINGS)


def test_adascale_gain_lies_between_one_and_the_scale():
    assert adaptive_batch.gain_ratio(1e9, 256, 64) == pytest.approx(4.0)
    assert adaptive_batch.gain_ratio(1e-9, 256, 64) == pytest.approx(1.0)
    assert adaptive_batch.gain_ratio(64.0, 256, 64) == 2.0 / 1.25


def test_state_and_config_round_trip():
    controller = keras_lars.AdaptiveBatchSize(**SETTINGS)
    for number, (scale, _, _) in enumerate(READINGS[:4]):
        controller.decide(number, _reading(scale))
    copy = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(controller))
    assert copy.get_config() == controller.get_config()
    assert (copy.batch_size, copy.rate_factor) == (64, 1.0)
    copy.set_state(controller.get_state())
    assert copy.get_state() == controller.get_state()
    assert (copy.batch_size, copy.rate_factor) == (96, controller.rate_factor)
    assert copy.decide(9, _reading(1e4)) == controller.decide(9, _reading(1e4))


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"minimum_batch_size": 1024}, r"`minimum_batch_size` \(1024\) must not exceed"),
        ({"growth_factor": 1.0}, r"`growth_factor` must be a finite number > 1.0"),
        ({"target_multiple": 0.0}, r"`target_multiple` must be a finite number > 0.0"),
        ({"rate_rule": "cubic"}, r"`rate_rule` must be one of"),
        ({"batch_size": 1024}, r"`batch_size` \(1024\) must lie within"),
        ({"batch_size": 72}, r"`batch_size` \(72\) must be a multiple of `multiple_of` \(16\)"),
        ({"maximum_batch_size": 500}, r"`maximum_batch_size` \(500\) must be a multiple"),
        ({"every_epochs": 1}, r"give one of `every_steps` and `every_epochs`"),
        ({"every_steps": 0}, r"`every_steps` must be an integer >= 1"),
        ({"multiple_of": 0}, r"`multiple_of` must be an integer >= 1"),
        ({"base_batch_size": 0}, r"`base_batch_size` must be an integer >= 1"),
    ],
)
def test_bad_arguments_name_the_argument(changes, message):
    with pytest.raises(ValueError, match=message):
        keras_lars.AdaptiveBatchSize(**{**SETTINGS, **changes})


def test_in_fit_it_decides_from_the_interval_sets_the_rate_and_stops_at_a_new_batch():
    """LARS with 2 micro-batches of 4 (measured at batch 4 and 8), rate 0.1:
    every 2 updates a decision from those 2 measurements; the first that
    changes the batch stops the fit, with the rate times its factor."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 3)).astype("float32")
    y = (x @ np.array([[1.0], [-2.0], [0.5]]) + rng.normal(size=(64, 1))).astype("float32")
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    optimizer = keras_lars.LARS(
        0.1, gradient_accumulation_steps=2, noise_scale_batch_size=4, noise_scale_decay=0.9
    )
    model.compile(optimizer, "mse")
    controller = keras_lars.AdaptiveBatchSize(
        8, 8, 64, growth_factor=4.0, target_multiple=1e6, rate_rule="linear", every_steps=2
    )
    model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0, callbacks=[controller])
    *kept, last = controller.decisions  # the first reading has |G|^2 <= 0 here
    assert [d["step"] for d in controller.decisions] == [2 * n for n in range(1, len(kept) + 2)]
    assert all(d["batch_size"] == 8 and d["rate_factor"] == 1.0 for d in kept)
    assert all(d["measurements"] == 2 for d in controller.decisions)
    assert last["noise_scale"] > 0
    assert last["batch_size"] == 32 and last["rate_factor"] == 4.0  # 8 * 4, 32 / 8
    assert int(optimizer.iterations) == last["step"]  # stopped there
    assert float(keras.ops.convert_to_numpy(optimizer.learning_rate)) == pytest.approx(0.4)
    assert optimizer.noise_scale_estimator.interval_stats()["count"] == 0  # reset
    assert optimizer.noise_scale_estimator.batch_size == 16  # 32 in 2 micro-batches
    assert model.train_function is None  # traced anew at the next fit


def test_an_optimizer_without_the_noise_scale_is_refused():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(keras_lars.LARS(0.1), "mse")
    controller = keras_lars.AdaptiveBatchSize(8, 8, 64, every_epochs=1)
    with pytest.raises(ValueError, match="constructed with `noise_scale_batch_size`"):
        model.fit(np.ones((8, 3)), np.ones((8, 1)), verbose=0, callbacks=[controller])


def test_under_mirrored_strategy_it_measures_from_the_replicas():
    """Two replicas of a global batch of 8 (b = 4, B = 8): a decision every
    2 steps reads the replicas' interval sums; a new batch sets the
    noise-scale batch to it (no accumulation)."""
    import tensorflow as tf

    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 3)).astype("float32")
    y = (x @ np.array([[1.0], [-2.0], [0.5]]) + rng.normal(size=(64, 1))).astype("float32")
    with tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]).scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        optimizer = keras_lars.LARS(0.1, noise_scale_batch_size=8)
        model.compile(optimizer, "mse")
    controller = keras_lars.AdaptiveBatchSize(
        8, 8, 64, growth_factor=2.0, target_multiple=1e6, every_steps=2, multiple_of=2
    )
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[controller])
    *kept, last = controller.decisions
    assert [d["step"] for d in controller.decisions] == [2 * n for n in range(1, len(kept) + 2)]
    assert all(d["measurements"] == 2 for d in controller.decisions)
    assert last["batch_size"] == 16 and optimizer.noise_scale_estimator.batch_size == 16
