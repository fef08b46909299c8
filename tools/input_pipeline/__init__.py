"""Input pipelines of the training tool: ImageNet-format TFRecords, synthetic
images, scikit-learn's handwritten digits and Fashion-MNIST's IDX files.

Every training split is built one epoch at a time, and an epoch's examples,
their order and their augmentation are a pure function of (seed, epoch): a
run resumed at epoch e in a new process sees exactly the batches that an
uninterrupted run saw. Datasets are built per input pipeline (one per
worker) from a `tf.distribute.InputContext` and batched with the per-replica
batch size, for `strategy.distribute_datasets_from_function`.

The parts, each depending only on those above it:

    errors          DataError
    transforms      per-image crops, resize, flip, normalisation
    tfrecord_files  ImageNet-format files: names, listing, sharding, parsing, counts
    tfrecord_checks each file's first record up front; the first bad record
    imagenet        tf.data of the records: a training epoch, the evaluation examples
    idx             Fashion-MNIST's IDX files (gzip): parsing, checks, the four files
    host            numpy batches, where TensorFlow is not installed
    arrays          in memory: the digits, grey images, synthetic images
    sources         DatasetInfo, the DataSource protocol, its sources, SOURCES, load

The names used outside this package are importable from here
(`input_pipeline.load`, ...); the rest from their module.
"""

from keras_lars.tools.input_pipeline.arrays import arrays_train
from keras_lars.tools.input_pipeline.arrays import epoch_permutation
from keras_lars.tools.input_pipeline.arrays import load_digits
from keras_lars.tools.input_pipeline.arrays import synthetic
from keras_lars.tools.input_pipeline.errors import DataError
from keras_lars.tools.input_pipeline.idx import FASHION_MNIST_DIR
from keras_lars.tools.input_pipeline.idx import IMAGES_MAGIC
from keras_lars.tools.input_pipeline.idx import load_fashion_mnist
from keras_lars.tools.input_pipeline.idx import parse_idx
from keras_lars.tools.input_pipeline.sources import SOURCES
from keras_lars.tools.input_pipeline.sources import DatasetInfo
from keras_lars.tools.input_pipeline.sources import Digits
from keras_lars.tools.input_pipeline.sources import FashionMNIST
from keras_lars.tools.input_pipeline.sources import ImageNetRecords
from keras_lars.tools.input_pipeline.sources import load
from keras_lars.tools.input_pipeline.transforms import MEAN_RGB
from keras_lars.tools.input_pipeline.transforms import STDDEV_RGB
from keras_lars.tools.input_pipeline.transforms import central_crop_window
from keras_lars.tools.input_pipeline.transforms import preprocess_for_eval
from keras_lars.tools.input_pipeline.transforms import preprocess_for_train
from keras_lars.tools.input_pipeline.transforms import sample_crop_window
from keras_lars.tools.tensorflow_or_none import tf

if tf is not None:  # ImageNet-format records are read through TensorFlow
    from keras_lars.tools.input_pipeline.tfrecord_checks import find_bad_record
    from keras_lars.tools.input_pipeline.tfrecord_checks import validate_files
    from keras_lars.tools.input_pipeline.tfrecord_files import INFO_FILE
    from keras_lars.tools.input_pipeline.tfrecord_files import parse_record
    from keras_lars.tools.input_pipeline.tfrecord_files import shard_files

__all__ = [
    # the API of the training tool
    "DataError",
    "DatasetInfo",
    "SOURCES",
    "load",
    "Digits",
    "FashionMNIST",
    "ImageNetRecords",
    "find_bad_record",
    # ImageNet-format files
    "INFO_FILE",
    "shard_files",
    "parse_record",
    "validate_files",
    # the pipelines' pieces
    "load_digits",
    "epoch_permutation",
    "arrays_train",
    "synthetic",
    # Fashion-MNIST's IDX files
    "FASHION_MNIST_DIR",
    "IMAGES_MAGIC",
    "parse_idx",
    "load_fashion_mnist",
    # per-image preprocessing
    "MEAN_RGB",
    "STDDEV_RGB",
    "sample_crop_window",
    "central_crop_window",
    "preprocess_for_train",
    "preprocess_for_eval",
]
