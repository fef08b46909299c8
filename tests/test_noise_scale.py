"""The gradient noise scale (keras_lars.noise_scale) against brute force.

A linear model on a fixed data set of N examples has per-example gradients
g_i in closed form, hence the exact |G|^2 = |mean_i g_i|^2 and tr(Sigma) =
mean_i |g_i - G|^2. Batches are drawn with replacement, so that a batch of b
has E|G_b|^2 = |G|^2 + tr(Sigma)/b exactly. With the learning rate 0 the
weights stay put, and each update's raw estimate (decay 0) is one draw:

- each draw equals the estimator applied in numpy to the same batches;
- over DRAWS draws the means of the raw estimates lie within Z standard
  errors (their sample standard deviation / sqrt(DRAWS)) of the exact
  values: the estimators are unbiased, so a wrong factor (b against B, R,
  k) moves the mean by many standard errors while a right one fails with
  probability ~6e-5 per quantity at Z = 4 (fixed seeds: the outcome is
  deterministic).

On one device from micro-batches, under MirroredStrategy on two logical CPUs
from replicas, with MultiWorkerMirroredStrategy in two worker processes on
localhost (one replica each), and on JAX (micro-batches) in a process of its
own (python -m tests.test_noise_scale, see `_main`).
"""

import json
import math
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

import keras_lars
from keras_lars import noise_scale
from tests.processes import json_report_on_jax

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES, FEATURES = 32, 3
DRAWS, Z = 300, 4.0


def make_data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(EXAMPLES, FEATURES)).astype("float32")
    y = (x @ np.array([[1.0], [-2.0], [0.5]]) + rng.normal(size=(EXAMPLES, 1))).astype("float32")
    return x, y


WEIGHTS = [np.array([[0.3], [-1.0], [0.2]], "float32"), np.array([0.4], "float32")]


def per_example_gradients(x, y):
    """g_i of the squared error (x_i . w + c - y_i)^2: 2 r_i (x_i, 1)."""
    residual = x @ WEIGHTS[0] + WEIGHTS[1] - y
    return 2.0 * residual * np.concatenate([x, np.ones((len(x), 1), "float32")], axis=1)


def exact(x, y):
    g = per_example_gradients(x, y).astype("float64")
    mean = g.mean(axis=0)
    return float(mean @ mean), float(((g - mean) ** 2).sum(axis=1).mean())


def reference(g, groups):
    """The estimator in numpy: groups[u] lists update u's small batches."""
    out = []
    for group in groups:
        smalls = np.stack([g[indices].mean(axis=0) for indices in group]).astype("float64")
        small = float((smalls**2).sum(axis=1).mean())
        big_gradient = smalls.mean(axis=0)
        big = float(big_gradient @ big_gradient)
        b, big_b = len(group[0]), len(group[0]) * len(group)
        out.append(
            (
                noise_scale.gradient_norm_sq_estimate(small, big, b, big_b),
                noise_scale.trace_estimate(small, big, b, big_b),
            )
        )
    return np.array(out)


class _Raw(keras.callbacks.Callback):
    """The raw estimates (decay 0) after each applied update."""

    def __init__(self, every):
        super().__init__()
        self.every, self.values = every, []

    def on_train_batch_end(self, batch, logs=None):
        if (batch + 1) % self.every == 0:
            stats = self.model.optimizer.noise_scale_stats()
            self.values.append((stats["noise_scale_gradient_sq"], stats["noise_scale_trace"]))


