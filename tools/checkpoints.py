"""Epoch checkpoints of the training tool: atomic, the last two kept.

A checkpoint after epoch e is two files in the checkpoint directory:

    ckpt-000e.json          the run's state (epochs done, history so far)
    ckpt-000e.weights.h5    model and optimizer variables (`save_weights`)

The JSON file is written first and each file appears under its final name
only once complete (`storage.write_atomically`), so a weights file always
has its state next to it and a kill at any moment leaves the previous
checkpoint intact. After a save, checkpoints older than the previous one are
removed. Paths go through `tf.io.gfile`, so the directory may be a bucket.
"""

import os
import re

import tensorflow as tf

from keras_lars.distribute import save_on_chief
from keras_lars.tools import storage

_NAME = re.compile(r"^ckpt-(\d+)\.weights\.h5$")
KEEP = 2


def _paths(directory, epoch):
    stem = os.path.join(directory, f"ckpt-{epoch:04d}")
    return stem + ".json", stem + ".weights.h5"


def epochs_saved(directory):
    """Epoch numbers of the complete checkpoints in `directory`, ascending."""
    if not tf.io.gfile.isdir(directory):
        return []
    found = (_NAME.match(name) for name in tf.io.gfile.listdir(directory))
    return sorted(int(match.group(1)) for match in found if match)


def save(model, directory, epoch, state, strategy=None):
    """Writes the checkpoint after `epoch` epochs; keeps it and the previous
    one. Only the chief's files are kept (`keras_lars.distribute.save_on_chief`)."""

    def write(directory):
        state_path, weights_path = _paths(directory, epoch)
        storage.write_json(state_path, state, indent=None)
        storage.write_atomically(weights_path, model.save_weights)
        for old in epochs_saved(directory)[:-KEEP]:
            for path in _paths(directory, old):
                if tf.io.gfile.exists(path):
                    tf.io.gfile.remove(path)

    save_on_chief(write, directory, strategy)


def restore(model, directory):
    """Loads the latest checkpoint into `model` (whose optimizer is built
    here); returns its state dict, or None if there is none."""
    saved = epochs_saved(directory)
    if not saved:
        return None
    state_path, weights_path = _paths(directory, saved[-1])
    state = storage.read_json(state_path)
    model.optimizer.build(model.trainable_variables)
    model.load_weights(weights_path)
    return state
