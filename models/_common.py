"""Pieces the reference models share: argument checks, convolution, batch norm, classifier."""

import numbers

import keras

# MLPerf ResNet reference (mlcommons/training image_classification/tensorflow/
# official/resnet/resnet_model.py: _BATCH_NORM_DECAY, _BATCH_NORM_EPSILON).
# Keras's momentum is the same decay:
#     moving = momentum * moving + (1 - momentum) * batch.
BN_MOMENTUM = 0.9
BN_EPSILON = 1e-5


def check_positive_int(name, value):
    """Returns `value` if it is an integer >= 1; raises ValueError naming `name`."""
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 1:
        raise ValueError(f"`{name}` must be an integer >= 1, received {value!r}.")
    return int(value)


def check_bool(name, value):
    if not isinstance(value, bool):
        raise ValueError(f"`{name}` must be True or False, received {value!r}.")
    return value


def check_common(num_classes, input_shape, float32_logits, name, **flags):
    """Validates the arguments every builder takes; returns the input shape tuple."""
    check_positive_int("num_classes", num_classes)
    try:
        shape = tuple(input_shape)
    except TypeError:
        shape = ()
    if len(shape) != 3 or not all(
        isinstance(d, numbers.Integral) and not isinstance(d, bool) and d >= 1 for d in shape
    ):
        raise ValueError(
            "`input_shape` must be (height, width, channels) of integers >= 1, "
            f"received {input_shape!r}."
        )
    check_bool("float32_logits", float32_logits)
    for flag, value in flags.items():
        check_bool(flag, value)
    if not isinstance(name, str) or not name:
        raise ValueError(f"`name` must be a non-empty string, received {name!r}.")
    return tuple(int(d) for d in shape)


def conv(x, filters, kernel_size, strides, name):
    """Convolution without bias; strided ones use symmetric fixed padding."""
    if strides > 1 and kernel_size > 1:
        x = keras.layers.ZeroPadding2D((kernel_size - 1) // 2, name=name + "_pad")(x)
        padding = "valid"
    else:
        padding = "same"
    return keras.layers.Conv2D(
        filters,
        kernel_size,
        strides=strides,
        padding=padding,
        use_bias=False,
        kernel_initializer="he_normal",
        name=name,
    )(x)


def batch_norm(name, sync_batch_norm=False, zero_gamma=False):
    """BatchNormalization with the MLPerf constants; gamma starts at 0 if asked.

    `sync_batch_norm=True` computes the batch statistics over all replicas
    (`synchronized=True`, TensorFlow backend), which large batches split
    into small per-core batches on TPU pods need.
    """
    return keras.layers.BatchNormalization(
        momentum=BN_MOMENTUM,
        epsilon=BN_EPSILON,
        gamma_initializer="zeros" if zero_gamma else "ones",
        synchronized=sync_batch_norm,
        name=name,
    )


def classifier(x, num_classes, float32_logits, name="fc"):
    """The final Dense layer, w ~ N(0, 0.01^2), b = 0; returns logits.

    With `float32_logits` the layer computes in float32 or wider whatever
    the global mixed-precision policy, so that softmax and loss stay in
    float32 (float64 under a float64 policy).
    """
    wide = keras.config.dtype_policy().compute_dtype == "float64"
    return keras.layers.Dense(
        num_classes,
        kernel_initializer=keras.initializers.RandomNormal(stddev=0.01),
        dtype="float32" if float32_logits and not wide else None,
        name=name,
    )(x)