def measure(
    draws, small, groups_per_update, strategy=None, accumulate=True, seed=1, intervals=None
):
    """Raw estimates of `draws` updates, and the index groups behind them.

    accumulate=True: `groups_per_update` micro-batches of `small` examples
    each; False: one step of groups_per_update * small examples, split over
    the strategy's replicas. `intervals`: a list that gets the estimator's
    `interval_stats()` after the run."""
    x, y = make_data()
    rng = np.random.default_rng(seed)
    indices = rng.integers(0, EXAMPLES, size=(draws, groups_per_update, small))
    order = indices.reshape(-1)
    batch = small if accumulate else small * groups_per_update
    scope = strategy.scope() if strategy is not None else _Nothing()
    with scope:
        model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(1)])
        model.set_weights(WEIGHTS)
        extra = {"gradient_accumulation_steps": groups_per_update} if accumulate else {}
        optimizer = keras_lars.LARS(
            0.0, momentum=0.0, noise_scale_batch_size=batch, noise_scale_decay=0.0, **extra
        )
        model.compile(optimizer, "mse")
    raw = _Raw(groups_per_update if accumulate else 1)
    if isinstance(strategy, _multi_worker_type()):
        # DATA sharding: worker i takes the i-th part of each global batch.
        import tensorflow as tf

        options = tf.data.Options()
        policy = tf.data.experimental.AutoShardPolicy.DATA
        options.experimental_distribute.auto_shard_policy = policy
        data = tf.data.Dataset.from_tensor_slices((x[order], y[order])).batch(batch)
        model.fit(data.with_options(options), shuffle=False, verbose=0, callbacks=[raw])
    else:
        model.fit(x[order], y[order], batch_size=batch, shuffle=False, verbose=0, callbacks=[raw])
    np.testing.assert_array_equal(model.get_weights()[0], WEIGHTS[0])  # rate 0: fixed weights
    if intervals is not None:
        intervals.append(optimizer.noise_scale_estimator.interval_stats(reset=True))
        intervals.append(optimizer.noise_scale_estimator.interval_stats())
    return np.array(raw.values), list(indices)


def _multi_worker_type():
    if keras.backend.backend() != "tensorflow":
        return ()
    import tensorflow as tf

    return tf.distribute.MultiWorkerMirroredStrategy


class _Nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def compare(estimates, groups):
    """(largest relative difference to the numpy estimator, largest |z| of
    the means against the exact values)."""
    x, y = make_data()
    expected = reference(per_example_gradients(x, y), groups)
    scale = np.abs(expected).max(axis=0)
    difference = float((np.abs(estimates - expected) / scale).max())
    truth = np.array(exact(x, y))
    error = estimates.std(axis=0, ddof=1) / math.sqrt(len(estimates))
    z = float(np.abs((estimates.mean(axis=0) - truth) / error).max())
    return difference, z


# --- pure estimators ---------------------------------------------------------
def test_the_estimators_invert_the_expected_squared_norms():
    gradient_sq, trace, b, big_b = 2.5, 40.0, 8, 32
    small, big = gradient_sq + trace / b, gradient_sq + trace / big_b
    assert noise_scale.gradient_norm_sq_estimate(small, big, b, big_b) == pytest.approx(2.5)
    assert noise_scale.trace_estimate(small, big, b, big_b) == pytest.approx(40.0)
    assert noise_scale.simple_noise_scale(2.5, 40.0) == pytest.approx(16.0)


def test_the_debiased_moving_average_of_a_constant_is_the_constant():
    average = 0.0
    for count in range(1, 4):
        average = noise_scale.ema_update(average, 3.0, 0.9)
        assert noise_scale.debiased(average, 0.9, count) == pytest.approx(3.0)
    assert math.isnan(noise_scale.debiased(0.0, 0.9, 0))


# --- at fixed weights (measure_noise_scale) ---------------------------------
def linear_model():
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(1)])
    model.set_weights(WEIGHTS)
    return model


def test_measured_at_fixed_weights_matches_brute_force_and_the_exact_values():
    x, y = make_data()
    found = keras_lars.measure_noise_scale(
        linear_model(), x, y, "mse", micro_batch_size=4, micro_batches=4, groups=DRAWS, seed=3
    )
    assert (found.small_batch, found.big_batch, found.indices.shape) == (4, 16, (DRAWS, 4, 4))
    # Each group's estimates are numpy's from the same examples.
    expected = reference(per_example_gradients(x, y), list(found.indices))
    estimates = np.stack(
        [
            noise_scale.gradient_norm_sq_estimate(found.small_norm_sq, found.big_norm_sq, 4, 16),
            noise_scale.trace_estimate(found.small_norm_sq, found.big_norm_sq, 4, 16),
        ],
        axis=1,
    )
    np.testing.assert_allclose(estimates, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())
    assert (found.gradient_sq, found.trace) == pytest.approx(tuple(estimates.mean(axis=0)))
    # Unbiased: the means within Z standard errors of the exact moments, and
    # B_simple's interval at Z's confidence holds the exact ratio.
    truth = np.array(exact(x, y))
    error = estimates.std(axis=0, ddof=1) / math.sqrt(DRAWS)
    assert np.all(np.abs(estimates.mean(axis=0) - truth) < Z * error), (estimates.mean(0), truth)
    wide = noise_scale.noise_scale_from_norms(
        found.small_norm_sq, found.big_norm_sq, 4, 16, confidence=0.9999
    )
    assert wide[3][0] < truth[1] / truth[0] < wide[3][1], (wide, truth)
    assert found.interval[0] < found.noise_scale < found.interval[1]
    assert found.noise_scale == pytest.approx(found.trace / found.gradient_sq)
    assert found.standard_error == pytest.approx(wide[4])
    # The weights did not move; the same seed draws the same examples.
    np.testing.assert_array_equal(
        found.indices, np.random.default_rng(3).integers(0, 32, (DRAWS, 4, 4))
    )


