"""WarmupPolyDecay and the recipe helpers: closed-form values, saving, exactness, bad input."""

import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_lars
from keras_lars import WarmupPolyDecay

PEAK, END = 2.0, 1e-4


def _rates(schedule, steps):
    return [float(schedule(tf.constant(s, tf.int64))) for s in steps]


def test_closed_form_values():
    # W = 4 warmup steps, T = 20: decay over 16 steps.
    schedule = WarmupPolyDecay(PEAK, warmup_steps=4, total_steps=20)
    steps = [0, 1, 3, 4, 12, 16, 19, 20, 21, 10**6]
    expected = [
        PEAK * 1 / 4,  # step 0: the first update already moves
        PEAK * 2 / 4,  # mid-warmup
        PEAK,  # step 3: the 4th update, end of warmup
        PEAK,  # step 4: decay starts at the peak
        END + (PEAK - END) * 0.5**2,  # mid-decay: 8 of 16 decay steps
        END + (PEAK - END) * 0.25**2,
        END + (PEAK - END) * (1 / 16) ** 2,  # the last step before T
        END,  # total_steps
        END,
        END,  # and beyond
    ]
    np.testing.assert_allclose(_rates(schedule, steps), expected, rtol=1e-6)


def test_start_rate_power_and_degenerate_warmups():
    linear = WarmupPolyDecay(1.0, 2, 10, power=1.0, end_learning_rate=0.2, start_learning_rate=0.4)
    np.testing.assert_allclose(
        _rates(linear, [0, 1, 2, 6, 10]), [0.4 + 0.6 / 2, 1.0, 1.0, 0.2 + 0.8 * 0.5, 0.2], rtol=1e-6
    )
    no_warmup = WarmupPolyDecay(3.0, 0, 4, end_learning_rate=0.0)
    np.testing.assert_allclose(
        _rates(no_warmup, [0, 1, 3, 4]), [3.0, 3.0 * 0.75**2, 3.0 * 0.25**2, 0.0], rtol=1e-6
    )
    all_warmup = WarmupPolyDecay(3.0, 3, 3, end_learning_rate=0.5)
    np.testing.assert_allclose(_rates(all_warmup, [0, 2, 3, 9]), [1.0, 3.0, 0.5, 0.5], rtol=1e-6)


def test_compiled_with_xla_matches_eager():
    schedule = WarmupPolyDecay(PEAK, 4, 20)
    steps = tf.constant([0, 2, 3, 4, 9, 19, 20, 55], tf.int64)
    compiled = tf.function(
        lambda s: tf.map_fn(schedule, s, fn_output_signature=tf.float32), jit_compile=True
    )
    np.testing.assert_allclose(
        compiled(steps).numpy(), _rates(schedule, steps.numpy().tolist()), rtol=1e-6
    )


def test_config_round_trip_and_registration():
    schedule = WarmupPolyDecay(
        7.5, 10, 100, power=1.5, end_learning_rate=0.01, start_learning_rate=0.1, name="curve"
    )
    config = schedule.get_config()
    assert WarmupPolyDecay.from_config(config).get_config() == config
    restored = keras.optimizers.schedules.deserialize(
        keras.optimizers.schedules.serialize(schedule)
    )
    assert isinstance(restored, WarmupPolyDecay) and restored.get_config() == config
    assert keras.saving.get_registered_name(WarmupPolyDecay) == "keras_lars>WarmupPolyDecay"


def _data(n=48, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 6)).astype("float32")
    y = (x[:, 0] - x[:, 2] > 0).astype("int32")
    return x, y


def _model(learning_rate, steps_per_execution=1, seed=0):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(8, activation="relu"),
            keras.layers.Dense(2),
        ]
    )
    model.compile(
        optimizer=keras_lars.LARS(
            learning_rate=learning_rate, weight_decay=1e-3, trust_coefficient=0.02
        ),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        steps_per_execution=steps_per_execution,
    )
    return model


def _train(model, epochs=3):
    x, y = _data()
    model.fit(x, y, batch_size=8, epochs=epochs, shuffle=False, verbose=0)
    return model.get_weights()


def test_keras_file_round_trip(tmp_path):
    schedule = WarmupPolyDecay(PEAK, 4, 16, end_learning_rate=0.01)
    model = _model(schedule)
    _train(model, epochs=1)  # 6 steps
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert (
        loaded.optimizer.get_config()["learning_rate"]
        == model.optimizer.get_config()["learning_rate"]
    )
    assert isinstance(loaded.optimizer._learning_rate, WarmupPolyDecay)
    assert int(loaded.optimizer.iterations) == 6
    expected = 0.01 + (PEAK - 0.01) * (1 - 2 / 12) ** 2  # rate of step 6
    np.testing.assert_allclose(float(loaded.optimizer.learning_rate), expected, rtol=1e-6)
    x, _ = _data()
    np.testing.assert_allclose(loaded.predict(x, verbose=0), model.predict(x, verbose=0), rtol=1e-6)


def test_steps_per_execution_gives_the_same_weights():
    def schedule():
        return WarmupPolyDecay(PEAK, 4, 16)

    one = _train(_model(schedule(), steps_per_execution=1))
    four = _train(_model(schedule(), steps_per_execution=4))  # 6 steps/epoch: 4 + 2
    for a, b in zip(one, four):
        np.testing.assert_array_equal(a, b)
    constant = _train(_model(PEAK))  # the schedule does matter
    assert not np.allclose(one[0], constant[0])


