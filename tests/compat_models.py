"""The devices and the model that tests/test_compat.py and
tests/test_version_gates.py share: conftest.py's two logical CPUs, and batch
norm on the inputs before a small convolutional classifier."""

import keras

CPUS = ["/cpu:0", "/cpu:1"]
MOMENTUM = 0.5  # the batch norm's


def bn_model(synchronized=False):
    """Batch norm on the inputs (its statistics then depend on the data
    only), then a small convolutional classifier."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((6, 6, 2)),
            keras.layers.BatchNormalization(momentum=MOMENTUM, synchronized=synchronized),
            keras.layers.Conv2D(3, 3),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(2),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.SGD(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model
