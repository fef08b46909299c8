import itertools

import keras
import numpy as np
import pytest

import keras_lars
from tests import optimizer_cases as cases
from tests import reference

LR = 2.0
ETA = 0.01

OPTIONS = [
    dict(
        momentum=momentum,
        nesterov=nesterov,
        classic_momentum=classic,
        trust_denominator=denominator,
        clip_trust_ratio=clip,
        weight_decay=wd,
    )
    for momentum, nesterov, classic, denominator, clip, wd in itertools.product(
        (0.0, 0.9),
        (False, True),
        (True, False),
        ("sum_of_norms", "norm_of_sum", "update_norm"),
        (False, True),
        (0.0, 0.01),
    )
    if not (nesterov and momentum == 0.0) and not (classic and denominator == "update_norm")
]


def _reference(options, learning_rates=None, decay=None, adapt=None, epsilon=0.0):
    excluded = cases.rank_at_most_one()
    return reference.lars(
        cases.initial_weights(),
        cases.gradient_steps(),
        learning_rates or [LR] * cases.STEPS,
        momentum=options["momentum"],
        weight_decay=options["weight_decay"],
        eta=ETA,
        epsilon=epsilon,
        nesterov=options["nesterov"],
        classic=options["classic_momentum"],
        denominator=options["trust_denominator"],
        clip=options["clip_trust_ratio"],
        decay=decay or [not e for e in excluded],
        adapt=adapt or [not e for e in excluded],
    )


@pytest.mark.parametrize(
    "options", OPTIONS, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items())
)
def test_matches_numpy_reference_for_every_option(options):
    optimizer = keras_lars.LARS(learning_rate=LR, trust_coefficient=ETA, **options)
    cases.assert_weights_close(cases.run(optimizer), _reference(options))


def test_paper_update_by_hand_for_one_step():
    # One step of Algorithm 1 on a 2-vector, computed by hand:
    # w = (3, 4), g = (0.6, 0.8): ||w|| = 5, ||g|| = 1, beta = 0.1, eta = 0.01
    # ratio = 0.01 * 5 / (1 + 0.1 * 5) = 1/30; v = lr * ratio * (g + beta w)
    # with lr = 3: v = 0.1 * (0.9, 1.2) = (0.09, 0.12); w = (2.91, 3.88).
    variable = keras.Variable(np.array([[3.0, 4.0]], "float32"), name="w")
    optimizer = keras_lars.LARS(learning_rate=3.0, weight_decay=0.1, trust_coefficient=0.01)
    optimizer.apply([keras.ops.convert_to_tensor(np.array([[0.6, 0.8]], "float32"))], [variable])
    np.testing.assert_allclose(keras.ops.convert_to_numpy(variable), [[2.91, 3.88]], rtol=1e-6)


def test_epsilon_enters_the_denominator():
    options = dict(OPTIONS[-1])
    optimizer = keras_lars.LARS(learning_rate=LR, trust_coefficient=ETA, epsilon=0.5, **options)
    cases.assert_weights_close(cases.run(optimizer), _reference(options, epsilon=0.5))


def test_learning_rate_schedule_is_followed_every_step():
    schedule = keras.optimizers.schedules.ExponentialDecay(LR, decay_steps=3, decay_rate=0.5)
    options = dict(
        momentum=0.9,
        nesterov=False,
        classic_momentum=True,
        trust_denominator="sum_of_norms",
        clip_trust_ratio=False,
        weight_decay=0.01,
    )
    optimizer = keras_lars.LARS(learning_rate=schedule, trust_coefficient=ETA, **options)
    rates = [LR * 0.5 ** (t / 3) for t in range(cases.STEPS)]
    cases.assert_weights_close(cases.run(optimizer), _reference(options, learning_rates=rates))


def test_zero_weights_take_the_global_rate():
    variable = keras.Variable(np.zeros((2, 2), "float32"), name="w")
    optimizer = keras_lars.LARS(learning_rate=0.5, momentum=0.0, weight_decay=0.1)
    optimizer.apply([keras.ops.ones((2, 2))], [variable])
    np.testing.assert_allclose(keras.ops.convert_to_numpy(variable), -0.5 * np.ones((2, 2)))


def test_zero_gradient_still_decays_at_the_global_rate():
    # ratio 1 (not eta / beta): w <- w - lr * beta * w
    variable = keras.Variable(np.full((2, 2), 2.0, "float32"), name="w")
    optimizer = keras_lars.LARS(learning_rate=0.5, momentum=0.0, weight_decay=0.1)
    optimizer.apply([keras.ops.zeros((2, 2))], [variable])
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(variable), np.full((2, 2), 1.9), rtol=1e-6
    )


