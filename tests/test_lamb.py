import itertools

import keras
import numpy as np
import pytest

import keras_lars
from tests import optimizer_cases as cases
from tests import reference

LR = 0.05
ATOL = 5e-6  # float32 against float64; a step is about lr in size


@pytest.mark.parametrize(
    "weight_decay, exclude_rank_one, bounds",
    list(itertools.product((0.0, 0.01), (False, True), (None, (0.0, 0.8)))),
)
def test_matches_numpy_reference(weight_decay, exclude_rank_one, bounds):
    optimizer = keras_lars.LAMB(
        learning_rate=LR,
        weight_decay=weight_decay,
        exclude_rank_one=exclude_rank_one,
        trust_ratio_bounds=bounds,
    )
    included = [not (exclude_rank_one and low) for low in cases.rank_at_most_one()]
    expected = reference.lamb(
        cases.initial_weights(),
        cases.gradient_steps(),
        [LR] * cases.STEPS,
        weight_decay=weight_decay,
        decay=included,
        adapt=included,
        bounds=bounds,
    )
    cases.assert_weights_close(cases.run(optimizer), expected, atol=ATOL)


def test_tfa_defaults_and_exclusion_fallback():
    # tfa.optimizers.LAMB: lr 1e-3, betas 0.9/0.999, eps 1e-6, no rank rule, and the
    # layer-adaptation list falls back to the weight-decay list.
    optimizer = keras_lars.LAMB(weight_decay=0.01, exclude_from_weight_decay=["bias", "scale"])
    names = list(cases.SHAPES)
    included = [n not in ("bias", "scale") for n in names]
    expected = reference.lamb(
        cases.initial_weights(),
        cases.gradient_steps(),
        [1e-3] * cases.STEPS,
        weight_decay=0.01,
        decay=included,
        adapt=included,
    )
    cases.assert_weights_close(cases.run(optimizer), expected, atol=ATOL)
    config = optimizer.get_config()
    assert (config["beta_1"], config["beta_2"], config["epsilon"]) == (0.9, 0.999, 1e-6)


def test_separate_layer_adaptation_list():
    optimizer = keras_lars.LAMB(
        learning_rate=LR,
        weight_decay=0.01,
        exclude_from_weight_decay=["kernel"],
        exclude_from_layer_adaptation=["^conv"],
    )
    names = list(cases.SHAPES)
    decay = ["kernel" not in n for n in names]
    adapt = [n != "conv_kernel" for n in names]
    expected = reference.lamb(
        cases.initial_weights(),
        cases.gradient_steps(),
        [LR] * cases.STEPS,
        weight_decay=0.01,
        decay=decay,
        adapt=adapt,
    )
    cases.assert_weights_close(cases.run(optimizer), expected, atol=ATOL)


def test_equals_keras_lamb_without_weight_decay():
    ours = cases.run(keras_lars.LAMB(learning_rate=LR, epsilon=1e-7))
    theirs = cases.run(keras.optimizers.Lamb(learning_rate=LR, epsilon=1e-7))
    cases.assert_weights_close(ours, theirs)


def test_differs_from_keras_lamb_with_weight_decay():
    # Keras's Lamb decays outside the trust ratio (decoupled); ours inside it (tfa).
    ours = cases.run(keras_lars.LAMB(learning_rate=LR, epsilon=1e-7, weight_decay=0.1))
    theirs = cases.run(keras.optimizers.Lamb(learning_rate=LR, epsilon=1e-7, weight_decay=0.1))
    assert np.max(np.abs(ours[0] - theirs[0])) > 1e-3


def test_first_step_by_hand():
    # Step 1: m_hat = g, v_hat = g^2, r = g / (|g| + eps) ~ sign(g) = (1, 1);
    # u = r + 0.5 w = (2.5, 3); ratio = ||w|| / ||u|| = 5 / sqrt(15.25);
    # w = w - lr * ratio * u.
    variable = keras.Variable(np.array([3.0, 4.0], "float32"), name="w")
    optimizer = keras_lars.LAMB(learning_rate=0.1, weight_decay=0.5, epsilon=1e-12)
    optimizer.apply([keras.ops.convert_to_tensor(np.array([0.2, 0.3], "float32"))], [variable])
    ratio = 5.0 / np.sqrt(2.5**2 + 3.0**2)
    expected = np.array([3.0, 4.0]) - 0.1 * ratio * np.array([2.5, 3.0])
    np.testing.assert_allclose(keras.ops.convert_to_numpy(variable), expected, rtol=1e-6)


