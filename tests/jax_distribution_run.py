"""Run by tests/test_jax_distribution.py in a child process with
KERAS_BACKEND=jax and 8 simulated CPU devices (XLA_FLAGS); prints JSON:
for LARS and LAMB, each keras.distribution setup against one device (or the
one line in which the optimizer refuses it on this Keras)."""

import inspect
import json
import sys

import jax
import keras
import numpy as np

import keras_lars

assert keras.backend.backend() == "jax" and len(jax.devices()) == 8, jax.devices()
rng = np.random.default_rng(0)
x = rng.normal(size=(256, 24)).astype("float32")
y = rng.integers(0, 10, size=(256,))
OPTIMIZERS = {
    "lars": lambda: keras_lars.LARS(2.0, trust_coefficient=0.01, weight_decay=0.01),
    "lamb": lambda: keras_lars.LAMB(0.01, weight_decay=0.01),
}


def model_parallel(shape, devices):
    """The kernels sharded over "model": hidden's output units, logits' inputs."""
    mesh = keras.distribution.DeviceMesh(shape, ["batch", "model"], devices)
    layout = keras.distribution.LayoutMap(mesh)
    layout[".*hidden/kernel"] = (None, "model")
    layout[".*logits/kernel"] = ("model", None)
    arguments = {"layout_map": layout, "batch_dim_name": "batch"}
    if "device_mesh" in inspect.signature(keras.distribution.ModelParallel).parameters:
        arguments["device_mesh"] = mesh  # Keras < 3.11
    return keras.distribution.ModelParallel(**arguments)


SETUPS = {
    "data_parallel_8": lambda: keras.distribution.DataParallel(
        device_mesh=keras.distribution.DeviceMesh((8,), ["batch"], jax.devices())
    ),
    "model_parallel_2x2": lambda: model_parallel((2, 2), jax.devices()[:4]),
    "model_parallel_2x4": lambda: model_parallel((2, 4), jax.devices()),
    # 4 steps per compiled call (an on-device loop) on the same 2x4 mesh.
    "model_parallel_2x4_spe4": lambda: model_parallel((2, 4), jax.devices()),
}


def train(optimizer, steps_per_execution=1):
    keras.utils.set_random_seed(1)
    model = keras.Sequential(
        [
            keras.Input((24,)),
            keras.layers.Dense(64, activation="relu", name="hidden"),
            keras.layers.Dense(10, name="logits"),
        ]
    )
    model.compile(
        optimizer=OPTIMIZERS[optimizer](),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        steps_per_execution=steps_per_execution,
    )
    model.fit(x, y, batch_size=64, epochs=2, shuffle=False, verbose=0)
    return model


def spec(variable):
    """The variable's partition spec as a list, one entry (a mesh axis or None)
    per dimension: jax and Keras versions print and trim the same spec differently."""
    axes = list(variable.value.sharding.spec)
    return axes + [None] * (len(variable.shape) - len(axes))


results = {}
for optimizer in OPTIMIZERS:
    keras.distribution.set_distribution(None)
    reference = [np.asarray(w) for w in train(optimizer).get_weights()]
    for name, setup in SETUPS.items():
        keras.distribution.set_distribution(setup())
        try:
            model = train(optimizer, steps_per_execution=4 if name.endswith("_spe4") else 1)
        except keras_lars.compat.UnsupportedVersionError as error:
            results[f"{optimizer}/{name}"] = {"refused": str(error)}
            continue
        weights = [np.asarray(w) for w in model.get_weights()]
        slots = [v for v in model.optimizer.variables if "hidden_kernel" in v.path]
        results[f"{optimizer}/{name}"] = {
            "difference": max(
                float(np.max(np.abs(a - b)) / np.max(np.abs(b))) for a, b in zip(weights, reference)
            ),
            "kernel_shardings": [spec(v) for v in model.trainable_variables if "kernel" in v.path],
            "hidden_kernel_slot_shardings": [spec(v) for v in slots],
        }
keras.distribution.set_distribution(None)
json.dump(results, sys.stdout)