def test_the_interval_is_the_jackknife_of_the_ratio_of_means():
    # Noise-free groups: every estimate exact, no spread.
    gradient_sq, trace, b, big_b = 2.0, 48.0, 4, 16
    small, big = [gradient_sq + trace / b] * 3, [gradient_sq + trace / big_b] * 3
    scale, g2, tr, interval, error = noise_scale.noise_scale_from_norms(small, big, b, big_b)
    assert (scale, g2, tr, *interval, error) == pytest.approx((24.0, 2.0, 48.0, 24.0, 24.0, 0.0))
    # Three groups by hand: estimates (|G|^2, tr) = (1, 8), (2, 8), (1, 16) at b = 1, B = 2.
    pairs = [(1.0, 8.0), (2.0, 8.0), (1.0, 16.0)]
    small = [g + t for g, t in pairs]  # N_small = |G|^2 + tr / 1
    big = [g + t / 2 for g, t in pairs]  # N_big = |G|^2 + tr / 2
    scale, g2, tr, interval, error = noise_scale.noise_scale_from_norms(small, big, 1, 2, 0.95)
    left_out = np.array([24 / 3, 24 / 2, 16 / 3])  # without group 1, 2, 3
    expected = math.sqrt(2 / 3 * np.sum((left_out - left_out.mean()) ** 2))
    assert (scale, g2, tr, error) == pytest.approx((32 / 4, 4 / 3, 32 / 3, expected))
    assert interval == pytest.approx((8 - 1.959964 * expected, 8 + 1.959964 * expected))


@pytest.mark.parametrize(
    "arguments, message",
    [
        ({"micro_batches": 1}, r"`micro_batches` must be an integer >= 2"),
        ({"groups": 1}, r"`groups` must be an integer >= 2"),
        ({"micro_batch_size": 0}, r"`micro_batch_size` must be an integer >= 1"),
        ({"confidence": 1.0}, r"`confidence` must be a finite number > 0.0 and < 1.0"),
        ({"y": np.zeros((5, 1))}, r"`x` and `y` must hold the same number of examples"),
    ],
)
def test_bad_measurement_arguments_name_the_argument(arguments, message):
    x, y = make_data()
    given = {"x": x, "y": y, "loss": "mse", "micro_batch_size": 2, "groups": 2, **arguments}
    with pytest.raises(ValueError, match=message):
        keras_lars.measure_noise_scale(linear_model(), **given)


# --- measured in training ---------------------------------------------------
def test_micro_batches_on_one_device_match_brute_force():
    estimates, groups = measure(DRAWS, small=4, groups_per_update=4)
    difference, z = compare(estimates, groups)
    assert difference < 1e-4 and z < Z, (difference, z)


def test_the_interval_sums_hold_the_raw_estimates_since_their_reset():
    """B_simple of the interval is the ratio of the raw estimates' means, its
    error the delta method's (numpy, float64); a reset empties the sums."""
    intervals = []
    estimates, _ = measure(40, small=4, groups_per_update=2, intervals=intervals)
    found, after_reset = intervals
    g, t = estimates[:, 0].astype("float64"), estimates[:, 1].astype("float64")
    scale = t.mean() / g.mean()
    error = math.sqrt(np.sum((t - scale * g) ** 2) / (40 * 39)) / g.mean()
    assert found["count"] == 40
    np.testing.assert_allclose(
        [found["gradient_sq"], found["trace"], found["noise_scale"], found["standard_error"]],
        [g.mean(), t.mean(), scale, error],
        rtol=1e-4,
    )
    assert after_reset["count"] == 0 and math.isnan(after_reset["noise_scale"])


