"""Trains a small classifier on scikit-learn's handwritten digits with LARS.

A first, small version of the training tool: `python -m tools.train`.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from absl import app  # noqa: E402
from absl import flags  # noqa: E402

import keras_lars  # noqa: E402

EPOCHS = flags.DEFINE_integer("epochs", 20, "Training epochs.", lower_bound=1)
BATCH = flags.DEFINE_integer("global_batch_size", 256, "Global batch size.", lower_bound=1)


def load_digits(seed=0):
    from sklearn.datasets import load_digits as sklearn_digits

    images, labels = sklearn_digits(return_X_y=True)
    images = (images / 16.0).astype("float32")
    order = np.random.default_rng(seed).permutation(len(labels))
    images, labels = images[order], labels[order]
    split = len(labels) * 4 // 5
    return (images[:split], labels[:split]), (images[split:], labels[split:])


def main(argv):
    del argv
    keras.utils.set_random_seed(0)
    (x_train, y_train), (x_test, y_test) = load_digits()
    model = keras.Sequential(
        [
            keras.Input((64,)),
            keras.layers.Dense(256, activation="relu"),
            keras.layers.Dense(10),
        ]
    )
    model.compile(
        optimizer=keras_lars.LARS(learning_rate=5.0, weight_decay=1e-4),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    model.fit(x_train, y_train, batch_size=BATCH.value, epochs=EPOCHS.value,
              validation_data=(x_test, y_test), verbose=2)
    loss, accuracy = model.evaluate(x_test, y_test, verbose=0)
    print(f"final: test loss {loss:.4f}, test accuracy {accuracy:.4f}")


if __name__ == "__main__":
    app.run(main)
