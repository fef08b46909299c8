"""Fashion-MNIST's original files: the IDX format (LeCun's MNIST format), gzip.

An IDX file is a big-endian header, then the values row-major:

    bytes 0-1   0
    byte  2     the value type, 0x08 = unsigned byte
    byte  3     the number of dimensions d
    then d      uint32 sizes
    then        prod(sizes) values

Images are 0x00000803 (n, rows, cols) and labels 0x00000801 (n). Debian's
dataset-fashion-mnist installs the four files in FASHION_MNIST_DIR.
"""

import gzip
import os
import struct
import zlib

import numpy as np
import tensorflow as tf

from keras_lars.tools.input_pipeline.errors import DataError

IMAGES_MAGIC = 0x00000803
LABELS_MAGIC = 0x00000801
FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
FASHION_MNIST_CLASSES = 10
FASHION_MNIST_FILES = {  # split: (images, labels)
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
_HOW_TO_GET = (
    "apt-get install dataset-fashion-mnist, or give --data_dir with the four files "
    + ", ".join(name for pair in FASHION_MNIST_FILES.values() for name in pair)
)


def parse_idx(data, magic, path):
    """The array of IDX bytes `data` (uint8, shape from the header); a
    DataError names `path` if the magic is not `magic` or the size is not
    the header's."""
    if len(data) < 4:
        raise DataError(f"{path}: {len(data)} bytes, too short for an IDX header.")
    (found,) = struct.unpack(">I", data[:4])
    if found != magic:
        raise DataError(f"{path}: magic number {found:#010x}, expected {magic:#010x}.")
    header = 4 + 4 * (magic & 0xFF)
    if len(data) < header:
        raise DataError(f"{path}: truncated in its header ({len(data)} of {header} bytes).")
    shape = struct.unpack(f">{magic & 0xFF}I", data[4:header])
    expected = header + int(np.prod(shape, dtype=np.int64))
    if len(data) != expected:
        problem = "truncated" if len(data) < expected else "longer than its header says"
        raise DataError(
            f"{path}: {problem} ({len(data)} bytes; a {'x'.join(map(str, shape))} "
            f"header needs {expected})."
        )
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(shape)


def read_idx(path, magic):
    """The array of the gzip-compressed IDX file `path` (local or tf.io.gfile)."""
    if not tf.io.gfile.exists(path):
        raise DataError(f"--dataset=fashion_mnist: {path} is missing: {_HOW_TO_GET}.")
    try:
        with tf.io.gfile.GFile(path, "rb") as file:
            data = gzip.decompress(file.read())
    except (OSError, EOFError, zlib.error) as error:
        raise DataError(f"{path}: not a readable gzip file ({error}).") from None
    return parse_idx(data, magic, path)


def read_split(data_dir, split):
    """(images uint8 (n, rows, cols), labels int32 (n,)) of `split`; a
    DataError names the file whose counts or labels are wrong."""
    images_name, labels_name = FASHION_MNIST_FILES[split]
    images_path, labels_path = (os.path.join(data_dir, n) for n in (images_name, labels_name))
    images = read_idx(images_path, IMAGES_MAGIC)
    labels = read_idx(labels_path, LABELS_MAGIC)
    if len(images) != len(labels):
        raise DataError(
            f"{labels_path}: {len(labels)} labels for the {len(images)} images of {images_path}."
        )
    if len(labels) == 0:
        raise DataError(f"{images_path}: holds no image.")
    if labels.max() >= FASHION_MNIST_CLASSES:
        index = int(np.argmax(labels >= FASHION_MNIST_CLASSES))
        raise DataError(
            f"{labels_path}: label {labels[index]} at index {index} is not a class "
            f"0..{FASHION_MNIST_CLASSES - 1}."
        )
    return images, labels.astype(np.int32)


def load_fashion_mnist(data_dir=None):
    """((train images, labels), (test images, labels)) from the four IDX
    files in `data_dir` (default FASHION_MNIST_DIR): uint8 images of shape
    (n, 28, 28) and int32 labels, in the files' order."""
    data_dir = data_dir or FASHION_MNIST_DIR
    if not tf.io.gfile.isdir(data_dir):
        raise DataError(f"--dataset=fashion_mnist: no folder {data_dir}: {_HOW_TO_GET}.")
    return read_split(data_dir, "train"), read_split(data_dir, "test")