def test_rank_one_variables_take_plain_momentum_without_decay():
    options = dict(
        momentum=0.9,
        nesterov=False,
        classic_momentum=True,
        trust_denominator="sum_of_norms",
        clip_trust_ratio=False,
        weight_decay=0.01,
    )
    final = cases.run(keras_lars.LARS(learning_rate=LR, trust_coefficient=ETA, **options))
    # The bias's trajectory is plain heavy-ball momentum on its gradients.
    bias = cases.initial_weights()[1].astype(np.float64)
    velocity = np.zeros_like(bias)
    for grads in cases.gradient_steps():
        velocity = 0.9 * velocity + LR * grads[1]
        bias = bias - velocity
    np.testing.assert_allclose(final[1], bias, rtol=2e-5, atol=2e-6)


def test_rank_default_can_be_turned_off():
    options = dict(
        momentum=0.9,
        nesterov=False,
        classic_momentum=True,
        trust_denominator="sum_of_norms",
        clip_trust_ratio=False,
        weight_decay=0.01,
    )
    optimizer = keras_lars.LARS(
        learning_rate=LR, trust_coefficient=ETA, exclude_rank_one=False, **options
    )
    everything = [True] * len(cases.SHAPES)
    cases.assert_weights_close(
        cases.run(optimizer), _reference(options, decay=everything, adapt=everything)
    )


def test_regex_exclusions_are_independent():
    options = dict(
        momentum=0.9,
        nesterov=True,
        classic_momentum=False,
        trust_denominator="norm_of_sum",
        clip_trust_ratio=False,
        weight_decay=0.01,
    )
    optimizer = keras_lars.LARS(
        learning_rate=LR,
        trust_coefficient=ETA,
        exclude_rank_one=False,
        exclude_from_weight_decay=["^conv", "scale"],
        exclude_from_layer_adaptation=["bias$"],
        **options,
    )
    names = list(cases.SHAPES)
    decay = [n not in ("conv_kernel", "scale") for n in names]
    adapt = [n != "bias" for n in names]
    cases.assert_weights_close(cases.run(optimizer), _reference(options, decay=decay, adapt=adapt))


def _model():
    inputs = keras.Input((8, 8, 3))
    x = keras.layers.Conv2D(4, 3, use_bias=False, name="conv")(inputs)
    x = keras.layers.BatchNormalization(name="bn")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    outputs = keras.layers.Dense(2, name="head")(x)
    return keras.Model(inputs, outputs)


def _flags(optimizer, model):
    optimizer.build(model.trainable_variables)
    return {
        v.path: (optimizer.uses_weight_decay(v), optimizer.uses_layer_adaptation(v))
        for v in model.trainable_variables
    }


def test_exclusions_by_variable_path():
    model = _model()
    default = _flags(keras_lars.LARS(weight_decay=1e-4), model)
    assert default == {
        "conv/kernel": (True, True),
        "bn/gamma": (False, False),
        "bn/beta": (False, False),
        "head/kernel": (True, True),
        "head/bias": (False, False),
    }
    custom = _flags(
        keras_lars.LARS(
            weight_decay=1e-4,
            exclude_rank_one=False,
            exclude_from_weight_decay=["bn/", "bias"],
            exclude_from_layer_adaptation=["^head/"],
        ),
        model,
    )
    assert custom == {
        "conv/kernel": (True, True),
        "bn/gamma": (False, True),
        "bn/beta": (False, True),
        "head/kernel": (True, False),
        "head/bias": (False, False),
    }
    # The adaptation list falls back to the weight-decay list when not given.
    fallback = _flags(
        keras_lars.LARS(
            weight_decay=1e-4, exclude_rank_one=False, exclude_from_weight_decay="head"
        ),
        model,
    )
    assert fallback["head/kernel"] == (False, False) and fallback["conv/kernel"] == (True, True)
    # No decay anywhere when weight_decay is 0.
    assert not any(d for d, _ in _flags(keras_lars.LARS(), model).values())


def test_keras_exclude_from_weight_decay_method_is_honoured():
    model = _model()
    optimizer = keras_lars.LARS(weight_decay=1e-4)
    optimizer.exclude_from_weight_decay(var_names=["kernel"])
    assert _flags(optimizer, model)["conv/kernel"] == (False, True)


def test_weight_decay_is_not_applied_twice_by_the_keras_base_class():
    variable = keras.Variable(np.full((2, 2), 2.0, "float32"), name="w")
    optimizer = keras_lars.LARS(learning_rate=0.5, momentum=0.0, weight_decay=0.1)
    optimizer.apply([keras.ops.zeros((2, 2))], [variable])
    optimizer.apply([keras.ops.zeros((2, 2))], [variable])
    np.testing.assert_allclose(keras.ops.convert_to_numpy(variable), 2.0 * 0.95**2, rtol=1e-6)


