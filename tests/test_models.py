"""Tests of the reference models (models/): sizes, shapes, options, training."""

import functools
import subprocess
import sys

import keras
import numpy as np
import pytest
from sklearn.datasets import load_digits

import keras_lars
from keras_lars import models
from keras_lars.tools.shapes_only import built_shapes_only

# Published parameter counts (torchvision's model documentation).
PUBLISHED = {
    "resnet18": 11_689_512,
    "resnet34": 21_797_672,
    "resnet50": 25_557_032,
    "resnet101": 44_549_160,
    "resnet152": 60_192_808,
    "alexnet": 61_100_840,
}
BLOCKS = {18: (2, 2, 2, 2), 50: (3, 4, 6, 3)}
SMALL = (32, 32, 3)


def trainable_count(model):
    return sum(int(np.prod(v.shape)) for v in model.trainable_weights)


def digits_batch(n=64):
    """n scikit-learn digits, 8x8 upsampled to 32x32, grey copied to 3 channels."""
    digits = load_digits()
    x = digits.images[:n].astype("float32") / 16.0
    x = np.repeat(np.repeat(x, 4, axis=1), 4, axis=2)
    return np.repeat(x[..., None], 3, axis=-1), digits.target[:n]


def _built_once(stateless=False, **kwargs):
    """A module-scoped cache of models that tests only read (no training).
    `stateless`: built for their shapes alone, their variables uninitialised
    (tools/shapes_only.py: ResNet-152 in 0.75 s instead of 4.8)."""
    cache = {}

    def get(builder):
        if builder not in cache:
            build = functools.partial(getattr(models, builder), **kwargs)
            cache[builder] = built_shapes_only(build) if stateless else build()
        return cache[builder]

    yield get
    cache.clear()


@pytest.fixture(scope="module")
def full_size():
    """224x224, 1000-class models, their variables uninitialised."""
    yield from _built_once(stateless=True)


@pytest.fixture(scope="module")
def small():
    """32x32, 10-class models."""
    yield from _built_once(num_classes=10, input_shape=SMALL)


@pytest.fixture
def bfloat16_policy():
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy(previous)


@pytest.mark.parametrize("builder", sorted(PUBLISHED))
def test_parameter_count_matches_published(builder, full_size):
    model = full_size(builder)
    assert trainable_count(model) == PUBLISHED[builder]
    assert model.output_shape == (None, 1000)
    assert model.name == builder


def test_alexnet_bn_parameter_count_by_hand(full_size):
    # conv96/11/4, conv256/5, conv384/3, conv384/3, conv256/3 on 3 channels,
    # no conv bias, BN gamma+beta; fc 6*6*256 -> 4096 -> 4096 -> 1000 with bias.
    convs = [(11, 3, 96), (5, 96, 256), (3, 256, 384), (3, 384, 384), (3, 384, 256)]
    fcs = [(6 * 6 * 256, 4096), (4096, 4096), (4096, 1000)]
    expected = sum(k * k * cin * cout + 2 * cout for k, cin, cout in convs)
    expected += sum((fan_in + 1) * units for fan_in, units in fcs)
    model = full_size("alexnet_bn")
    assert trainable_count(model) == expected == 62_379_720
    for i, (k, cin, cout) in enumerate(convs, start=1):
        assert [tuple(w.shape) for w in model.get_layer(f"conv{i}").weights] == [(k, k, cin, cout)]
        assert tuple(model.get_layer(f"bn{i}").gamma.shape) == (cout,)
    for i, (fan_in, units) in enumerate(fcs, start=6):
        assert tuple(model.get_layer(f"fc{i}").kernel.shape) == (fan_in, units)
    # Moving statistics: non-trainable, one mean and one variance per channel.
    assert model.count_params() - expected == 2 * sum(c[2] for c in convs)


