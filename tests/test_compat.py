"""keras_lars.compat's workarounds at work, each shown failing on Keras's own
code: batch-norm moving statistics under several replicas
(`mean_batch_norm_statistics`), the synchronized batch norm's variance
(`sync_batch_norm_variance`), the step count at the end of a dataset of unknown
cardinality (`iterations_after_data`), `distributed_datasets_from_function`
and `on_read_metric_variables`; and each undone exactly. MirroredStrategy runs
on the two logical CPUs of conftest.py. Where a workaround is installed at all
(versions, shapes, the environment) is tests/test_version_gates.py."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_lars
from keras_lars import compat
from keras_lars.compat import _registry
from tests.compat_models import CPUS
from tests.compat_models import MOMENTUM
from tests.compat_models import bn_model


@pytest.fixture
def restore_compat(restore_compat):
    """Installs every workaround; conftest.py's fixture of this name leaves
    keras_lars.compat as found."""
    compat.apply()


# --- mean_batch_norm_statistics ----------------------------------------------
EPOCHS = 2
STEPS = 4  # per epoch
LOCAL_BATCH = 8  # per replica; the global batch is 16


def _replica_data():
    """Different data for each replica: replica r sees rows of x[r] only
    (MirroredStrategy gives replica 0 the first half of each global batch)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, STEPS * LOCAL_BATCH, 6, 6, 2)).astype("float32")
    x[1] = 2.0 * x[1] + 3.0
    y = rng.integers(0, 2, size=2 * STEPS * LOCAL_BATCH).astype("int32")
    chunks = x.reshape(2, STEPS, LOCAL_BATCH, 6, 6, 2).transpose(1, 0, 2, 3, 4, 5)
    return x, chunks.reshape(-1, 6, 6, 2), y


def _reference_statistics(x_replica):
    """One device's moving mean and variance after EPOCHS epochs of STEPS
    batches: m <- momentum * m + (1 - momentum) * batch statistic."""
    mean, variance = np.zeros(2), np.ones(2)
    for _ in range(EPOCHS):
        for batch in x_replica.reshape(STEPS, LOCAL_BATCH, 6, 6, 2).astype("float64"):
            mean = MOMENTUM * mean + (1 - MOMENTUM) * batch.mean(axis=(0, 1, 2))
            variance = MOMENTUM * variance + (1 - MOMENTUM) * batch.var(axis=(0, 1, 2))
    return mean, variance


def _fit_mirrored(strategy):
    _, global_batches, y = _replica_data()
    with strategy.scope():
        model = bn_model()
    dataset = tf.data.Dataset.from_tensor_slices((global_batches, y)).batch(2 * LOCAL_BATCH)
    model.fit(dataset, epochs=EPOCHS, shuffle=False, verbose=0)
    return model, dataset


def _copies(strategy, variable):
    return [t.numpy() for t in strategy.experimental_local_results(variable.value)]


def test_batch_norm_statistics_are_the_mean_of_the_replicas(restore_compat, tmp_path):
    x, _, _ = _replica_data()
    references = [_reference_statistics(x[r]) for r in range(2)]  # (mean, variance) each

    # Keras's own code: each replica keeps its copy; outside reads see replica 0's.
    strategy = tf.distribute.MirroredStrategy(CPUS)
    with compat.unpatched(["mean_batch_norm_statistics"]):
        model, _ = _fit_mirrored(strategy)
    bn = model.layers[0]
    copies = _copies(strategy, bn.moving_mean)
    assert np.abs(copies[0] - copies[1]).max() > 1.0  # the copies drifted apart
    np.testing.assert_array_equal(model.get_weights()[2], copies[0])
    assert np.abs(copies[0] - np.mean([r[0] for r in references], axis=0)).max() > 1.0

    # Patched: each replica still updates its own copy exactly as one device
    # would on its batches; reading from outside gives the replicas' mean.
    strategy = tf.distribute.MirroredStrategy(CPUS)
    model, dataset = _fit_mirrored(strategy)
    bn = model.layers[0]
    assert bn.moving_mean.aggregation == "mean"
    assert bn.moving_mean.value.synchronization == tf.VariableSynchronization.ON_READ
    assert bn.moving_mean.value.aggregation == tf.VariableAggregation.MEAN
    for index, variable in enumerate([bn.moving_mean, bn.moving_variance]):
        for copy, reference in zip(_copies(strategy, variable), references):
            np.testing.assert_allclose(copy, reference[index], rtol=1e-5)
        mean = np.mean([reference[index] for reference in references], axis=0)
        np.testing.assert_allclose(model.get_weights()[2 + index], mean, rtol=1e-5)
    saved = model.get_weights()

    # Saved, checkpointed and loaded: the mean, in every copy.
    model.save_weights(tmp_path / "bn.weights.h5")
    model.save(tmp_path / "bn.keras")
    checkpoint = tf.train.Checkpoint(model=model).save(str(tmp_path / "ckpt"))
    single = bn_model()
    single.load_weights(tmp_path / "bn.weights.h5")
    loaded = keras.saving.load_model(tmp_path / "bn.keras")
    for restored in (single, loaded):
        for a, b in zip(restored.get_weights(), saved):
            np.testing.assert_array_equal(a, b)
    with strategy.scope():
        restored = bn_model()
    tf.train.Checkpoint(model=restored).restore(checkpoint).expect_partial()
    for copy in _copies(strategy, restored.layers[0].moving_mean):
        np.testing.assert_array_equal(copy, saved[2])

    # evaluate() under the strategy uses the mean (as the saved model does).
    evaluated = model.evaluate(dataset, verbose=0)
    for index, variable in enumerate([bn.moving_mean, bn.moving_variance]):
        for copy in _copies(strategy, variable):
            np.testing.assert_array_equal(copy, saved[2 + index])
    assert evaluated == pytest.approx(loaded.evaluate(dataset, verbose=0), rel=1e-5)