def test_interval_noise_scale_of_known_sums():
    g, t = np.array([1.0, 2.0, 3.0]), np.array([4.0, 3.0, 8.0])
    sums = [3, g.sum(), t.sum(), g @ g, t @ t, g @ t]
    found = noise_scale.interval_noise_scale(sums)
    residual = t - (15.0 / 6.0) * g  # B = 15 / 6
    assert found["noise_scale"] == 2.5 and found["count"] == 3
    assert found["standard_error"] == pytest.approx(math.sqrt(residual @ residual / 6) / 2.0)
    assert math.isnan(noise_scale.interval_noise_scale([1, -1.0, 2.0, 1, 4, -2])["noise_scale"])
    assert math.isnan(noise_scale.interval_noise_scale([1, 1.0, 2.0, 1, 4, 2])["standard_error"])


def test_replicas_under_mirrored_strategy_match_brute_force():
    import tensorflow as tf

    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    estimates, groups = measure(DRAWS, 4, 2, strategy=strategy, accumulate=False)
    difference, z = compare(estimates, groups)
    assert difference < 1e-4 and z < Z, (difference, z)


def test_micro_batches_on_jax_match_brute_force():
    report = json_report_on_jax("tests.test_noise_scale")
    assert report["backend"] == "jax"
    assert report["difference"] < 1e-4 and report["z"] < Z, report


@pytest.mark.multiworker
def test_replicas_of_two_workers_match_brute_force(tmp_path):
    from keras_lars.tools.benchmark_allreduce import free_ports
    from tests.processes import CHILD_TIMEOUT
    from tests.processes import finish

    cluster = {"worker": [f"localhost:{port}" for port in free_ports(2)]}
    processes, outputs = [], []
    for index in range(2):
        config = {"cluster": cluster, "task": {"type": "worker", "index": index}}
        env = dict(
            os.environ,
            TF_CONFIG=json.dumps(config),
            KERAS_BACKEND="tensorflow",
            CUDA_VISIBLE_DEVICES="",
            TF_CPP_MIN_LOG_LEVEL="3",
            PYTHONPATH=ROOT,
        )
        outputs.append(tmp_path / f"worker{index}.json")
        processes.append(
            subprocess.Popen(
                [sys.executable, "-m", "tests.test_noise_scale", str(outputs[-1])],
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    results = finish(processes, CHILD_TIMEOUT)
    assert [code for code, _, _ in results] == [0, 0], [out[-3000:] for _, out, _ in results]
    chief, other = (json.loads(path.read_text()) for path in outputs)
    assert chief["replicas"] == other["replicas"] == 2
    assert chief["estimates"] == other["estimates"]
    assert chief["difference"] < 1e-4 and chief["z"] < Z, chief


def test_the_smoothed_values_reach_the_logs_and_resume_exactly(tmp_path):
    x, y = make_data()

    def model_and_optimizer():
        model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(1)])
        model.set_weights(WEIGHTS)
        optimizer = keras_lars.LAMB(
            0.01, gradient_accumulation_steps=2, noise_scale_batch_size=4, noise_scale_decay=0.9
        )
        model.compile(optimizer, "mse")
        return model

    def fit(model, epoch):
        return model.fit(
            x,
            y,
            batch_size=4,
            shuffle=False,
            verbose=0,
            epochs=epoch + 1,
            initial_epoch=epoch,
            callbacks=[keras_lars.NoiseScaleMonitor()],
        )

    straight = model_and_optimizer()
    fit(straight, 0)
    history = fit(straight, 1).history
    assert set(noise_scale.LOG_KEYS) <= set(history)
    assert history["noise_scale"][0] == straight.optimizer.noise_scale_stats()["noise_scale"]
    assert math.isfinite(history["noise_scale"][0])

    resumed = model_and_optimizer()
    fit(resumed, 0)
    resumed.save(tmp_path / "model.keras")
    resumed = keras.models.load_model(tmp_path / "model.keras")
    fit(resumed, 1)
    assert resumed.optimizer.noise_scale_stats() == straight.optimizer.noise_scale_stats()


