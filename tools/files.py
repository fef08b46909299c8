"""The file system the tools read and write through: TensorFlow's
`tf.io.gfile` where TensorFlow is installed (local paths and buckets: gs://,
s3://, ...), else the local one behind the same calls, so that a JAX-only
install trains (a bucket's path is then an OSError naming what reads it).

    from keras_lars.tools.files import gfile
    gfile.exists(path) ... gfile.GFile(path, "rb")
    except files.ERRORS:   # what a failed read or write raises
"""

import glob
import os
import shutil

from keras_lars.tools.tensorflow_or_none import INSTALL
from keras_lars.tools.tensorflow_or_none import tf


def _local(path):
    """`path`, refused (OSError) where it names a bucket or another file system."""
    if "://" in str(path):
        raise OSError(
            f"{path}: a path with a scheme is read through TensorFlow's file systems, and "
            f"TensorFlow is not installed: {INSTALL}"
        )
    return path


class LocalFiles:
    """The calls of tf.io.gfile the tools use, on the local file system."""

    @staticmethod
    def exists(path):
        return os.path.exists(_local(path))

    @staticmethod
    def isdir(path):
        return os.path.isdir(_local(path))

    @staticmethod
    def listdir(path):
        return os.listdir(_local(path))

    @staticmethod
    def glob(pattern):
        return glob.glob(_local(pattern))

    @staticmethod
    def makedirs(path):
        os.makedirs(_local(path), exist_ok=True)

    @staticmethod
    def remove(path):
        os.remove(_local(path))

    @staticmethod
    def rename(source, destination, overwrite=False):
        if not overwrite and os.path.exists(_local(destination)):
            raise FileExistsError(f"{destination} exists")
        os.replace(_local(source), destination)

    @staticmethod
    def copy(source, destination, overwrite=False):
        if not overwrite and os.path.exists(_local(destination)):
            raise FileExistsError(f"{destination} exists")
        shutil.copyfile(_local(source), destination)

    @staticmethod
    def GFile(path, mode="r"):
        return open(_local(path), mode)


gfile = tf.io.gfile if tf is not None else LocalFiles
ERRORS = (OSError, tf.errors.OpError) if tf is not None else (OSError,)
