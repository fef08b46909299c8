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
    arrays          in memory: the digits, grey images, synthetic images
    sources         DatasetInfo, the DataSource protocol, its sources, SOURCES, load

Everything is importable from here (`input_pipeline.load`, ...).
"""

from keras_lars.tools.input_pipeline.arrays import DIGITS_CLASSES
from keras_lars.tools.input_pipeline.arrays import DIGITS_SPLIT_SEED
from keras_lars.tools.input_pipeline.arrays import DIGITS_TEST_FRACTION
from keras_lars.tools.input_pipeline.arrays import arrays_train
from keras_lars.tools.input_pipeline.arrays import epoch_permutation
from keras_lars.tools.input_pipeline.arrays import grey_to_rgb
from keras_lars.tools.input_pipeline.arrays import load_digits
from keras_lars.tools.input_pipeline.arrays import synthetic
from keras_lars.tools.input_pipeline.errors import DataError
from keras_lars.tools.input_pipeline.idx import FASHION_MNIST_CLASSES
from keras_lars.tools.input_pipeline.idx import FASHION_MNIST_DIR
from keras_lars.tools.input_pipeline.idx import FASHION_MNIST_FILES
from keras_lars.tools.input_pipeline.idx import IMAGES_MAGIC
from keras_lars.tools.input_pipeline.idx import LABELS_MAGIC
from keras_lars.tools.input_pipeline.idx import load_fashion_mnist
from keras_lars.tools.input_pipeline.idx import parse_idx
from keras_lars.tools.input_pipeline.idx import read_idx
from keras_lars.tools.input_pipeline.imagenet import SHUFFLE_BUFFER
from keras_lars.tools.input_pipeline.imagenet import imagenet_eval_examples
from keras_lars.tools.input_pipeline.imagenet import imagenet_train
from keras_lars.tools.input_pipeline.sources import SOURCES
from keras_lars.tools.input_pipeline.sources import DatasetInfo
from keras_lars.tools.input_pipeline.sources import DataSource
from keras_lars.tools.input_pipeline.sources import Digits
from keras_lars.tools.input_pipeline.sources import FashionMNIST
from keras_lars.tools.input_pipeline.sources import ImageNetRecords
from keras_lars.tools.input_pipeline.sources import Synthetic
from keras_lars.tools.input_pipeline.sources import load
from keras_lars.tools.input_pipeline.sources import padded_batches
from keras_lars.tools.input_pipeline.tfrecord_checks import find_bad_record
from keras_lars.tools.input_pipeline.tfrecord_checks import record_problem
from keras_lars.tools.input_pipeline.tfrecord_checks import validate_files
from keras_lars.tools.input_pipeline.tfrecord_files import EVAL_PATTERN
from keras_lars.tools.input_pipeline.tfrecord_files import EVAL_SPLIT
from keras_lars.tools.input_pipeline.tfrecord_files import FEATURES
from keras_lars.tools.input_pipeline.tfrecord_files import IMAGENET_CLASSES
from keras_lars.tools.input_pipeline.tfrecord_files import IMAGENET_EVAL_EXAMPLES
from keras_lars.tools.input_pipeline.tfrecord_files import IMAGENET_SHARDS
from keras_lars.tools.input_pipeline.tfrecord_files import IMAGENET_TRAIN_EXAMPLES
from keras_lars.tools.input_pipeline.tfrecord_files import INFO_FILE
from keras_lars.tools.input_pipeline.tfrecord_files import TRAIN_PATTERN
from keras_lars.tools.input_pipeline.tfrecord_files import TRAIN_SPLIT
from keras_lars.tools.input_pipeline.tfrecord_files import list_files
from keras_lars.tools.input_pipeline.tfrecord_files import parse_record
from keras_lars.tools.input_pipeline.tfrecord_files import shard_files
from keras_lars.tools.input_pipeline.transforms import AREA_RANGE
from keras_lars.tools.input_pipeline.transforms import ASPECT_RATIO_RANGE
from keras_lars.tools.input_pipeline.transforms import EVAL_CROP_FRACTION
from keras_lars.tools.input_pipeline.transforms import MEAN_RGB
from keras_lars.tools.input_pipeline.transforms import STDDEV_RGB
from keras_lars.tools.input_pipeline.transforms import central_crop_window
from keras_lars.tools.input_pipeline.transforms import normalize
from keras_lars.tools.input_pipeline.transforms import preprocess_for_eval
from keras_lars.tools.input_pipeline.transforms import preprocess_for_train
from keras_lars.tools.input_pipeline.transforms import sample_crop_window

__all__ = [
    # the API of the training tool
    "DataError",
    "DataSource",
    "DatasetInfo",
    "SOURCES",
    "load",
    "Digits",
    "FashionMNIST",
    "ImageNetRecords",
    "Synthetic",
    "find_bad_record",
    # ImageNet-format files
    "TRAIN_SPLIT",
    "EVAL_SPLIT",
    "TRAIN_PATTERN",
    "EVAL_PATTERN",
    "INFO_FILE",
    "FEATURES",
    "IMAGENET_TRAIN_EXAMPLES",
    "IMAGENET_EVAL_EXAMPLES",
    "IMAGENET_CLASSES",
    "IMAGENET_SHARDS",
    "list_files",
    "shard_files",
    "parse_record",
    "record_problem",
    "validate_files",
    # the pipelines' pieces
    "SHUFFLE_BUFFER",
    "imagenet_train",
    "imagenet_eval_examples",
    "padded_batches",
    "DIGITS_CLASSES",
    "DIGITS_SPLIT_SEED",
    "DIGITS_TEST_FRACTION",
    "load_digits",
    "epoch_permutation",
    "arrays_train",
    "grey_to_rgb",
    "synthetic",
    # Fashion-MNIST's IDX files
    "FASHION_MNIST_CLASSES",
    "FASHION_MNIST_DIR",
    "FASHION_MNIST_FILES",
    "IMAGES_MAGIC",
    "LABELS_MAGIC",
    "parse_idx",
    "read_idx",
    "load_fashion_mnist",
    # per-image preprocessing
    "MEAN_RGB",
    "STDDEV_RGB",
    "AREA_RANGE",
    "ASPECT_RATIO_RANGE",
    "EVAL_CROP_FRACTION",
    "sample_crop_window",
    "central_crop_window",
    "normalize",
    "preprocess_for_train",
    "preprocess_for_eval",
]