def test_batch_norm_patch_leaves_synchronized_and_single_replica_layers_alone(restore_compat):
    with tf.distribute.MirroredStrategy(CPUS).scope():
        synchronized = bn_model(synchronized=True).layers[0].moving_mean
    assert isinstance(synchronized.value, tf.distribute.DistributedValues)
    assert synchronized.value.synchronization != tf.VariableSynchronization.ON_READ
    assert synchronized.aggregation == "none"

    _, global_batches, y = _replica_data()

    def fit_one_device():
        model = bn_model()
        model.fit(global_batches, y, batch_size=16, epochs=EPOCHS, shuffle=False, verbose=0)
        return model

    patched = fit_one_device()
    assert patched.layers[0].moving_mean.value.synchronization == tf.VariableSynchronization.AUTO
    with compat.unpatched():
        unpatched = fit_one_device()
    for a, b in zip(patched.get_weights(), unpatched.get_weights()):  # bit-identical
        np.testing.assert_array_equal(a, b)


# --- sync_batch_norm_variance ------------------------------------------------
def _synchronized_batch_variance(strategy, x):
    """The variance a BatchNormalization(synchronized=True) measures on the
    global batch `x` in one training step (momentum 0: the moving variance
    is the batch's)."""
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input(x.shape[1:]),
                keras.layers.BatchNormalization(momentum=0.0, synchronized=True),
            ]
        )
        model.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse")
    model.fit(x, np.zeros_like(x), batch_size=len(x), epochs=1, shuffle=False, verbose=0)
    return model.layers[0].moving_variance.numpy()


@pytest.mark.parametrize("replicas", [1, 2])
def test_synchronized_batch_norm_variance_is_two_pass(restore_compat, replicas):
    # |mean| >> std: E[x^2] - E[x]^2 keeps no correct digit in float32
    # (E[x^2] ~ 1e4 has an ulp of 2^-10 against a variance of ~1e-4).
    x = (100.0 + 0.01 * np.random.default_rng(0).normal(size=(16, 3))).astype("float32")
    reference = x.astype("float64").var(axis=0)  # two passes, float64
    strategy = tf.distribute.MirroredStrategy(CPUS[:replicas])
    with compat.unpatched(["sync_batch_norm_variance"]):
        one_pass = _synchronized_batch_variance(strategy, x)
    assert np.all(np.abs(one_pass - reference) > 0.5 * reference)  # Keras's own code
    two_pass = _synchronized_batch_variance(strategy, x)
    np.testing.assert_allclose(two_pass, reference, rtol=1e-5)


