"""keras_lars.compat: batch-norm moving statistics under several replicas
(`mean_batch_norm_statistics`) and the step count at the end of a dataset
of unknown cardinality (`iterations_after_data`), each shown failing on
Keras's own code. MirroredStrategy runs on the two logical CPUs of
conftest.py."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_lars
from keras_lars import compat

CPUS = ["/cpu:0", "/cpu:1"]


@pytest.fixture
def restore_compat():
    """Installs every workaround; leaves keras_lars.compat as found."""
    before = compat.applied()
    compat.apply()
    yield
    compat.unapply([name for name in compat.applied() if name not in before])
    compat.apply(before)


# --- mean_batch_norm_statistics ----------------------------------------------
MOMENTUM = 0.5
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


def _bn_model(synchronized=False):
    """Batch norm on the inputs (its statistics then depend on the data
    only), then a small convolutional classifier."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((6, 6, 2)),
        keras.layers.BatchNormalization(momentum=MOMENTUM, synchronized=synchronized),
        keras.layers.Conv2D(3, 3), keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(2),
    ])
    model.compile(optimizer=keras.optimizers.SGD(0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _fit_mirrored(strategy):
    _, global_batches, y = _replica_data()
    with strategy.scope():
        model = _bn_model()
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
    assert (bn.moving_mean.synchronization, bn.moving_mean.aggregation) == ("on_read", "mean")
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
    single = _bn_model()
    single.load_weights(tmp_path / "bn.weights.h5")
    loaded = keras.saving.load_model(tmp_path / "bn.keras")
    for restored in (single, loaded):
        for a, b in zip(restored.get_weights(), saved):
            np.testing.assert_array_equal(a, b)
    with strategy.scope():
        restored = _bn_model()
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
        synchronized = _bn_model(synchronized=True).layers[0].moving_mean
    assert isinstance(synchronized.value, tf.distribute.DistributedValues)
    assert synchronized.value.synchronization != tf.VariableSynchronization.ON_READ
    assert synchronized.aggregation == "none"

    x, global_batches, y = _replica_data()

    def fit_one_device():
        model = _bn_model()
        model.fit(global_batches, y, batch_size=16, epochs=EPOCHS, shuffle=False, verbose=0)
        return model

    patched = fit_one_device()
    assert patched.layers[0].moving_mean.synchronization == "auto"
    with compat.unpatched():
        unpatched = fit_one_device()
    for a, b in zip(patched.get_weights(), unpatched.get_weights()):  # bit-identical
        np.testing.assert_array_equal(a, b)


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
        peak_learning_rate=1.0, warmup_steps=4, total_steps=BATCHES * DATA_EPOCHS + 3,
        end_learning_rate=0.01)
    with strategy.scope():
        model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(2)])
        model.set_weights([np.linspace(-1, 1, 10, dtype="float32").reshape(5, 2),
                           np.zeros(2, "float32")])
        model.compile(optimizer=keras_lars.LARS(schedule, momentum=0.9, trust_coefficient=0.01),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      steps_per_execution=steps_per_execution)
    model.fit(dataset, epochs=DATA_EPOCHS, shuffle=False, verbose=0)
    return int(model.optimizer.iterations.numpy()), model.get_weights()


@pytest.mark.filterwarnings("ignore:Your input ran out of data")
@pytest.mark.parametrize("strategy_kind, steps_per_execution", [
    ("default", 1), ("mirrored", 1), ("mirrored", 4)])
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


def test_both_workarounds_are_undone_exactly():
    from keras.src.backend.tensorflow.trainer import TensorFlowTrainer

    bn = keras.layers.BatchNormalization
    names = ["mean_batch_norm_statistics", "iterations_after_data"]
    with compat.unpatched(names):
        originals = (bn.build, TensorFlowTrainer.make_train_function,
                     TensorFlowTrainer.evaluate, TensorFlowTrainer.predict)
        with compat.patched(names):
            patched = (bn.build, TensorFlowTrainer.make_train_function,
                       TensorFlowTrainer.evaluate, TensorFlowTrainer.predict)
            assert all(p is not o for p, o in zip(patched, originals))
        assert (bn.build, TensorFlowTrainer.make_train_function,
                TensorFlowTrainer.evaluate, TensorFlowTrainer.predict) == originals