def test_the_interval_reading_is_each_epochs_own_and_resets_its_sums():
    x, y = make_data()
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(1)])
    model.set_weights(WEIGHTS)
    optimizer = keras_lars.LAMB(0.01, gradient_accumulation_steps=2, noise_scale_batch_size=4)
    model.compile(optimizer, "mse")
    before = []  # the sums' reading at each epoch end, just before the monitor's

    class Peek(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            before.append(optimizer.noise_scale_estimator.interval_stats())

    monitor = keras_lars.NoiseScaleMonitor(interval=True)
    history = model.fit(
        x, y, batch_size=4, shuffle=False, verbose=0, epochs=2, callbacks=[Peek(), monitor]
    ).history
    assert [reading["count"] for reading in before] == [len(x) // 8] * 2  # one epoch's each
    for name, key in noise_scale.INTERVAL_LOG_KEYS.items():
        assert history[key] == [reading[name] for reading in before]
    assert optimizer.noise_scale_estimator.interval_stats()["count"] == 0
    assert history["noise_scale_interval"][1] != history["noise_scale"][1]  # unlagged
    assert monitor.get_config() == {"every_batch": False, "interval": True}
    with pytest.raises(ValueError, match=r"`interval` must be True or False, received 1"):
        keras_lars.NoiseScaleMonitor(interval=1)


# --- bad input ----------------------------------------------------------------
@pytest.mark.parametrize(
    "arguments, message",
    [
        ({"noise_scale_batch_size": 0}, r"`noise_scale_batch_size` must be an integer >= 1"),
        ({"noise_scale_batch_size": 8.0}, r"`noise_scale_batch_size` must be an integer"),
        (
            {"noise_scale_batch_size": 8, "noise_scale_decay": 1.0},
            r"`noise_scale_decay` must be a finite number >= 0.0 and < 1.0",
        ),
    ],
)
def test_bad_arguments_name_the_argument(arguments, message):
    with pytest.raises(ValueError, match=message):
        keras_lars.LARS(**arguments)


@pytest.mark.parametrize(
    "backend, message",
    [
        ("jax", r"on the JAX backend needs `gradient_accumulation_steps` >= 2"),
        ("torch", r"measured on the TensorFlow and JAX backends, not on 'torch'"),
    ],
)
def test_a_backend_that_cannot_measure_is_refused_at_construction(monkeypatch, backend, message):
    monkeypatch.setattr(keras.backend, "backend", lambda: backend)
    with pytest.raises(ValueError, match=message):
        keras_lars.LARS(noise_scale_batch_size=8)


def test_a_keras_outside_the_verified_versions_is_refused(monkeypatch):
    from keras_lars import _internals

    monkeypatch.setattr(_internals, "installed_version", lambda package: (3, 99, 0))
    with pytest.raises(_internals.UnsupportedVersionError, match=r"Keras 3.99.0 is outside"):
        keras_lars.LAMB(gradient_accumulation_steps=2, noise_scale_batch_size=8)


def test_one_device_without_accumulation_is_refused_in_one_line():
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(1)])
    model.compile(keras_lars.LARS(noise_scale_batch_size=8), "mse")
    x, y = make_data()
    with pytest.raises(ValueError, match=r"`noise_scale_batch_size` needs two gradient sizes"):
        model.fit(x, y, batch_size=8, verbose=0)


def test_reading_without_measuring_names_the_argument():
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(1)])
    model.compile(keras_lars.LARS(), "mse")
    x, y = make_data()
    with pytest.raises(ValueError, match=r"constructed with `noise_scale_batch_size`"):
        model.fit(x, y, batch_size=8, verbose=0, callbacks=[keras_lars.NoiseScaleMonitor()])
    with pytest.raises(ValueError, match=r"construct it with `noise_scale_batch_size`"):
        model.optimizer.noise_scale_stats()


def _main(argv):
    """The JAX test (no argument) or one worker of the two-worker test
    (TF_CONFIG set, argument: the JSON file to write)."""
    if len(argv) == 1:
        difference, z = compare(*measure(DRAWS, small=4, groups_per_update=4))
        print(json.dumps({"backend": keras.backend.backend(), "difference": difference, "z": z}))
        return
    from keras_lars import distribute

    strategy = distribute.make_strategy("multi_worker")
    estimates, groups = measure(DRAWS, 4, 2, strategy=strategy, accumulate=False)
    difference, z = compare(estimates, groups)
    report = {"replicas": strategy.num_replicas_in_sync, "difference": difference, "z": z}
    with open(argv[1], "w") as f:
        json.dump(dict(report, estimates=estimates.tolist()), f)


if __name__ == "__main__":
    _main(sys.argv)
