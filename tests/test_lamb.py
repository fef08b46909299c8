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
