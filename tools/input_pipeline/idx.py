"""Fashion-MNIST's original files: the IDX format (LeCun's MNIST format), gzip.

An IDX file is a big-endian header, then the values row-major:

    bytes 0-1   0
    byte  2     the value type, 0x08 = unsigned byte
    byte  3     the number of dimensions d
    then d      uint32 sizes
    then        prod(sizes) values

Images are 0x00000803 (n, rows, cols) and labels 0x00000801 (n). Debian's
dataset-fashion-mnist installs the four files in FASHION_MNIST_DIR. The
header is read and checked (images of 28x28 pixels) before the body is
decompressed, and no more than the header announces is decompressed.
"""

import gzip
import io
import os
import struct
import zlib

import numpy as np

from keras_lars.tools import files
from keras_lars.tools import storage
from keras_lars.tools.files import gfile
from keras_lars.tools.input_pipeline.errors import DataError

IMAGES_MAGIC = 0x00000803
LABELS_MAGIC = 0x00000801
FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
FASHION_MNIST_CLASSES = 10
IMAGE_SHAPE = (28, 28)  # Fashion-MNIST's images; a file of other sizes is refused
_CHUNK = 2**20  # bytes decompressed at a time
FASHION_MNIST_FILES = {  # split: (images, labels)
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
_HOW_TO_GET = (
    "apt-get install dataset-fashion-mnist, or give --data_dir with the four files "
    + ", ".join(name for pair in FASHION_MNIST_FILES.values() for name in pair)
)


def _read(stream, size):
    """Up to `size` bytes of `stream`, fewer only at its end."""
    chunks, left = [], size
    while left:
        chunk = stream.read(min(left, _CHUNK))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _parse(stream, magic, path, shape_problem=None):
    """The array of the IDX bytes read from `stream`: the header first,
    checked (the magic, then `shape_problem(shape)`: a requirement or
    None) before the body is read, then exactly the values it announces and
    nothing after them; a DataError names `path`."""
    head = _read(stream, 4)
    if len(head) < 4:
        raise DataError(f"{path}: {len(head)} bytes, too short for an IDX header.")
    (found,) = struct.unpack(">I", head)
    if found != magic:
        raise DataError(f"{path}: magic number {found:#010x}, expected {magic:#010x}.")
    header = 4 + 4 * (magic & 0xFF)
    sizes = _read(stream, header - 4)
    if len(sizes) < header - 4:
        raise DataError(f"{path}: truncated in its header ({4 + len(sizes)} of {header} bytes).")
    shape = struct.unpack(f">{magic & 0xFF}I", sizes)
    shown = "x".join(map(str, shape))
    problem = shape_problem and shape_problem(shape)
    if problem:
        raise DataError(f"{path}: its header announces {shown}: {problem}.")
    expected = header + int(np.prod(shape, dtype=np.int64))
    body = _read(stream, expected - header)
    if header + len(body) < expected:
        raise DataError(
            f"{path}: truncated ({header + len(body)} bytes; a {shown} header needs {expected})."
        )
    if stream.read(1):
        raise DataError(
            f"{path}: longer than its header says (a {shown} header needs {expected} bytes)."
        )
    return np.frombuffer(body, dtype=np.uint8).reshape(shape)


def parse_idx(data, magic, path, shape_problem=None):
    """The array of IDX bytes `data` (uint8, shape from the header); a
    DataError names `path` if the magic is not `magic`, the shape fails
    `shape_problem` or the size is not the header's."""
    return _parse(io.BytesIO(data), magic, path, shape_problem)


def fashion_mnist_images(shape):
    """Why an images file of `shape` (from its header) is not Fashion-MNIST's
    (n images of 28x28 pixels), or None."""
    if tuple(shape[1:]) != IMAGE_SHAPE:
        return f"images of {shape[1]}x{shape[2]} pixels, Fashion-MNIST's are 28x28"
    return None


def read_idx(path, magic, shape_problem=None):
    """The array of the gzip-compressed IDX file `path` (local or
    tf.io.gfile), its header read and checked before its body is
    decompressed (a file that decompresses to far more than its header
    announces is refused after that much)."""
    special = storage.special_file(path)
    if special:
        raise DataError(f"{path} is {special}, not a gzip file.")
    if not gfile.exists(path):
        raise DataError(f"--dataset=fashion_mnist: {path} is missing: {_HOW_TO_GET}.")
    try:
        with gfile.GFile(path, "rb") as file, gzip.GzipFile(fileobj=file) as stream:
            return _parse(stream, magic, path, shape_problem)
    except (OSError, EOFError, zlib.error) as error:
        raise DataError(f"{path}: not a readable gzip file ({error}).") from None
    except files.ERRORS as error:
        raise DataError(f"{path}: cannot be read ({storage.first_line(error)}).") from None


def read_split(data_dir, split):
    """(images uint8 (n, rows, cols), labels int32 (n,)) of `split`; a
    DataError names the file whose counts or labels are wrong."""
    images_name, labels_name = FASHION_MNIST_FILES[split]
    images_path, labels_path = (os.path.join(data_dir, n) for n in (images_name, labels_name))
    images = read_idx(images_path, IMAGES_MAGIC, fashion_mnist_images)
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
    if not gfile.isdir(data_dir):
        raise DataError(f"--dataset=fashion_mnist: no folder {data_dir}: {_HOW_TO_GET}.")
    return read_split(data_dir, "train"), read_split(data_dir, "test")