@pytest.mark.parametrize(
    "kwargs, culprit",
    [
        (dict(warmup_steps=21), "warmup_steps"),
        (dict(warmup_steps=-1), "warmup_steps"),
        (dict(warmup_steps=2.5), "warmup_steps"),
        (dict(total_steps=0), "total_steps"),
        (dict(total_steps=True), "total_steps"),
        (dict(peak_learning_rate=-1.0), "peak_learning_rate"),
        (dict(end_learning_rate=-1e-4), "end_learning_rate"),
        (dict(start_learning_rate=-0.1), "start_learning_rate"),
        (dict(power=0.0), "power"),
        (dict(power=-2.0), "power"),
        (dict(peak_learning_rate="1"), "peak_learning_rate"),
    ],
)
def test_bad_input(kwargs, culprit):
    arguments = dict(peak_learning_rate=1.0, warmup_steps=5, total_steps=20)
    arguments.update(kwargs)
    with pytest.raises(ValueError, match=culprit):
        WarmupPolyDecay(**arguments)


def test_step_arithmetic_and_linear_scaling():
    assert keras_lars.steps_per_epoch(1281167, 1024) == 1251  # 1251.14...
    assert keras_lars.steps_per_epoch(1281167, 1024, drop_remainder=False) == 1252
    assert keras_lars.steps_per_epoch(4096, 1024, drop_remainder=False) == 4
    assert keras_lars.epochs_to_steps(5, 1281167, 32768) == 5 * 39
    assert keras_lars.epochs_to_steps(2.5, 100, 10) == 25
    assert keras_lars.epochs_to_steps(0.26, 100, 10) == 3  # 2.6 rounds to 3
    assert keras_lars.linear_scaling(0.1, 8192) == pytest.approx(3.2)
    assert keras_lars.linear_scaling(0.1, 1024, base_batch_size=512) == pytest.approx(0.2)


@pytest.mark.parametrize(
    "call, culprit",
    [
        (lambda: keras_lars.steps_per_epoch(0, 8), "num_examples"),
        (lambda: keras_lars.steps_per_epoch(100, 0), "global_batch_size"),
        (lambda: keras_lars.steps_per_epoch(100, 128), "global_batch_size"),
        (lambda: keras_lars.steps_per_epoch(100, 8, drop_remainder="yes"), "drop_remainder"),
        (lambda: keras_lars.epochs_to_steps(-1, 100, 8), "epochs"),
        (lambda: keras_lars.linear_scaling(-0.1, 256), "base_learning_rate"),
        (lambda: keras_lars.linear_scaling(0.1, 256, base_batch_size=0), "base_batch_size"),
        (lambda: keras_lars.resnet50_lars_recipe(0), "global_batch_size"),
        (lambda: keras_lars.resnet50_lars_recipe(4096.0), "global_batch_size"),
    ],
)
def test_helpers_bad_input(call, culprit):
    with pytest.raises(ValueError, match=culprit):
        call()


@pytest.mark.parametrize(
    "batch, peak, warmup, epochs, momentum, weight_decay",
    [
        # Google MLPerf v0.7 ResNet-50 (JAX) table, at each boundary.
        (4096, 10.0, 5, 56, 0.9, 2e-4),
        (16383, 10.0, 5, 56, 0.9, 2e-4),
        (16384, 25.0, 5, 56, 0.9, 2e-4),
        (32768, 29.0, 18, 64, 0.929, 1e-4),
        (65535, 29.0, 18, 64, 0.929, 1e-4),
        (65536, 23.080977304670448, 33, 92, 0.9537213777059405, 1e-4),
    ],
)
def test_resnet50_recipe_table(batch, peak, warmup, epochs, momentum, weight_decay):
    recipe = keras_lars.resnet50_lars_recipe(batch)
    assert (
        recipe.global_batch_size,
        recipe.peak_learning_rate,
        recipe.warmup_epochs,
        recipe.train_epochs,
        recipe.momentum,
        recipe.weight_decay,
    ) == (batch, peak, warmup, epochs, momentum, weight_decay)
    assert (recipe.end_learning_rate, recipe.power, recipe.label_smoothing, recipe.epsilon) == (
        1e-4,
        2.0,
        0.1,
        0.0,
    )


def test_recipe_schedule_and_config():
    recipe = keras_lars.resnet50_lars_recipe(32768)
    per_epoch = 1281167 // 32768  # 39
    config = recipe.learning_rate_schedule().get_config()
    assert (
        config["peak_learning_rate"],
        config["warmup_steps"],
        config["total_steps"],
        config["power"],
        config["end_learning_rate"],
    ) == (29.0, 18 * per_epoch, 64 * per_epoch, 2.0, 1e-4)
    short = recipe.learning_rate_schedule(num_examples=50000, train_epochs=10)
    assert short.get_config()["total_steps"] == 10 and short.get_config()["warmup_steps"] == 10
    with pytest.raises(dataclasses.FrozenInstanceError):
        recipe.peak_learning_rate = 1.0
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(recipe))
    assert restored == recipe
