"""Shared fixtures for optimizer tests: variables, gradient sequences, runners."""

import keras
import numpy as np

# name -> shape. "zero_kernel" starts at 0 (||w|| = 0); "kernel" gets a zero
# gradient at step ZERO_GRADIENT_STEP (||g|| = 0): the zero-norm policy runs
# in every case.
SHAPES = {
    "kernel": (5, 4),
    "bias": (4,),
    "conv_kernel": (3, 3, 2, 4),
    "zero_kernel": (4, 3),
    "scale": (6,),
}
ZERO_GRADIENT_STEP = 3
STEPS = 12


def initial_weights(seed=0):
    rng = np.random.default_rng(seed)
    weights = []
    for name, shape in SHAPES.items():
        value = rng.normal(0.0, 1.0, shape)
        if name == "zero_kernel":
            value = np.zeros(shape)
        weights.append(value.astype("float32"))
    return weights


def gradient_steps(seed=1, steps=STEPS):
    rng = np.random.default_rng(seed)
    result = []
    for step in range(steps):
        grads = [rng.normal(0.0, 0.1, shape).astype("float32") for shape in SHAPES.values()]
        if step == ZERO_GRADIENT_STEP:
            grads[0] = np.zeros_like(grads[0])
        result.append(grads)
    return result


def make_variables(weights=None):
    weights = initial_weights() if weights is None else weights
    return [keras.Variable(value, name=name) for name, value in zip(SHAPES, weights)]


def run(optimizer, steps=None, weights=None):
    """Applies `steps` gradient lists eagerly; returns the final weights."""
    variables = make_variables(weights)
    for grads in steps if steps is not None else gradient_steps():
        optimizer.apply([keras.ops.convert_to_tensor(g) for g in grads], variables)
    return [keras.ops.convert_to_numpy(v) for v in variables]


def rank_at_most_one():
    return [len(shape) <= 1 for shape in SHAPES.values()]


def assert_weights_close(actual, expected, rtol=2e-5, atol=2e-6):
    for name, a, e in zip(SHAPES, actual, expected):
        np.testing.assert_allclose(a, e, rtol=rtol, atol=atol, err_msg=name)
