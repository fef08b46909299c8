"""WarmupPolyDecayCallback and TrustRatioMonitor inside model.fit."""

import collections
import glob
import json
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_lars
from keras_lars import TrustRatioMonitor
from keras_lars import WarmupPolyDecay
from keras_lars import WarmupPolyDecayCallback
from tests.conftest import requires_jax

# 48 examples, batch 8: 6 steps an epoch. Warmup 4 steps, total 16.
PEAK, END, WARMUP, TOTAL = 2.0, 0.01, 4, 16
STEPS_PER_EPOCH = 6


def _expected_rate(step):
    """The documented curve, written out for these constants."""
    if step < WARMUP:
        return PEAK * (step + 1) / WARMUP
    if step < TOTAL:
        return END + (PEAK - END) * (1 - (step - WARMUP) / (TOTAL - WARMUP)) ** 2
    return END


def _callback():
    return WarmupPolyDecayCallback(PEAK, WARMUP, TOTAL, end_learning_rate=END)


def _data(n=48, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 6)).astype("float32")
    y = (x[:, 0] - x[:, 2] > 0).astype("int32")
    return x, y


def _model(learning_rate=0.5, steps_per_execution=1, seed=0, wrap=False, **lars_kwargs):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(8, activation="relu"),
            keras.layers.BatchNormalization(),
            keras.layers.Dense(2),
        ]
    )
    optimizer = keras_lars.LARS(
        learning_rate=learning_rate, weight_decay=1e-3, trust_coefficient=0.02, **lars_kwargs
    )
    if wrap:
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        steps_per_execution=steps_per_execution,
    )
    return model


def _fit(model, epochs=3, callbacks=(), initial_epoch=0):
    x, y = _data()
    return model.fit(
        x,
        y,
        batch_size=8,
        epochs=epochs,
        shuffle=False,
        verbose=0,
        callbacks=list(callbacks),
        initial_epoch=initial_epoch,
    )


def _assert_same_weights(a, b):
    for u, v in zip(a.get_weights(), b.get_weights()):
        np.testing.assert_array_equal(u, v)


def test_callback_gives_the_schedules_weights_with_steps_per_execution():
    by_schedule = _model(WarmupPolyDecay(PEAK, WARMUP, TOTAL, end_learning_rate=END))
    _fit(by_schedule)
    for steps_per_execution in (1, 4):  # 4: the callback runs after steps 4, 6, 10, ...
        model = _model(steps_per_execution=steps_per_execution)
        history = _fit(model, callbacks=[_callback()])
        _assert_same_weights(model, by_schedule)
        # History: the optimizer's rate at each epoch end (that of the next step).
        np.testing.assert_allclose(
            history.history["learning_rate"],
            [_expected_rate(STEPS_PER_EPOCH * e) for e in (1, 2, 3)],
            rtol=1e-6,
        )
    constant = _model(learning_rate=0.5)
    _fit(constant)
    assert not np.allclose(constant.get_weights()[0], by_schedule.get_weights()[0])


def test_callback_on_a_loss_scale_optimizer():
    by_schedule = _model(WarmupPolyDecay(PEAK, WARMUP, TOTAL, end_learning_rate=END))
    _fit(by_schedule, epochs=2)
    model = _model(wrap=True, steps_per_execution=4)
    history = _fit(model, epochs=2, callbacks=[_callback()])
    for u, v in zip(model.get_weights(), by_schedule.get_weights()):
        np.testing.assert_allclose(u, v, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(
        history.history["learning_rate"], [_expected_rate(6), _expected_rate(12)], rtol=1e-6
    )


def test_callback_under_mirrored_strategy():
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])  # see conftest.py
    with strategy.scope():
        by_schedule = _model(WarmupPolyDecay(PEAK, WARMUP, TOTAL, end_learning_rate=END))
    _fit(by_schedule, epochs=2)
    with strategy.scope():
        model = _model()
    history = _fit(model, epochs=2, callbacks=[_callback()])
    _assert_same_weights(model, by_schedule)
    np.testing.assert_allclose(
        history.history["learning_rate"], [_expected_rate(6), _expected_rate(12)], rtol=1e-6
    )


class _Interrupt(keras.callbacks.Callback):
    def __init__(self, at_step):
        super().__init__()
        self.at_step = at_step

    def on_train_batch_end(self, batch, logs=None):
        if int(self.model.optimizer.iterations) == self.at_step:
            raise RuntimeError("interrupted")


