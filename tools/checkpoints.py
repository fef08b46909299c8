"""Epoch checkpoints of the training tool: atomic, the last two kept.

A checkpoint after epoch e is two files in the checkpoint directory:

    ckpt-000e.json          the run's state (epochs done, history so far)
    ckpt-000e.weights.h5    model and optimizer variables (`save_weights`)

The JSON file is written first and each file appears under its final name
only once complete (written aside, then renamed), so a weights file always
has its state next to it and a kill at any moment leaves the previous
checkpoint intact. After a save, checkpoints older than the previous one are
removed. Paths go through `tf.io.gfile`, so the directory may be a bucket.
"""

import json
import os
import re
import shutil
import tempfile

import tensorflow as tf

from keras_lars.distribute import is_chief

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
    one. Only the chief writes; other workers save into a scratch directory
    (in case saving involves them) that is removed at once."""
    if not is_chief(strategy):
        scratch = tempfile.mkdtemp(prefix="keras_lars_ckpt_")
        try:
            model.save_weights(os.path.join(scratch, "model.weights.h5"))
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return
    tf.io.gfile.makedirs(directory)
    state_path, weights_path = _paths(directory, epoch)
    with tf.io.gfile.GFile(state_path + ".partial", "w") as f:
        json.dump(state, f)
    tf.io.gfile.rename(state_path + ".partial", state_path, overwrite=True)
    partial = weights_path[: -len(".weights.h5")] + ".partial.weights.h5"
    model.save_weights(partial)
    tf.io.gfile.rename(partial, weights_path, overwrite=True)
    for old in epochs_saved(directory)[:-KEEP]:
        for path in _paths(directory, old):
            if tf.io.gfile.exists(path):
                tf.io.gfile.remove(path)


def restore(model, directory):
    """Loads the latest checkpoint into `model` (whose optimizer is built
    here); returns its state dict, or None if there is none."""
    saved = epochs_saved(directory)
    if not saved:
        return None
    state_path, weights_path = _paths(directory, saved[-1])
    with tf.io.gfile.GFile(state_path) as f:
        state = json.load(f)
    model.optimizer.build(model.trainable_variables)
    model.load_weights(weights_path)
    return state
