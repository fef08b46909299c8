"""LARS and LAMB inside Keras: serialization, resume, strategies, XLA, precision, JAX."""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_lars
from tests import optimizer_cases as cases
from tests import reference
from tests.conftest import requires_jax

OPTIMIZERS = {
    "lars": lambda: keras_lars.LARS(learning_rate=0.5, weight_decay=1e-3, nesterov=True),
    "lamb": lambda: keras_lars.LAMB(
        learning_rate=0.01, weight_decay=1e-2, exclude_from_weight_decay=["bias"]
    ),
}


def _data(n=64, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 6)).astype("float32")
    y = (x[:, 0] + x[:, 1] > 0).astype("int32")
    return x, y


def _model(optimizer, seed=0, synchronized=False, **compile_kwargs):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.BatchNormalization(synchronized=synchronized),
            keras.layers.Dense(2),
        ]
    )
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        **compile_kwargs,
    )
    return model


def _fit(model, epochs, batch_size=16, initial_epoch=0):
    x, y = _data()
    model.fit(
        x,
        y,
        batch_size=batch_size,
        epochs=epochs,
        initial_epoch=initial_epoch,
        shuffle=False,
        verbose=0,
    )
    return [np.array(w) for w in model.get_weights()]


@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
def test_config_round_trip_and_registration(kind):
    optimizer = OPTIMIZERS[kind]()
    config = optimizer.get_config()
    assert type(optimizer).from_config(config).get_config() == config
    restored = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
    assert type(restored) is type(optimizer) and restored.get_config() == config
    assert keras.saving.get_registered_name(type(optimizer)).startswith("keras_lars>")


@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
def test_keras_file_resume_continues_exactly(kind, tmp_path):
    uninterrupted = _fit(_model(OPTIMIZERS[kind]()), epochs=4)
    model = _model(OPTIMIZERS[kind]())
    _fit(model, epochs=2)
    model.save(tmp_path / "model.keras")
    loaded = keras.saving.load_model(tmp_path / "model.keras")
    assert type(loaded.optimizer) is type(model.optimizer)
    assert loaded.optimizer.get_config() == model.optimizer.get_config()
    resumed = _fit(loaded, epochs=4, initial_epoch=2)
    for a, b in zip(resumed, uninterrupted):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
def test_tf_checkpoint_restore_continues_exactly(kind, tmp_path):
    uninterrupted = _fit(_model(OPTIMIZERS[kind]()), epochs=4)
    model = _model(OPTIMIZERS[kind]())
    _fit(model, epochs=2)
    path = tf.train.Checkpoint(model=model, optimizer=model.optimizer).save(tmp_path / "ckpt")
    fresh = _model(OPTIMIZERS[kind](), seed=1)
    fresh.optimizer.build(fresh.trainable_variables)
    tf.train.Checkpoint(model=fresh, optimizer=fresh.optimizer).restore(path).assert_consumed()
    assert int(fresh.optimizer.iterations.numpy()) == 8
    resumed = _fit(fresh, epochs=4, initial_epoch=2)
    for a, b in zip(resumed, uninterrupted):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
def test_mirrored_strategy_equals_one_device(kind):
    one_device = _fit(_model(OPTIMIZERS[kind]()), epochs=2, batch_size=32)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    assert strategy.num_replicas_in_sync == 2
    with strategy.scope():  # batch statistics over the global batch, as on one device
        model = _model(OPTIMIZERS[kind](), synchronized=True)
    mirrored = _fit(model, epochs=2, batch_size=32)
    for a, b in zip(mirrored, one_device):  # float32 reductions in another order
        np.testing.assert_allclose(a, b, rtol=5e-5, atol=1e-5)


@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
def test_xla_equals_graph_mode(kind):
    graph = _fit(_model(OPTIMIZERS[kind](), jit_compile=False), epochs=2)
    xla = _fit(_model(OPTIMIZERS[kind](), jit_compile=True), epochs=2)
    for a, b in zip(xla, graph):  # float32 reductions in another order
        np.testing.assert_allclose(a, b, rtol=5e-5, atol=1e-5)


@pytest.fixture
def restore_policy():
    policy = keras.mixed_precision.global_policy()
    yield
    keras.mixed_precision.set_global_policy(policy)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
def test_mixed_precision_trains_without_nan(kind, policy, restore_policy):
    keras.mixed_precision.set_global_policy(policy)
    model = _model(OPTIMIZERS[kind]())
    if policy == "mixed_float16":
        assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    x, y = _data()
    before = model.evaluate(x, y, verbose=0)
    history = model.fit(x, y, batch_size=16, epochs=3, shuffle=False, verbose=0)
    assert np.all(np.isfinite(history.history["loss"]))
    assert all(np.all(np.isfinite(w)) for w in model.get_weights())
    assert history.history["loss"][-1] < before