@pytest.mark.parametrize("same_model", [False, True])
def test_callback_resumes_after_backup_and_restore(tmp_path, same_model):
    uninterrupted = _model()
    _fit(uninterrupted, callbacks=[_callback()])

    backup = str(tmp_path / "backup")
    model = _model()
    with pytest.raises(RuntimeError, match="interrupted"):  # mid-way through epoch 2
        _fit(
            model,
            callbacks=[
                _callback(),
                keras.callbacks.BackupAndRestore(backup),
                _Interrupt(at_step=9),
            ],
        )
    if not same_model:  # a new process: new model (other initial weights), new callback
        model = _model(seed=7)
    # BackupAndRestore first: it loads the optimizer's variables before the
    # callback installs itself, so the layout must not depend on the callback.
    history = _fit(model, callbacks=[keras.callbacks.BackupAndRestore(backup), _callback()])
    assert history.epoch == [1, 2]  # resumed at the start of epoch 2
    assert int(model.optimizer.iterations) == 3 * STEPS_PER_EPOCH
    _assert_same_weights(model, uninterrupted)
    np.testing.assert_allclose(
        history.history["learning_rate"], [_expected_rate(12), _expected_rate(18)], rtol=1e-6
    )


class _RateProbe(keras.callbacks.Callback):
    """Reads the optimizer's rate variable, which the train step sets."""

    def __init__(self):
        super().__init__()
        self.rates = []

    def on_epoch_end(self, epoch, logs=None):
        hook = self.model.optimizer._learning_rate
        self.rates.append(float(hook.variable.numpy()))


def test_callback_reaches_a_train_function_traced_before_and_hands_back_a_float(tmp_path):
    model = _model(learning_rate=0.5)
    _fit(model, epochs=1)  # traces a train function that reads the float rate
    probe = _RateProbe()
    path = str(tmp_path / "checkpoint.keras")
    _fit(
        model,
        epochs=2,
        initial_epoch=1,
        callbacks=[_callback(), probe, keras.callbacks.ModelCheckpoint(path)],
    )
    # In-graph: after step s the variable holds the rate step s used.
    np.testing.assert_allclose(probe.rates, [_expected_rate(11)], rtol=1e-6)
    # A `.keras` saved mid-training loads with a float rate, the current one.
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded.optimizer._learning_rate, keras.Variable)
    np.testing.assert_allclose(float(loaded.optimizer.learning_rate), _expected_rate(12), rtol=1e-6)
    # After training the optimizer has its float rate back, at the current rate,
    # and a later fit without the callback keeps it constant (steps 12-17).
    assert isinstance(model.optimizer._learning_rate, keras.Variable)
    assert isinstance(model.optimizer.get_config()["learning_rate"], float)
    _fit(model, epochs=3, initial_epoch=2)
    np.testing.assert_allclose(float(model.optimizer.learning_rate), _expected_rate(12), rtol=1e-6)


def test_callback_refuses_an_optimizer_with_a_schedule():
    model = _model(WarmupPolyDecay(1.0, 2, 10))
    with pytest.raises(ValueError, match="learning_rate.*already a schedule"):
        _fit(model, epochs=1, callbacks=[_callback()])
    model = _model()
    model.optimizer.learning_rate = lambda: 0.1  # a callable rate
    with pytest.raises(ValueError, match="float `learning_rate`"):
        _fit(model, epochs=1, callbacks=[_callback()])
    with pytest.raises(ValueError, match="Two WarmupPolyDecayCallbacks"):
        _fit(_model(), epochs=1, callbacks=[_callback(), _callback()])


def test_callback_bad_input_and_config():
    with pytest.raises(ValueError, match="warmup_steps"):
        WarmupPolyDecayCallback(1.0, 30, 20)
    with pytest.raises(ValueError, match="power"):
        WarmupPolyDecayCallback(1.0, 2, 20, power=0)
    with pytest.raises(ValueError, match="schedule"):
        WarmupPolyDecayCallback.from_schedule(
            keras.optimizers.schedules.ExponentialDecay(1.0, 10, 0.5)
        )
    schedule = WarmupPolyDecay(
        3.0, 5, 50, power=1.0, end_learning_rate=0.0, start_learning_rate=0.5
    )
    callback = WarmupPolyDecayCallback.from_schedule(schedule)
    expected = schedule.get_config()
    expected.pop("name")
    assert callback.get_config() == expected
    assert WarmupPolyDecayCallback(**callback.get_config()).get_config() == expected