def test_bias_corrections_are_float32_exact():
    # ||r|| at each step against float64. Before, 1 - beta_2^t was computed
    # in float32 from float32(beta_2) while the moment used (1 - beta_2)
    # exactly: ||r|| was 6.8e-6 off at step 1 (tensorflow-addons: 1.3e-7).
    rng = np.random.default_rng(3)
    weights = [rng.normal(size=(64, 32)).astype("float32")]
    steps = [[rng.normal(size=(64, 32)).astype("float32")] for _ in range(6)]
    expected = []
    reference.lamb(weights, steps, [1e-3] * 6, update_norms=expected)
    variable = keras.Variable(weights[0], name="w")
    optimizer = keras_lars.LAMB(learning_rate=1e-3, record_trust_ratios=True)
    for step, norm in zip(steps, expected):
        optimizer.apply([keras.ops.convert_to_tensor(step[0])], [variable])
        _, _, update_norm = optimizer.trust_ratio_stats()["w"]
        np.testing.assert_allclose(update_norm, norm, rtol=5e-7)


@pytest.mark.parametrize(
    "dtype, mantissa_bits, smallest_step", [("float16", 10, 2.0**-24), ("bfloat16", 7, 2.0**-133)]
)
def test_low_precision_variables_keep_float32_moments(dtype, mantissa_bits, smallest_step):
    # Gradients from 1e-5 to 1e-1: in float16, v = (1 - beta_2) g^2 and
    # eps * sqrt(1 - beta_2^t) underflowed, and such an entry stepped up to
    # ~480 times too far. Now every step is the float64 step from the same
    # weights (moments in float64), rounded once: within one ulp.
    rng = np.random.default_rng(0)
    shape = (64, 32)
    weights = rng.normal(0, 0.05, shape).astype(dtype)
    steps = [
        [(rng.normal(size=shape) * 10.0 ** rng.uniform(-5, -1, shape)).astype(dtype)]
        for _ in range(5)
    ]
    variable = keras.Variable(weights, dtype=dtype, name="w")
    optimizer = keras_lars.LAMB(learning_rate=0.01)
    for k, step in enumerate(steps):
        before = keras.ops.convert_to_numpy(variable).astype(np.float64)
        optimizer.apply([keras.ops.convert_to_tensor(step[0])], [variable])
        # The reference accumulates the moments of steps 0..k at lr 0 but the last.
        (expected,) = reference.lamb(
            [before], [[g[0].astype(np.float64)] for g in steps[: k + 1]], [0.0] * k + [0.01]
        )
        actual = keras.ops.convert_to_numpy(variable).astype(np.float64)
        exponent = np.floor(np.log2(np.maximum(np.abs(expected), smallest_step)))
        ulp = np.maximum(2.0 ** (exponent - mantissa_bits), smallest_step)
        error = np.abs(actual - expected) / ulp
        assert error.max() <= 1.0, (k, error.max())
    assert {str(v.dtype) for v in optimizer.momentums + optimizer.velocities} == {"float32"}


@pytest.mark.parametrize(
    "argument, value",
    [
        ("learning_rate", -0.1),
        ("beta_1", 1.0),
        ("beta_2", -0.5),
        ("epsilon", 0.0),
        ("weight_decay", -1.0),
        ("trust_ratio_bounds", (2.0, 1.0)),
        ("trust_ratio_bounds", 3.0),
        ("exclude_from_weight_decay", ["[a"]),
        ("exclude_from_layer_adaptation", 5),
    ],
)
def test_invalid_hyperparameters_name_the_argument(argument, value):
    with pytest.raises(ValueError, match=argument.replace("(", r"\(").split("[")[0]):
        keras_lars.LAMB(**{argument: value})