def test_float16_norms_do_not_overflow():
    # sum of squares of 70000 entries of 1.0 is 7e4 > float16's max (65504).
    variable = keras.Variable(np.ones((70000,), "float16"), name="w")
    optimizer = keras_lars.LARS(
        learning_rate=1.0, momentum=0.0, exclude_rank_one=False, trust_coefficient=0.01
    )
    optimizer.apply([keras.ops.ones((70000,), dtype="float16")], [variable])
    # ratio = 0.01 * ||w|| / ||g|| = 0.01 exactly: w = 1 - 0.01.
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(variable).astype("float32"), 0.99, rtol=1e-3
    )


JAX_SCRIPT = """
import json, os, sys
sys.path.insert(0, {root!r})
import keras, keras_lars
from tests import optimizer_cases as cases
assert keras.backend.backend() == "jax"
results = {{}}
for name, optimizer in [
    ("lars", keras_lars.LARS(learning_rate=2.0, trust_coefficient=0.01, weight_decay=0.01,
                             nesterov=True)),
    ("lamb", keras_lars.LAMB(learning_rate=0.05, weight_decay=0.01)),
]:
    results[name] = [w.tolist() for w in cases.run(optimizer)]
json.dump(results, sys.stdout)
"""


@requires_jax
@pytest.mark.subprocess
def test_jax_backend_matches_numpy_reference():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu")
    completed = subprocess.run(
        [sys.executable, "-c", JAX_SCRIPT.format(root=root)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    results = json.loads(completed.stdout)
    excluded = cases.rank_at_most_one()
    lars_expected = reference.lars(
        cases.initial_weights(),
        cases.gradient_steps(),
        [2.0] * cases.STEPS,
        eta=0.01,
        weight_decay=0.01,
        nesterov=True,
        decay=[not e for e in excluded],
        adapt=[not e for e in excluded],
    )
    lamb_expected = reference.lamb(
        cases.initial_weights(), cases.gradient_steps(), [0.05] * cases.STEPS, weight_decay=0.01
    )
    cases.assert_weights_close([np.array(w) for w in results["lars"]], lars_expected)
    cases.assert_weights_close([np.array(w) for w in results["lamb"]], lamb_expected)


def test_slot_fallback_creates_what_keras_creates():
    """`_add_slots_before_3_10` (Keras 3.8/3.9) against Keras's own
    `add_optimizer_variables` where it exists: the same variables, in the
    same interleaved order, None for a variable overwritten with its gradient."""
    from keras_lars.layerwise import _add_slots_before_3_10

    kernel = keras.Variable(np.ones((3, 2), "float32"), name="kernel")
    bias = keras.Variable(np.ones((2,), "float32"), name="bias")
    scale = keras.Variable(np.ones((), "float32"), name="scale")
    scale.overwrite_with_gradient = True
    variables = [kernel, bias, scale]

    def describe(slots):
        return [
            [None if v is None else (v.name, tuple(v.shape), v.dtype) for v in s] for s in slots
        ]

    fallback_optimizer = keras.optimizers.SGD()
    fallback = _add_slots_before_3_10(fallback_optimizer, variables, ["m", "v"])
    assert describe(fallback) == [
        [
            (f"{kernel.path}_m".replace("/", "_"), (3, 2), "float32"),
            (f"{bias.path}_m".replace("/", "_"), (2,), "float32"),
            None,
        ],
        [
            (f"{kernel.path}_v".replace("/", "_"), (3, 2), "float32"),
            (f"{bias.path}_v".replace("/", "_"), (2,), "float32"),
            None,
        ],
    ]
    created = [v.name for v in fallback_optimizer.variables if v.name.endswith(("_m", "_v"))]
    assert created == [
        fallback[0][0].name,
        fallback[1][0].name,
        fallback[0][1].name,
        fallback[1][1].name,
    ]  # interleaved
    if hasattr(keras.optimizers.Optimizer, "add_optimizer_variables"):  # Keras 3.10+
        keras_optimizer = keras.optimizers.SGD()
        assert describe(keras_optimizer.add_optimizer_variables(variables, ["m", "v"])) == (
            describe(fallback)
        )
        assert [v.name for v in keras_optimizer.variables] == [
            v.name for v in fallback_optimizer.variables
        ]