def _read_scalars(log_dir):
    series = collections.defaultdict(list)
    for path in glob.glob(os.path.join(log_dir, "events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                series[value.tag].append((event.step, float(tf.make_ndarray(value.tensor))))
    return series


class _KernelNorms(keras.callbacks.Callback):
    """||w|| of each kernel before each update, keyed by the update's step."""

    def __init__(self):
        super().__init__()
        self.norms = {}

    def on_train_batch_begin(self, batch, logs=None):
        # The inner optimizer's: Keras 3.8's LossScaleOptimizer.iterations stays 0.
        step = int(keras_lars.callbacks.inner_optimizer(self.model.optimizer).iterations)
        for layer in self.model.layers:
            if hasattr(layer, "kernel"):
                kernel = np.asarray(layer.kernel.numpy(), np.float64)
                self.norms[(layer.kernel.path, step)] = np.sqrt(np.sum(kernel**2))


@pytest.mark.parametrize("wrap", [False, True])
def test_trust_ratio_monitor_writes_one_series_per_adapted_layer(tmp_path, wrap):
    log_dir = str(tmp_path / "logs")
    norms = _KernelNorms()
    model = _model(record_trust_ratios=True, wrap=wrap)
    _fit(model, epochs=2, callbacks=[norms, TrustRatioMonitor(log_dir, every_n_steps=5)])
    series = _read_scalars(log_dir)
    kernels = [layer.kernel.path for layer in model.layers if hasattr(layer, "kernel")]
    assert len(kernels) == 2  # biases and batch-norm parameters are not adapted
    assert sorted(series) == sorted(
        f"{kind}/{path}"
        for kind in ("trust_ratio", "weight_norm", "update_norm")
        for path in kernels
    )
    for tag, points in series.items():
        assert [step for step, _ in points] == [5, 10]  # 12 steps, every 5
        assert all(np.isfinite(value) and value > 0 for _, value in points), tag
    for path in kernels:
        for step, value in series[f"weight_norm/{path}"]:
            # The norm the step-th update saw: the weights before it.
            np.testing.assert_allclose(value, norms.norms[(path, step - 1)], rtol=1e-5)
        ratios = series[f"trust_ratio/{path}"]
        updates = series[f"update_norm/{path}"]
        weights = series[f"weight_norm/{path}"]
        for (_, ratio), (_, update), (_, weight) in zip(ratios, updates, weights):
            # LARS: ratio = eta * ||w|| / (||g|| + beta * ||w||)
            np.testing.assert_allclose(ratio, 0.02 * weight / (update + 1e-3 * weight), rtol=1e-5)


def test_trust_ratio_monitor_with_steps_per_execution(tmp_path):
    log_dir = str(tmp_path / "logs")
    model = _model(record_trust_ratios=True, steps_per_execution=4)
    _fit(model, epochs=2, callbacks=[TrustRatioMonitor(log_dir, every_n_steps=5)])
    # Batch ends after steps 4, 6, 10, 12: the first at or past 5 and 10.
    steps = {tuple(s for s, _ in points) for points in _read_scalars(log_dir).values()}
    assert steps == {(6, 10)}


def test_trust_ratio_monitor_bad_input(tmp_path):
    log_dir = str(tmp_path / "logs")
    with pytest.raises(ValueError, match="record_trust_ratios"):
        _fit(_model(), epochs=1, callbacks=[TrustRatioMonitor(log_dir)])
    model = _model()
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    with pytest.raises(ValueError, match="LARS or LAMB"):
        model.fit(
            np.zeros((8, 6)), np.zeros((8, 2)), verbose=0, callbacks=[TrustRatioMonitor(log_dir)]
        )
    with pytest.raises(ValueError, match="every_n_steps"):
        TrustRatioMonitor(log_dir, every_n_steps=0)
    with pytest.raises(ValueError, match="log_dir"):
        TrustRatioMonitor("")


JAX_PROGRAM = textwrap.dedent("""
    import json, os
    os.environ["KERAS_BACKEND"] = "jax"
    import keras, numpy as np, keras_lars

    def run(steps_per_execution, callback):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"),
                                  keras.layers.Dense(2)])
        schedule = keras_lars.WarmupPolyDecay(2.0, 4, 16, end_learning_rate=0.01)
        model.compile(
            optimizer=keras_lars.LARS(learning_rate=0.5 if callback else schedule,
                                      trust_coefficient=0.02),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            steps_per_execution=steps_per_execution)
        rng = np.random.default_rng(0)
        x = rng.normal(size=(48, 6)).astype("float32")
        y = (x[:, 0] - x[:, 2] > 0).astype("int32")
        callbacks = [keras_lars.WarmupPolyDecayCallback.from_schedule(schedule)] if callback else []
        history = model.fit(x, y, batch_size=8, epochs=3, shuffle=False, verbose=0,
                            callbacks=callbacks)
        return model.get_weights(), history.history.get("learning_rate")

    reference, _ = run(1, callback=False)
    weights, rates = run(4, callback=True)
    print(json.dumps({
        "backend": keras.backend.backend(),
        "max_difference": max(float(np.max(np.abs(a - b))) for a, b in zip(reference, weights)),
        "rates": rates,
    }))
""")


@requires_jax
@pytest.mark.subprocess
def test_callback_on_the_jax_backend():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    environment = dict(os.environ, PYTHONPATH=root, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu")
    result = subprocess.run(
        [sys.executable, "-c", JAX_PROGRAM],
        capture_output=True,
        text=True,
        env=environment,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["backend"] == "jax"
    assert report["max_difference"] == 0.0
    np.testing.assert_allclose(
        report["rates"], [_expected_rate(6), _expected_rate(12), _expected_rate(18)], rtol=1e-6
    )


# --- DivergenceGuard ---------------------------------------------------------
def _diverging_model(rate):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, name="dense")], name="net")
    model.compile(optimizer=keras.optimizers.SGD(rate), loss="mse")
    return model


class _Saves(keras.callbacks.Callback):
    """Records the epochs whose end was reached (where a checkpoint would be)."""

    def __init__(self):
        super().__init__()
        self.epochs = []

    def on_epoch_end(self, epoch, logs=None):
        self.epochs.append(epoch + 1)


def _regression_data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(64, 4)).astype("float32"), rng.normal(size=(64, 1)).astype("float32")


