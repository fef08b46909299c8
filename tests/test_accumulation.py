"""Gradient accumulation in LARS and LAMB (Keras's `gradient_accumulation_steps`).

k micro-batches of b accumulated into one update must give the update of one
step on the whole batch of k*b (a model without batch norm): the schedule's
rate counts applied updates, and LAMB's bias correction too. Checked on one
device, under MirroredStrategy on two logical CPUs (tests/conftest.py), and
on the JAX backend in a process of its own (python -m tests.test_accumulation).
"""

import json
import os

import keras
import numpy as np
import pytest

import keras_lars
from tests.processes import json_report_on_jax

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MICRO, STEPS, UPDATES = 4, 3, 4  # micro-batch b, accumulation k, applied updates


def make_data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(MICRO * STEPS * UPDATES, 5)).astype("float32")
    y = rng.normal(size=(len(x), 2)).astype("float32")
    return x, y


def make_optimizer(name, accumulate):
    # A schedule that moves at every update: a rate taken at the micro-batch
    # count (Keras's own choice) would differ from the second update on.
    schedule = keras.optimizers.schedules.PolynomialDecay(0.5, UPDATES, 0.05)
    steps = {"gradient_accumulation_steps": STEPS} if accumulate else {}
    if name == "lars":
        return keras_lars.LARS(
            schedule, momentum=0.9, weight_decay=1e-3, trust_coefficient=0.01, **steps
        )
    return keras_lars.LAMB(schedule, weight_decay=1e-2, **steps)


def train(name, accumulate, strategy=None):
    """Final weights after UPDATES updates: of k micro-batches of b each
    (accumulate=True) or of one batch of k*b."""
    x, y = make_data()
    scope = strategy.scope() if strategy is not None else _nothing()
    with scope:
        model = keras.Sequential(
            [keras.Input((5,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(2)]
        )
        rng = np.random.default_rng(1)
        model.set_weights([rng.normal(scale=0.5, size=w.shape) for w in model.get_weights()])
        model.compile(make_optimizer(name, accumulate), "mse")
    batch = MICRO if accumulate else MICRO * STEPS
    model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0)
    return model.get_weights()


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


# float32 tolerance: LAMB divides by sqrt(v), so where an entry of the gradient
# is near 0 the rounding of the mean (~1e-7) reaches ~1.5e-5 of the update
# (measured on JAX 0.5.3 / Keras 3.8.0); a rate at the wrong step is off by 0.6.
TOLERANCE = 1e-4


def largest_difference(a, b):
    return max(float(np.max(np.abs(u - v)) / (np.max(np.abs(v)) + 1e-12)) for u, v in zip(a, b))


@pytest.mark.parametrize("name", ["lars", "lamb"])
def test_accumulated_micro_batches_step_as_the_whole_batch(name):
    assert largest_difference(train(name, True), train(name, False)) < TOLERANCE


@pytest.mark.parametrize("devices", [["/cpu:0", "/cpu:1"], ["/cpu:0"]])
def test_accumulation_under_mirrored_strategy_is_refused_in_one_line(devices):
    # Keras's own SGD fails there too (merge_call inside the update's tf.cond).
    import tensorflow as tf

    strategy = tf.distribute.MirroredStrategy(devices)
    with pytest.raises(ValueError, match=r"`gradient_accumulation_steps=3` under tf.distribute's"):
        train("lars", True, strategy)


def test_accumulation_under_one_device_strategy_steps_as_the_whole_batch():
    import tensorflow as tf

    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    assert largest_difference(train("lamb", True, strategy), train("lamb", False)) < TOLERANCE


def test_the_rate_of_applied_update_n_is_the_schedule_at_n():
    optimizer = make_optimizer("lars", accumulate=True)
    schedule = optimizer._learning_rate
    for micro_batches in range(2 * STEPS + 1):
        optimizer._iterations.assign(micro_batches)
        expected = float(schedule(micro_batches // STEPS))
        assert float(optimizer.learning_rate) == pytest.approx(expected)


def test_a_schedule_on_a_keras_outside_the_verified_versions_is_refused(monkeypatch):
    from keras_lars import _internals

    monkeypatch.setattr(_internals, "installed_version", lambda package: (3, 99, 0))
    optimizer = make_optimizer("lars", accumulate=True)
    variables = [keras.Variable(np.ones((2, 2), "float32"))]
    with pytest.raises(_internals.UnsupportedVersionError, match=r"count applied updates"):
        optimizer.build(variables)


def test_accumulation_on_jax_steps_as_the_whole_batch():
    differences = json_report_on_jax("tests.test_accumulation")
    assert differences["backend"] == "jax"
    assert differences["lars"] < TOLERANCE and differences["lamb"] < TOLERANCE, differences


if __name__ == "__main__":  # the JAX half of the test above, in its own process
    report = {
        name: largest_difference(train(name, True), train(name, False)) for name in ("lars", "lamb")
    }
    print(json.dumps(dict(report, backend=keras.backend.backend())))
