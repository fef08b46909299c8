"""AlexNet (single tower) and AlexNet-BN, the networks of the LARS papers.

`alexnet` is the single-tower variant of Krizhevsky's "One weird trick for
parallelizing convolutional neural networks" (arXiv:1404.5997), as published
in torchvision (`torchvision.models.alexnet`, 61,100,840 parameters):

    conv 64 11x11/4 pad 2 - ReLU - max pool 3x3/2
    conv 192 5x5 pad 2 - ReLU - max pool 3x3/2
    conv 384 3x3 - ReLU - conv 256 3x3 - ReLU - conv 256 3x3 - ReLU - max pool
    flatten (6x6x256 at 224x224) - dropout 0.5 - fc 4096 - ReLU
    - dropout 0.5 - fc 4096 - ReLU - fc num_classes

`alexnet_bn` is AlexNet-BN of You, Gitman, Ginsburg (arXiv:1708.03888):
AlexNet without local response normalization and with batch normalization
after every convolution, the model LARS needed to train AlexNet at batch 8K
and beyond (the ungrouped original widths 96-256-384-384-256):

    conv 96 11x11/4 pad 2 - BN - ReLU - max pool 3x3/2
    conv 256 5x5 pad 2 - BN - ReLU - max pool 3x3/2
    conv 384 3x3 - BN - ReLU - conv 384 3x3 - BN - ReLU
    conv 256 3x3 - BN - ReLU - max pool 3x3/2
    flatten (6x6x256 at 224x224) - fc 4096 - ReLU - dropout 0.5
    - fc 4096 - ReLU - dropout 0.5 - fc num_classes

Its convolutions have no bias (the batch norm's beta takes that role), so
at 224x224 with 1000 classes it has

    conv: 11*11*3*96 + 5*5*96*256 + 3*3*256*384 + 3*3*384*384 + 3*3*384*256
          = 3,745,824
    BN (gamma, beta): 2 * (96 + 256 + 384 + 384 + 256) = 2,752
    fc: (9216 + 1) * 4096 + (4096 + 1) * 4096 + (4096 + 1) * 1000 = 58,631,144
    total 62,379,720 trainable parameters (+ 2,752 moving statistics).

Choices shared by both (and stated because papers differ):
- conv1 pads 2 on each side, so that a 224x224 crop gives the 55x55 map that
  the original 227x227 crop gave; the 3x3 and 5x5 convolutions keep the size;
- the classifier reads the flattened last feature map, 6x6x256 at 224x224
  (torchvision's 6x6 adaptive average pool is the identity there). Smaller
  inputs give a smaller map and a smaller fc6 (1x1x256 at 32x32 or 64x64),
  so the published parameter counts hold at 224x224 only. A max pool whose
  input is smaller than 3x3 uses "same" padding instead of failing. (Keras
  3.15's AdaptiveAveragePooling2D is avoided: on the TensorFlow backend it
  fails in graph mode on a 1x1 input, "Negative dimension size".)
- kernels He-normal (fan_in, Keras "he_normal"), the last layer N(0, 0.01^2),
  biases 0; no regularizers (LARS applies the weight decay);
- the output is logits (no softmax).
"""

import keras

from keras_lars.models._common import batch_norm
from keras_lars.models._common import check_common
from keras_lars.models._common import classifier

# (filters, kernel size, stride, max pool after)
ALEXNET_CONVS = (
    (64, 11, 4, True),
    (192, 5, 1, True),
    (384, 3, 1, False),
    (256, 3, 1, False),
    (256, 3, 1, True),
)
ALEXNET_BN_CONVS = (
    (96, 11, 4, True),
    (256, 5, 1, True),
    (384, 3, 1, False),
    (384, 3, 1, False),
    (256, 3, 1, True),
)
FC_UNITS = 4096
DROPOUT = 0.5
MIN_INPUT = 7  # conv1 (11x11 after padding 2) needs 7 pixels


