"""The simple CNN of Shallue et al.'s MNIST and Fashion MNIST workloads.

Shallue, Lee, Antognini, Sohl-Dickstein, Frostig, Dahl, "Measuring the
Effects of Data Parallelism on Neural Network Training", JMLR 20(112), 2019:
two convolutional layers with max pooling, then one fully connected hidden
layer; the base sizes (their Simple CNN) are

    conv 32 5x5 same - ReLU - max pool 2x2/2
    conv 64 5x5 same - ReLU - max pool 2x2/2
    flatten (7x7x64 at 28x28) - fc 1024 - ReLU - fc num_classes

With 28x28x3 inputs (the training tool repeats Fashion-MNIST's grey channel)
and 10 classes it has

    conv: (5*5*3*32 + 32) + (5*5*32*64 + 64) = 2,432 + 51,264 = 53,696
    fc:   (3136*1024 + 1024) + (1024*10 + 10) = 3,212,288 + 10,250 = 3,222,538
    total 3,276,234 parameters (3,274,634 with one input channel).

No batch norm and no dropout, so a step's gradient is the mean of its
examples' gradients: an accumulated batch equals the true batch exactly in
exact arithmetic. Kernels He-normal (fan_in), the last layer N(0, 0.01^2),
biases 0; the output is logits.
"""

import keras

from keras_lars.models._common import check_common
from keras_lars.models._common import check_positive_int
from keras_lars.models._common import classifier

KERNEL_SIZE = 5
POOLS = 2  # each conv is followed by a 2x2/2 max pool


def simple_cnn(
    num_classes=10,
    input_shape=(28, 28, 1),
    filters=(32, 64),
    hidden_units=1024,
    float32_logits=True,
    name="simple_cnn",
):
    """Shallue et al.'s (2019) simple CNN for MNIST and Fashion-MNIST.

    Two 5x5 convolutions (`filters`), each followed by ReLU and a 2x2 max
    pool, then a dense hidden layer of `hidden_units` with ReLU and the
    logits; no batch norm, no dropout. 3,274,634 parameters at 28x28x1 with
    10 classes.

    Args:
        num_classes: integer >= 1, size of the logits.
        input_shape: (height, width, channels), each side at least 4 (two
            2x2 pools leave one pixel).
        filters: the two convolutions' filter counts, integers >= 1.
        hidden_units: integer >= 1, width of the hidden dense layer.
        float32_logits: bool, the last dense layer computes in float32 under a
            mixed-precision policy.
        name: model name.

    Returns:
        keras.Model: images to logits (no softmax; use a loss with
        `from_logits=True`).

    Raises:
        ValueError: an argument out of range, named in the message.
    """
    shape = check_common(num_classes, input_shape, float32_logits, name)
    if min(shape[:2]) < 2**POOLS:
        raise ValueError(
            f"`input_shape` must be at least {2**POOLS}x{2**POOLS} for the simple CNN, "
            f"received {input_shape!r}."
        )
    if not isinstance(filters, (tuple, list)) or len(filters) != POOLS:
        raise ValueError(f"`filters` must be two integers >= 1, received {filters!r}.")
    widths = [check_positive_int("filters", f) for f in filters]
    hidden_units = check_positive_int("hidden_units", hidden_units)
    inputs = keras.Input(shape=shape, name="images")
    x = inputs
    for i, width in enumerate(widths, start=1):
        x = keras.layers.Conv2D(
            width,
            KERNEL_SIZE,
            padding="same",
            activation="relu",
            kernel_initializer="he_normal",
            name=f"conv{i}",
        )(x)
        x = keras.layers.MaxPooling2D(2, strides=2, name=f"pool{i}")(x)
    x = keras.layers.Flatten(name="flatten")(x)
    x = keras.layers.Dense(
        hidden_units, activation="relu", kernel_initializer="he_normal", name="fc1"
    )(x)
    outputs = classifier(x, num_classes, float32_logits, name="fc2")
    return keras.Model(inputs, outputs, name=name)
