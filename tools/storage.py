"""Atomic writes through `tf.io.gfile` (local paths and buckets alike).

A file is written under a temporary name in its own folder, then renamed
over its final name: a reader, or a run resumed after a kill, sees the old
file or the new one, never half of one. The temporary name puts "partial-"
in front of the file name, so it keeps the file's extension (Keras insists
on ".weights.h5") and no pattern of the final names (ckpt-*, train-*)
matches it.
"""

import contextlib
import json
import os

import tensorflow as tf

PARTIAL_PREFIX = "partial-"


def partial_path(path):
    """Where `path` is written before it is renamed into place."""
    folder, name = os.path.split(path)
    return os.path.join(folder, PARTIAL_PREFIX + name)


def publish(path):
    """Renames the finished `partial_path(path)` to `path` (replacing it)."""
    tf.io.gfile.rename(partial_path(path), path, overwrite=True)


def discard(path):
    """Removes `partial_path(path)` if it exists."""
    if tf.io.gfile.exists(partial_path(path)):
        tf.io.gfile.remove(partial_path(path))


@contextlib.contextmanager
def staged(path):
    """`with staged(path) as temporary:` write the file `temporary`; it is
    renamed to `path` when the block succeeds and removed when it fails
    (`path` is then left as it was)."""
    folder = os.path.dirname(path)
    if folder:
        tf.io.gfile.makedirs(folder)
    try:
        yield partial_path(path)
    except BaseException:
        discard(path)
        raise
    publish(path)


def write_atomically(path, write):
    """Calls write(temporary path) inside `staged(path)`."""
    with staged(path) as temporary:
        write(temporary)


@contextlib.contextmanager
def atomic_file(path, mode="w"):
    """`with atomic_file(path) as f:` f is a tf.io.gfile.GFile on the
    temporary name, renamed to `path` when the block succeeds."""
    with staged(path) as temporary, tf.io.gfile.GFile(temporary, mode) as f:
        yield f


def write_json(path, value, indent=1, allow_nan=True):
    """`value` as JSON at `path`, atomically."""
    with atomic_file(path) as f:
        json.dump(value, f, indent=indent, allow_nan=allow_nan)


def read_json(path):
    with tf.io.gfile.GFile(path) as f:
        return json.load(f)