def _features(x, convs, use_batch_norm, sync_batch_norm):
    for i, (filters, kernel_size, strides, pool) in enumerate(convs, start=1):
        name = f"conv{i}"
        if strides > 1:
            x = keras.layers.ZeroPadding2D(2, name=name + "_pad")(x)
        x = keras.layers.Conv2D(
            filters,
            kernel_size,
            strides=strides,
            padding="valid" if strides > 1 else "same",
            use_bias=not use_batch_norm,
            kernel_initializer="he_normal",
            name=name,
        )(x)
        if use_batch_norm:
            x = batch_norm(f"bn{i}", sync_batch_norm)(x)
        x = keras.layers.ReLU(name=f"relu{i}")(x)
        if pool:
            small = min(x.shape[1], x.shape[2]) < 3
            x = keras.layers.MaxPooling2D(
                3, strides=2, padding="same" if small else "valid", name=f"pool{i}"
            )(x)
    return keras.layers.Flatten(name="flatten")(x)


def _fc(x, i):
    return keras.layers.Dense(
        FC_UNITS, activation="relu", kernel_initializer="he_normal", name=f"fc{i}"
    )(x)


def _check(num_classes, input_shape, float32_logits, name, **flags):
    shape = check_common(num_classes, input_shape, float32_logits, name, **flags)
    if min(shape[:2]) < MIN_INPUT:
        raise ValueError(
            f"`input_shape` must be at least {MIN_INPUT}x{MIN_INPUT} for AlexNet, "
            f"received {input_shape!r}."
        )
    return shape


def alexnet(
    num_classes=1000,
    input_shape=(224, 224, 3),
    float32_logits=True,
    name="alexnet",
):
    """Single-tower AlexNet (one-weird-trick / torchvision variant).

    61,100,840 parameters at 224x224 with 1000 classes (torchvision's
    published count).
    Dropout comes before each of the two hidden dense layers. No batch norm,
    hence no `sync_batch_norm` argument.

    Args:
        num_classes: integer >= 1, size of the logits.
        input_shape: (height, width, channels), at least 7x7.
        float32_logits: bool, the last dense layer computes in float32 under a
            mixed-precision policy.
        name: model name.

    Returns:
        keras.Model: images to logits (no softmax; use a loss with
        `from_logits=True`).

    Raises:
        ValueError: an argument out of range, named in the message.
    """
    input_shape = _check(num_classes, input_shape, float32_logits, name)
    inputs = keras.Input(shape=input_shape, name="images")
    x = _features(inputs, ALEXNET_CONVS, False, False)
    for i in (6, 7):
        x = keras.layers.Dropout(DROPOUT, name=f"drop{i}")(x)
        x = _fc(x, i)
    outputs = classifier(x, num_classes, float32_logits, name="fc8")
    return keras.Model(inputs, outputs, name=name)


def alexnet_bn(
    num_classes=1000,
    input_shape=(224, 224, 3),
    float32_logits=True,
    sync_batch_norm=False,
    name="alexnet_bn",
):
    """AlexNet-BN (You et al. 2017): batch norm after every convolution.

    The LARS paper's AlexNet-BN: widths 96-256-384-384-256, no local response
    normalization, convolutions without bias, dropout after fc6 and fc7.
    62,379,720 trainable parameters at 224x224 with 1000 classes (2,752 more
    moving statistics). Batch norm momentum 0.9, epsilon 1e-5.

    Args:
        num_classes: integer >= 1, size of the logits.
        input_shape: (height, width, channels), at least 7x7.
        float32_logits: bool, the last dense layer computes in float32 under a
            mixed-precision policy.
        sync_batch_norm: bool, batch statistics over all replicas.
        name: model name.

    Returns:
        keras.Model: images to logits (no softmax; use a loss with
        `from_logits=True`).

    Raises:
        ValueError: an argument out of range, named in the message.
    """
    input_shape = _check(
        num_classes, input_shape, float32_logits, name, sync_batch_norm=sync_batch_norm
    )
    inputs = keras.Input(shape=input_shape, name="images")
    x = _features(inputs, ALEXNET_BN_CONVS, True, sync_batch_norm)
    for i in (6, 7):
        x = _fc(x, i)
        x = keras.layers.Dropout(DROPOUT, name=f"drop{i}")(x)
    outputs = classifier(x, num_classes, float32_logits, name="fc8")
    return keras.Model(inputs, outputs, name=name)