def test_synchronized_batch_norm_trains_on_two_replicas_as_on_one(restore_compat):
    """A step of a synchronized batch norm model on 2 replicas equals the
    step on one device with the whole batch (gradients through the two-pass
    statistics and the all-reduces included)."""
    rng = np.random.default_rng(1)
    x = (30.0 + 0.1 * rng.normal(size=(16, 4, 4, 2))).astype("float32")
    y = rng.integers(0, 2, size=16).astype("int32")

    def step(strategy):
        with strategy.scope():
            keras.utils.set_random_seed(0)
            model = keras.Sequential(
                [
                    keras.Input((4, 4, 2)),
                    keras.layers.BatchNormalization(synchronized=True),
                    keras.layers.Conv2D(3, 3),
                    keras.layers.GlobalAveragePooling2D(),
                    keras.layers.Dense(2),
                ]
            )
            model.compile(
                optimizer=keras.optimizers.SGD(0.5),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            )
        model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
        return model.get_weights()

    for two, one in zip(
        step(tf.distribute.MirroredStrategy(CPUS)), step(tf.distribute.get_strategy())
    ):
        # The sums' order still differs (the mean's rounding, amplified by
        # 1/std = 10): 1.3e-5 apart; Keras's one pass: 3e-3.
        np.testing.assert_allclose(two, one, rtol=0, atol=1e-4)


# --- iterations_after_data ---------------------------------------------------
BATCHES = 5  # per epoch
DATA_EPOCHS = 3


def _count_and_weights(strategy, steps_per_execution, unknown_cardinality):
    """Fits DATA_EPOCHS epochs of BATCHES batches with LARS on a warmup +
    decay schedule (so that a shifted step count changes the weights)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(BATCHES * 8, 5)).astype("float32")
    y = (x[:, 0] > 0).astype("int32")
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    if unknown_cardinality:
        dataset = dataset.filter(lambda *batch: True)
        assert dataset.cardinality() == tf.data.UNKNOWN_CARDINALITY
    schedule = keras_lars.WarmupPolyDecay(
        peak_learning_rate=1.0,
        warmup_steps=4,
        total_steps=BATCHES * DATA_EPOCHS + 3,
        end_learning_rate=0.01,
    )
    with strategy.scope():
        model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(2)])
        model.set_weights(
            [np.linspace(-1, 1, 10, dtype="float32").reshape(5, 2), np.zeros(2, "float32")]
        )
        model.compile(
            optimizer=keras_lars.LARS(schedule, momentum=0.9, trust_coefficient=0.01),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            steps_per_execution=steps_per_execution,
        )
    model.fit(dataset, epochs=DATA_EPOCHS, shuffle=False, verbose=0)
    return int(model.optimizer.iterations.numpy()), model.get_weights()


@pytest.mark.filterwarnings("ignore:Your input ran out of data")
@pytest.mark.parametrize(
    "strategy_kind, steps_per_execution", [("default", 1), ("mirrored", 1), ("mirrored", 4)]
)
def test_iterations_count_the_steps_run_at_the_end_of_unknown_cardinality(
    strategy_kind, steps_per_execution, restore_compat
):
    """mirrored with 4: the steps_per_execution_loop patch's first step."""

    def strategy():
        if strategy_kind == "default":
            return tf.distribute.get_strategy()
        return tf.distribute.MirroredStrategy(CPUS)

    count, reference = _count_and_weights(strategy(), steps_per_execution, False)
    assert count == BATCHES * DATA_EPOCHS  # known cardinality: Keras stops in time

    with compat.unpatched(["iterations_after_data"]):
        count, weights = _count_and_weights(strategy(), steps_per_execution, True)
    assert count == (BATCHES + 1) * DATA_EPOCHS  # one extra count each epoch
    assert max(np.abs(a - b).max() for a, b in zip(weights, reference)) > 1e-4  # schedule shifted

    count, weights = _count_and_weights(strategy(), steps_per_execution, True)
    assert count == BATCHES * DATA_EPOCHS
    for a, b in zip(weights, reference):
        np.testing.assert_array_equal(a, b)