def test_trust_ratio_statistics_are_recorded():
    w = np.array([[3.0, 4.0]], "float32")
    g = np.array([[0.6, 0.8]], "float32")
    variable = keras.Variable(w, name="w")
    optimizer = keras_lars.LARS(
        learning_rate=3.0, weight_decay=0.1, trust_coefficient=0.01, record_trust_ratios=True
    )
    optimizer.apply([keras.ops.convert_to_tensor(g)], [variable])
    ((path, stats),) = optimizer.trust_ratio_stats().items()
    assert path == "w"
    np.testing.assert_allclose(stats, (1 / 30, 5.0, 1.0), rtol=1e-6)
    with pytest.raises(ValueError, match="record_trust_ratios"):
        keras_lars.LARS().trust_ratio_stats()


@pytest.mark.parametrize(
    "argument, value",
    [
        ("learning_rate", -1.0),
        ("momentum", 1.0),
        ("momentum", -0.1),
        ("weight_decay", -1e-4),
        ("trust_coefficient", 0.0),
        ("trust_coefficient", -0.001),
        ("epsilon", -1.0),
        ("trust_denominator", "l2"),
        ("nesterov", "yes"),
        ("exclude_rank_one", 1),
        ("exclude_from_weight_decay", ["("]),
        ("exclude_from_layer_adaptation", [3]),
        ("exclude_from_weight_decay", [""]),
        ("momentum", float("nan")),
        ("weight_decay", "0.1"),
    ],
)
def test_invalid_hyperparameters_name_the_argument(argument, value):
    with pytest.raises(ValueError, match=argument):
        keras_lars.LARS(**{argument: value})


def test_update_norm_needs_the_rate_outside_the_buffer():
    with pytest.raises(ValueError, match="update_norm.*classic_momentum=False"):
        keras_lars.LARS(trust_denominator="update_norm", classic_momentum=True)


def test_nesterov_needs_momentum():
    with pytest.raises(ValueError, match="nesterov"):
        keras_lars.LARS(momentum=0.0, nesterov=True)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_non_finite_gradient_entry_makes_its_layer_nan_never_a_ratio_of_one(bad):
    # Before: ||g|| = nan failed `> 0`, the ratio became 1 and the finite
    # entries stepped lr * g instead of lr * eta * ||w|| / ||g|| (~1/eta too far).
    layer = keras.Variable(np.full((2, 2), 3.0, "float32"), name="w")
    other = keras.Variable(np.full((2, 2), 3.0, "float32"), name="v")
    gradient = np.full((2, 2), 0.5, "float32")
    gradient[0, 0] = bad
    optimizer = keras_lars.LARS(learning_rate=0.1, momentum=0.0, weight_decay=0.0)
    optimizer.apply([gradient, np.full((2, 2), 0.5, "float32")], [layer, other])
    assert np.isnan(keras.ops.convert_to_numpy(layer)).all()
    # The other layer: w - lr * eta * ||w|| / ||g|| * g, with ||w|| = 6, ||g|| = 1.
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(other), 3.0 - 0.1 * 0.001 * 6.0 * 0.5, rtol=1e-6
    )


def test_trust_ratio_of_non_finite_norms_is_nan():
    for weight_norm, update_norm in ((np.nan, 1.0), (1.0, np.nan), (np.inf, 1.0), (1.0, np.inf)):
        ratio = keras_lars.trust_ratio(np.float32(weight_norm), np.float32(update_norm))
        assert np.isnan(keras.ops.convert_to_numpy(ratio))
    assert float(keras_lars.trust_ratio(np.float32(0.0), np.float32(2.0))) == 1.0
    assert float(keras_lars.trust_ratio(np.float32(3.0), np.float32(2.0), coefficient=0.5)) == 0.75


@pytest.mark.parametrize(
    "build",
    [
        lambda: keras_lars.LARS(learning_rate=float("inf")),
        lambda: keras_lars.LARS(weight_decay=float("inf")),
        lambda: keras_lars.LAMB(weight_decay=float("inf")),
        lambda: keras_lars.LAMB(learning_rate=float("-inf")),
        lambda: keras_lars.WarmupPolyDecay(float("inf"), 10, 100),
        lambda: keras_lars.linear_scaling(float("inf"), 256),
    ],
)
def test_infinite_hyperparameters_are_refused(build):
    with pytest.raises(ValueError, match="must be a finite number"):
        build()


@pytest.mark.parametrize("optimizer", [keras_lars.LARS, keras_lars.LAMB])
def test_the_optimizers_step_where_jax_is_not_installed(optimizer, monkeypatch):
    """README's quick start installs no jax: building must not ask for its version
    (only variables sharded over a JAX mesh need the JAX road's version check)."""
    import importlib.metadata

    installed = importlib.metadata.version

    def version(name):
        if name == "jax":
            raise importlib.metadata.PackageNotFoundError(name)
        return installed(name)

    monkeypatch.setattr(importlib.metadata, "version", version)
    variable = keras.Variable(np.ones((2, 3), "float32"))
    optimizer(learning_rate=0.1).apply([keras.ops.ones((2, 3))], [variable])
    assert np.all(np.asarray(variable) < 1)