def test_divergence_guard_raises_at_the_first_non_finite_loss_before_any_epoch_end():
    x, y = _regression_data()
    model, saves = _diverging_model(1e6), _Saves()
    with pytest.raises(keras_lars.NonFiniteLossError, match="loss became non-finite") as error:
        model.fit(
            x, y, batch_size=8, epochs=3, verbose=0, callbacks=[keras_lars.DivergenceGuard(), saves]
        )
    assert saves.epochs == []  # stopped inside epoch 1
    assert error.value.epoch == 1 and 1 <= error.value.step <= 8
    steps = int(model.optimizer.iterations.numpy())
    assert error.value.step == steps


def test_divergence_guard_catches_weights_made_non_finite_by_the_last_step():
    # One step per epoch: the loss logged is that of the weights before the
    # update, which is finite; the update itself overflows the weights.
    x, y = _regression_data()
    model, saves = _diverging_model(1e38), _Saves()
    guard = keras_lars.DivergenceGuard(raise_error=False)
    model.fit(x, 1e3 * y, batch_size=64, epochs=3, verbose=0, callbacks=[guard, saves])
    assert str(guard.diverged) == "variable net/dense/kernel became non-finite at step 1 (epoch 1)"
    assert (guard.diverged.step, guard.diverged.epoch) == (1, 1)
    assert int(model.optimizer.iterations.numpy()) == 1  # stop_training after epoch 1
    assert saves.epochs == [1]  # raise_error=False: later hooks of the epoch still run


def test_divergence_guard_leaves_a_healthy_run_alone():
    x, y = _regression_data()
    model, saves = _diverging_model(0.01), _Saves()
    guard = keras_lars.DivergenceGuard()
    model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[guard, saves])
    assert guard.diverged is None and saves.epochs == [1, 2]
    with pytest.raises(ValueError, match="raise_error"):
        keras_lars.DivergenceGuard(raise_error="yes")


@pytest.mark.parametrize("lars", [True, False], ids=["lars", "keras_sgd"])
def test_callback_counts_applied_updates_under_gradient_accumulation(lars):
    """With gradient_accumulation_steps=2 the 6 batches of an epoch are 3
    updates: the epoch-end rate is the schedule's at 3 updates an epoch, and
    the weights equal those of LARS given the schedule itself."""
    x, y = _data()
    models = []
    for rate in (_callback, lambda: WarmupPolyDecay(PEAK, WARMUP, TOTAL, end_learning_rate=END)):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(2)])
        schedule = rate()
        is_callback = isinstance(schedule, WarmupPolyDecayCallback)
        learning_rate = 0.5 if is_callback else schedule
        if lars:
            optimizer = keras_lars.LARS(learning_rate, gradient_accumulation_steps=2)
        elif is_callback:
            optimizer = keras.optimizers.SGD(learning_rate, gradient_accumulation_steps=2)
        else:
            break  # Keras's own optimizers hand a schedule micro-batches: no reference
        model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy")
        history = model.fit(
            x,
            y,
            batch_size=8,
            epochs=3,
            shuffle=False,
            verbose=0,
            callbacks=[schedule] if is_callback else [],
        )
        if is_callback:
            np.testing.assert_allclose(
                history.history["learning_rate"],
                [_expected_rate(3 * e) for e in (1, 2, 3)],
                rtol=1e-6,
            )
        models.append(model)
    if lars:
        _assert_same_weights(*models)