def test_resnet50_forward_at_224():
    model = models.resnet50()
    sizes = {
        "conv1": 112,
        "pool1": 56,
        "stage1_block3_out": 56,
        "stage2_block4_out": 28,
        "stage3_block6_out": 14,
        "stage4_block3_out": 7,
    }
    for layer, size in sizes.items():
        assert model.get_layer(layer).output.shape[1:3] == (size, size)
    assert model.get_layer("stage4_block3_out").output.shape[-1] == 2048
    x = np.random.default_rng(0).normal(size=(1, 224, 224, 3)).astype("float32")
    logits = np.asarray(model(x, training=False))
    assert logits.shape == (1, 1000) and np.all(np.isfinite(logits))


@pytest.mark.parametrize("builder", ["alexnet", "alexnet_bn"])
def test_alexnet_feature_maps_at_224(builder, full_size):
    model = full_size(builder)
    for layer, size in {"conv1": 55, "pool1": 27, "pool2": 13, "pool5": 6}.items():
        assert model.get_layer(layer).output.shape[1:3] == (size, size)
    assert model.get_layer("flatten").output.shape[-1] == 6 * 6 * 256


@pytest.mark.parametrize(
    "builder, size",
    [
        ("resnet18", 32),
        ("resnet50", 32),
        ("resnet18", 8),
        ("resnet20", 8),
        ("resnet20", 7),
        ("alexnet", 32),
        ("alexnet_bn", 32),
        ("alexnet_bn", 64),
    ],
)
def test_small_inputs(builder, size):
    model = getattr(models, builder)(num_classes=10, input_shape=(size, size, 3))
    x = np.random.default_rng(1).normal(size=(2, size, size, 3)).astype("float32")
    for training in (False, True):
        logits = np.asarray(model(x, training=training))
        assert logits.shape == (2, 10) and np.all(np.isfinite(logits))


@pytest.mark.parametrize("builder", ["resnet18", "resnet20", "alexnet", "alexnet_bn"])
def test_lars_default_exclusions_follow_variable_rank(builder, small):
    model = small(builder)
    optimizer = keras_lars.LARS(learning_rate=1.0, weight_decay=1e-4)
    optimizer.build(model.trainable_variables)
    kinds = set()
    for variable in model.trainable_variables:
        kind = variable.path.split("/")[-1]
        kinds.add(kind)
        expected = len(variable.shape) > 1
        assert kind in (("kernel",) if expected else ("bias", "gamma", "beta"))
        assert optimizer.uses_weight_decay(variable) is expected, variable.path
        assert optimizer.uses_layer_adaptation(variable) is expected, variable.path
    assert {"kernel", "bias"} <= kinds


def test_no_layer_regularizers(small):
    for model in map(small, ("resnet18", "resnet50", "alexnet", "alexnet_bn")):
        for layer in model.layers:
            for attribute in (
                "kernel_regularizer",
                "bias_regularizer",
                "gamma_regularizer",
                "beta_regularizer",
                "activity_regularizer",
            ):
                assert getattr(layer, attribute, None) is None, (layer.name, attribute)
        assert model.losses == []


def test_resnet_layers_follow_the_reference():
    model = models.resnet50(input_shape=SMALL)
    convs = [layer for layer in model.layers if isinstance(layer, keras.layers.Conv2D)]
    norms = [layer for layer in model.layers if isinstance(layer, keras.layers.BatchNormalization)]
    assert len(convs) == len(norms) == 1 + 3 * 16 + 4  # stem, blocks, shortcuts
    assert not any(conv.use_bias for conv in convs)
    for norm in norms:
        assert (norm.momentum, norm.epsilon, norm.synchronized) == (0.9, 1e-5, False)
    # He-normal, fan_in: std sqrt(2 / (3 * 3 * 512)) over 2.4M samples.
    kernel = np.asarray(model.get_layer("stage4_block2_conv2").kernel)
    assert kernel.std() == pytest.approx(np.sqrt(2.0 / (3 * 3 * 512)), rel=0.01)
    # Dense N(0, 0.01^2) over 2048 x 1000 samples, bias 0.
    fc = model.get_layer("fc")
    assert np.asarray(fc.kernel).std() == pytest.approx(0.01, rel=0.01)
    np.testing.assert_array_equal(np.asarray(fc.bias), np.zeros(1000))