def test_a_jit_compiled_fit_with_every_workaround_equals_graph_mode(restore_compat):
    # iterations_after_data's control dependency on the batch once reached the
    # optimizer's slots, which Keras creates in the first trace: XLA refused.
    # (One device: XLA cannot run a step over MirroredStrategy's logical CPUs,
    # "Trying to access resource ... located in device CPU:1 from CPU:0".)
    def fit(jit_compile):
        rng = np.random.default_rng(0)
        x = rng.normal(size=(32, 5)).astype("float32")
        y = (x[:, 0] > 0).astype("int32")
        model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(2)])
        model.set_weights(
            [np.linspace(-1, 1, 10, dtype="float32").reshape(5, 2), np.zeros(2, "float32")]
        )
        model.compile(
            optimizer=keras_lars.LARS(0.5, momentum=0.9, trust_coefficient=0.01),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            jit_compile=jit_compile,
        )
        model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
        assert int(model.optimizer.iterations.numpy()) == 8
        return model.get_weights()

    assert "iterations_after_data" in compat.applied()
    for a, b in zip(fit(jit_compile=True), fit(jit_compile=False)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_the_workarounds_are_undone_exactly():
    from keras.src.backend.tensorflow import nn
    from keras.src.backend.tensorflow.trainer import TensorFlowTrainer

    bn = keras.layers.BatchNormalization
    names = ["mean_batch_norm_statistics", "iterations_after_data", "sync_batch_norm_variance"]
    with compat.unpatched(names):
        originals = (
            nn._compute_moments_sync,
            bn.build,
            TensorFlowTrainer.make_train_function,
            TensorFlowTrainer.evaluate,
            TensorFlowTrainer.predict,
        )
        with compat.patched(names):
            patched = (
                nn._compute_moments_sync,
                bn.build,
                TensorFlowTrainer.make_train_function,
                TensorFlowTrainer.evaluate,
                TensorFlowTrainer.predict,
            )
            assert all(p is not o for p, o in zip(patched, originals))
        assert (
            nn._compute_moments_sync,
            bn.build,
            TensorFlowTrainer.make_train_function,
            TensorFlowTrainer.evaluate,
            TensorFlowTrainer.predict,
        ) == originals


# --- distributed_datasets_from_function (needed before Keras 3.9) ------------
def test_fit_on_distribute_datasets_from_function(restore_compat):
    """keras#20134: on Keras < 3.9 Keras's own fit() rejects the dataset; the
    workaround is installed there only, and fit() then trains as on the
    datasets Keras knows. From 3.9 on Keras's own code does it."""
    _, global_batches, y = _replica_data()

    def fit(distribute):
        strategy = tf.distribute.MirroredStrategy(CPUS)
        with strategy.scope():
            model = bn_model(synchronized=True)
        dataset = tf.data.Dataset.from_tensor_slices((global_batches, y))
        if distribute:
            data = strategy.distribute_datasets_from_function(
                lambda context: dataset.batch(context.get_per_replica_batch_size(16))
            )
        else:
            data = dataset.batch(16)
        model.fit(data, epochs=1, verbose=0)
        return model.get_weights()

    workaround = _registry._BY_NAME["distributed_datasets_from_function"]
    installed_version = tuple(int(p) for p in keras.__version__.split(".")[:2])
    assert workaround.needed() == (installed_version < (3, 9))
    with compat.unpatched():
        if workaround.needed():
            with pytest.raises(ValueError, match="Unrecognized data type"):
                fit(distribute=True)
        else:
            reference = fit(distribute=False)
            for a, b in zip(fit(distribute=True), reference):
                np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    compat.apply()
    assert ("distributed_datasets_from_function" in compat.applied()) == workaround.needed()
    reference = fit(distribute=False)
    for a, b in zip(fit(distribute=True), reference):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


# --- on_read_metric_variables (needed before Keras 3.10) ---------------------
def test_metrics_under_two_replicas_equal_one_device(restore_compat):
    """keras#21054: before Keras 3.10, evaluate() under MirroredStrategy
    reports another loss and accuracy than one device with the same weights;
    the workaround is installed there only. From 3.10 on Keras is right."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 5)).astype("float32")
    y = rng.integers(0, 2, 64)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)

    def evaluate(strategy):
        keras.utils.set_random_seed(0)
        with strategy.scope():
            model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(2)])
            model.compile(
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                metrics=["accuracy"],
            )
        return model.evaluate(dataset, verbose=0)

    single = evaluate(tf.distribute.get_strategy())
    workaround = _registry._BY_NAME["on_read_metric_variables"]
    installed_version = tuple(int(p) for p in keras.__version__.split(".")[:2])
    assert workaround.needed() == (installed_version < (3, 10))
    with compat.unpatched():
        own = evaluate(tf.distribute.MirroredStrategy(CPUS))
    if workaround.needed():
        assert abs(own[0] - single[0]) > 1e-3 and own[1] != single[1]  # the bug
    else:
        np.testing.assert_allclose(own, single, rtol=1e-6)
    compat.apply()
    assert ("on_read_metric_variables" in compat.applied()) == workaround.needed()
    np.testing.assert_allclose(evaluate(tf.distribute.MirroredStrategy(CPUS)), single, rtol=1e-6)