def test_lars_steps_lower_the_loss():
    x, y = digits_batch()
    for builder in (models.resnet18, models.alexnet_bn):
        keras.utils.set_random_seed(0)
        model = builder(num_classes=10, input_shape=SMALL)
        model.compile(
            optimizer=keras_lars.LARS(learning_rate=2.0, momentum=0.9, weight_decay=1e-4),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        losses = model.fit(x, y, batch_size=64, epochs=5, shuffle=False, verbose=0).history["loss"]
        # The first loss is the untrained model's: about ln(10).
        assert losses[0] == pytest.approx(np.log(10.0), abs=0.6), builder.__name__
        assert losses[-1] < 0.5 * losses[0], (builder.__name__, losses)


@pytest.mark.parametrize("builder", ["resnet18", "resnet20", "alexnet_bn"])
def test_keras_file_round_trip(builder, tmp_path):
    keras.utils.set_random_seed(2)
    model = getattr(models, builder)(num_classes=10, input_shape=SMALL)
    for weight in model.non_trainable_weights:  # make BN statistics non-trivial
        weight.assign(np.random.default_rng(3).uniform(0.5, 1.5, weight.shape))
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    x = np.random.default_rng(4).normal(size=(4,) + SMALL).astype("float32")
    np.testing.assert_array_equal(
        np.asarray(loaded(x, training=False)), np.asarray(model(x, training=False))
    )
    assert [v.path for v in loaded.weights] == [v.path for v in model.weights]


def test_mixed_bfloat16_train_step(bfloat16_policy):
    x, y = digits_batch(16)
    model = models.resnet18(num_classes=10, input_shape=SMALL)
    assert model.get_layer("conv1").compute_dtype == "bfloat16"
    assert model.get_layer("fc").compute_dtype == "float32"
    model.compile(
        optimizer=keras_lars.LARS(learning_rate=1.0, weight_decay=1e-4),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    before = np.asarray(model.get_layer("conv1").kernel).copy()
    loss = model.fit(x, y, batch_size=16, epochs=1, verbose=0).history["loss"][0]
    assert np.isfinite(loss)
    kernel = model.get_layer("conv1").kernel
    assert kernel.dtype == "float32" and not np.array_equal(np.asarray(kernel), before)
    assert model.predict(x[:2], verbose=0).dtype == np.float32

    alex = models.alexnet_bn(num_classes=10, input_shape=SMALL)
    assert alex.get_layer("conv1").compute_dtype == "bfloat16"
    logits = alex(x[:2], training=True)
    assert logits.dtype == "float32" and np.all(np.isfinite(np.asarray(logits)))
    low = models.resnet18(num_classes=10, input_shape=SMALL, float32_logits=False)
    assert low.output.dtype == "bfloat16"


@pytest.mark.parametrize("depth", [18, 50])
def test_zero_init_residual_gamma(depth):
    last = "bn2" if depth == 18 else "bn3"
    expected = {
        f"stage{s}_block{b}_{last}/gamma"
        for s, count in enumerate(BLOCKS[depth], start=1)
        for b in range(1, count + 1)
    }
    for zero in (True, False) if depth == 18 else (True,):
        model = models.resnet(
            depth,
            num_classes=10,
            input_shape=SMALL,
            zero_init_residual_gamma=zero,
            name=f"net{zero}",
        )
        assert model.name == f"net{zero}"
        gammas = {v.path: np.asarray(v) for v in model.weights if v.path.endswith("/gamma")}
        zeroed = {path for path, g in gammas.items() if np.all(g == 0)}
        ones = {path for path, g in gammas.items() if np.all(g == 1)}
        assert zeroed == (expected if zero else set())
        assert ones == set(gammas) - zeroed
        # stem + one per conv in each block + the shortcuts (none in stage 1
        # of ResNet-18, whose first block keeps 64 channels).
        per_block, shortcuts = (2, 3) if depth == 18 else (3, 4)
        assert len(gammas) == 1 + per_block * sum(BLOCKS[depth]) + shortcuts


def test_v1_and_v1_5_differ_only_in_stride_position(small):
    def strides(model):
        return {
            layer.name: layer.strides
            for layer in model.layers
            if isinstance(layer, keras.layers.Conv2D)
        }

    v15 = strides(small("resnet50"))
    v1 = strides(models.resnet50(num_classes=10, input_shape=SMALL, version="v1"))
    assert v15.keys() == v1.keys()
    changed = {name for name in v15 if v15[name] != v1[name]}
    assert changed == {f"stage{s}_block1_conv{i}" for s in (2, 3, 4) for i in (1, 2)}
    for s in (2, 3, 4):
        assert v15[f"stage{s}_block1_conv1"] == v1[f"stage{s}_block1_conv2"] == (1, 1)
        assert v15[f"stage{s}_block1_conv2"] == v1[f"stage{s}_block1_conv1"] == (2, 2)
    strided = {name for name, s in v15.items() if s == (2, 2)}
    assert strided == {"conv1"} | {
        f"stage{s}_block1_{c}" for s in (2, 3, 4) for c in ("conv2", "shortcut_conv")
    }
    # Basic blocks have no 1x1 to move the stride to: identical networks.
    basic = small("resnet18")
    basic_v1 = models.resnet18(num_classes=10, input_shape=SMALL, version="v1")
    assert strides(basic) == strides(basic_v1)


@pytest.mark.parametrize("builder", ["resnet18", "resnet20", "alexnet_bn"])
def test_sync_batch_norm(builder):
    model = getattr(models, builder)(num_classes=10, input_shape=SMALL, sync_batch_norm=True)
    norms = [layer for layer in model.layers if isinstance(layer, keras.layers.BatchNormalization)]
    assert norms and all(norm.synchronized for norm in norms)
    x = np.random.default_rng(5).normal(size=(2,) + SMALL).astype("float32")
    assert np.all(np.isfinite(np.asarray(model(x, training=True))))


@pytest.mark.parametrize(
    "build, argument",
    [
        (lambda: models.resnet(42), "depth"),
        (lambda: models.resnet("50"), "depth"),
        (lambda: models.resnet(True), "depth"),
        (lambda: models.resnet50(version="v2"), "version"),
        (lambda: models.resnet50(num_classes=0), "num_classes"),
        (lambda: models.resnet18(num_classes=2.5), "num_classes"),
        (lambda: models.alexnet(num_classes=0), "num_classes"),
        (lambda: models.alexnet_bn(num_classes=-1), "num_classes"),
        (lambda: models.resnet50(input_shape=(32, 32)), "input_shape"),
        (lambda: models.resnet50(input_shape=(0, 32, 3)), "input_shape"),
        (lambda: models.alexnet(input_shape=(6, 6, 3)), "input_shape"),
        (lambda: models.resnet50(zero_init_residual_gamma=1), "zero_init_residual_gamma"),
        (lambda: models.resnet50(float32_logits="yes"), "float32_logits"),
        (lambda: models.alexnet_bn(sync_batch_norm=None), "sync_batch_norm"),
        (lambda: models.resnet50(name=""), "name"),
        (lambda: models.resnet_cifar(21), "depth"),
        (lambda: models.resnet_cifar(2), "depth"),
        (lambda: models.resnet_cifar(20.0), "depth"),
        (lambda: models.resnet20(num_classes=0), "num_classes"),
        (lambda: models.resnet20(sync_batch_norm=1), "sync_batch_norm"),
        (lambda: models.simple_cnn(num_classes=0), "num_classes"),
        (lambda: models.simple_cnn(input_shape=(3, 28, 1)), "input_shape"),
        (lambda: models.simple_cnn(filters=(32,)), "filters"),
        (lambda: models.simple_cnn(filters=(32, 0)), "filters"),
        (lambda: models.simple_cnn(filters="32,64"), "filters"),
        (lambda: models.simple_cnn(hidden_units=0), "hidden_units"),
        (lambda: models.simple_cnn(hidden_units=2.0), "hidden_units"),
    ],
)
def test_bad_arguments_raise_value_error(build, argument):
    with pytest.raises(ValueError, match=f"`{argument}`"):
        build()


# He et al. 2016, table 6: the CIFAR ResNets' parameters, in millions.
CIFAR_PUBLISHED = {20: 0.27, 32: 0.46, 44: 0.66, 56: 0.85, 110: 1.7}


@pytest.mark.parametrize("depth", sorted(CIFAR_PUBLISHED))
def test_cifar_resnet_parameter_count_by_hand(depth, small):
    """Sec. 4.2's network summed by hand: 3x3 convolutions (no bias) of 16,
    32 and 64 filters, n = (depth - 2) / 6 blocks a stage, a batch norm
    (gamma, beta) after each, parameter-free shortcuts, a 10-way dense.
    ResNet-20 is built with its defaults (32x32, 10 classes); the deeper ones
    are the module's `small` builds, the same shapes, shared with
    test_model_kinds_match_the_built_models."""
    n = (depth - 2) // 6
    convs = [(3, 16)] + [(16, 16)] * 2 * n + [(16, 32)] + [(32, 32)] * (2 * n - 1)
    convs += [(32, 64)] + [(64, 64)] * (2 * n - 1)
    expected = sum(9 * c_in * c_out + 2 * c_out for c_in, c_out in convs) + 64 * 10 + 10
    model = getattr(models, f"resnet{depth}")() if depth == 20 else small(f"resnet{depth}")
    assert trainable_count(model) == expected
    assert round(expected / 1e6, 2 if depth < 100 else 1) == CIFAR_PUBLISHED[depth]
    assert (model.name, model.input_shape, model.output_shape) == (
        f"resnet{depth}",
        (None, 32, 32, 3),
        (None, 10),
    )
    if depth == 20:
        assert expected == 269_722
        for layer, size in {"relu1": 32, "stage1_block3_out": 32, "stage2_block1_out": 16}.items():
            assert model.get_layer(layer).output.shape[1:] == (size, size, 16 * 32 // size)
        assert model.get_layer("stage3_block3_out").output.shape[1:] == (8, 8, 64)
        norms = [x for x in model.layers if isinstance(x, keras.layers.BatchNormalization)]
        assert len(norms) == 19 and all(
            (norm.momentum, norm.epsilon) == (0.9, 1e-5) for norm in norms
        )


def test_cifar_resnet_shortcut_is_option_a():
    """Option A: the identity within a stage; where a stage starts,
    x[:, ::2, ::2, :] with zero channels appended (numpy), no parameters."""
    model = models.resnet20(input_shape=(7, 7, 3))
    shortcuts = [layer for layer in model.layers if "shortcut" in layer.name]
    assert [layer.name for layer in shortcuts] == [f"stage{s}_block1_shortcut" for s in (2, 3)]
    assert not any(layer.weights for layer in shortcuts)
    x = np.random.default_rng(6).normal(size=(2, 7, 7, 16)).astype("float32")
    expected = np.concatenate([x[:, ::2, ::2, :], np.zeros((2, 4, 4, 16), "float32")], axis=-1)
    np.testing.assert_array_equal(np.asarray(shortcuts[0](x)), expected)
    # 7 -> 4 -> 2: the strided convolution's map is the shortcut's.
    assert model.get_layer("stage3_block1_add").output.shape[1:] == (2, 2, 64)


def test_simple_cnn_parameter_count_by_hand():
    """The module docstring's sums: conv 5x5 32, 64 and fc 1024 on 28x28."""
    conv = lambda c_in, c_out: 5 * 5 * c_in * c_out + c_out  # noqa: E731
    fc = lambda n_in, n_out: n_in * n_out + n_out  # noqa: E731
    for channels, expected in ((3, 3_276_234), (1, 3_274_634)):
        model = models.simple_cnn(num_classes=10, input_shape=(28, 28, channels))
        by_hand = conv(channels, 32) + conv(32, 64) + fc(7 * 7 * 64, 1024) + fc(1024, 10)
        assert trainable_count(model) == by_hand == expected


def _numpy_conv_same(x, kernel, bias):
    """'same' 2-D convolution (cross-correlation, stride 1) of NHWC `x`."""
    k = kernel.shape[0]
    pad = (k - 1) // 2
    padded = np.pad(x, ((0, 0), (pad, k - 1 - pad), (pad, k - 1 - pad), (0, 0)))
    height, width = x.shape[1:3]
    out = np.zeros(x.shape[:3] + (kernel.shape[-1],))
    for i in range(k):
        for j in range(k):
            out += padded[:, i : i + height, j : j + width, :] @ kernel[i, j]
    return out + bias


def _numpy_pool(x):
    n, h, w, c = x.shape
    return x[:, : h // 2 * 2, : w // 2 * 2].reshape(n, h // 2, 2, w // 2, 2, c).max(axis=(2, 4))


def test_simple_cnn_equals_its_layers_in_numpy():
    """The forward pass against the module docstring's layers written in numpy
    (float64) from the model's own weights: conv-ReLU-pool twice, fc-ReLU, fc."""
    model = models.simple_cnn(
        num_classes=5, input_shape=(12, 12, 2), filters=(3, 4), hidden_units=6
    )
    rng = np.random.default_rng(7)
    for variable in model.trainable_variables:  # biases too, so that they count
        variable.assign(rng.normal(size=variable.shape).astype("float32") * 0.3)
    x = rng.normal(size=(3, 12, 12, 2)).astype("float32")
    w = {v.path: np.asarray(v, dtype="float64") for v in model.trainable_variables}
    h = x.astype("float64")
    for i in (1, 2):
        h = _numpy_pool(
            np.maximum(_numpy_conv_same(h, w[f"conv{i}/kernel"], w[f"conv{i}/bias"]), 0)
        )
    assert h.shape == (3, 3, 3, 4)
    h = np.maximum(h.reshape(3, -1) @ w["fc1/kernel"] + w["fc1/bias"], 0)
    expected = h @ w["fc2/kernel"] + w["fc2/bias"]
    np.testing.assert_allclose(np.asarray(model(x)), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("builder", sorted(models.BUILDERS))
def test_model_kinds_match_the_built_models(builder, small, full_size):
    """has_batch_norm and takes_any_image_size, which the tool and the planner
    read, against the layers of the built model (the full-size one where the
    parameter counts built it already: the layers' kinds do not change)."""
    layers = (full_size if builder in PUBLISHED else small)(builder).layers
    assert models.has_batch_norm(builder) == any(
        isinstance(layer, keras.layers.BatchNormalization) for layer in layers
    )
    assert models.takes_any_image_size(builder) == any(
        isinstance(layer, keras.layers.GlobalAveragePooling2D) for layer in layers
    )


def test_the_models_are_an_attribute_of_keras_lars_after_importing_it_alone():
    """README's `import keras, keras_lars` then `keras_lars.models.resnet50(...)`, in
    a fresh interpreter (here keras_lars.models is imported already)."""
    code = (
        "import keras, keras_lars, sys\n"
        "assert 'keras_lars.models' not in sys.modules\n"
        "model = keras_lars.models.simple_cnn(num_classes=10)\n"
        "print(model.name, keras_lars.models.resnet50 is not None)\n"
        "try:\n"
        "    keras_lars.no_such_name\n"
        "except AttributeError as error:\n"
        "    print(error)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == [
        "simple_cnn True",
        "module 'keras_lars' has no attribute 'no_such_name'",
    ]
