"""ImageNet-format TFRecord files: their names, listing and sharding, the
parsing of one record, and the counts of a data set (dataset.json, or
counted from the records).

The format (as written by tensorflow/tpu's imagenet_to_gcs.py and by
keras-lars-make-tfrecords): shards `train-*` and `validation-*` of
`tf.train.Example`s with

    image/encoded       bytes, a JPEG
    image/class/label   int64, 1..num_classes (label_offset=1, tensorflow/tpu)
                        or 0..num_classes-1 (label_offset=0)
"""

import json
import os

import tensorflow as tf

from keras_lars.recipes import IMAGENET_TRAIN_EXAMPLES
from keras_lars.tools.datasets import EVAL_SPLIT
from keras_lars.tools.datasets import TRAIN_SPLIT
from keras_lars.tools.input_pipeline.errors import DataError
from keras_lars.tools.storage import first_line
from keras_lars.tools.storage import special_file

IMAGENET_EVAL_EXAMPLES = 50000
IMAGENET_CLASSES = 1000
IMAGENET_SHARDS = (1024, 128)  # train-*, validation-* of tensorflow/tpu's imagenet_to_gcs.py
TRAIN_PATTERN = f"{TRAIN_SPLIT}-*"
EVAL_PATTERN = f"{EVAL_SPLIT}-*"
INFO_FILE = "dataset.json"  # written by keras-lars-make-tfrecords
FEATURES = {
    "image/encoded": tf.io.FixedLenFeature([], tf.string),
    "image/class/label": tf.io.FixedLenFeature([], tf.int64),
}


def parse_record(record, label_offset, num_classes):
    """Serialized tf.train.Example -> (JPEG bytes, int32 label in
    [0, num_classes)); a label out of range fails the pipeline."""
    features = tf.io.parse_single_example(record, FEATURES)
    label = tf.cast(features["image/class/label"] - label_offset, tf.int32)
    check = tf.debugging.assert_equal(
        tf.logical_and(label >= 0, label < num_classes),
        True,
        message=f"label - label_offset ({label_offset}) outside [0, {num_classes}): "
        "check --label_offset and --num_classes",
    )
    with tf.control_dependencies([check]):
        return tf.identity(features["image/encoded"]), label


def list_files(data_dir, pattern):
    """Sorted files of `data_dir` matching `pattern`; DataError if none."""
    if not data_dir:
        raise DataError("--data_dir is required with --dataset=imagenet.")
    files = sorted(tf.io.gfile.glob(os.path.join(data_dir, pattern)))
    if not files:
        raise DataError(f"--data_dir={data_dir}: no file matches {os.path.join(data_dir, pattern)}")
    for path in files:
        special = "a directory" if tf.io.gfile.isdir(path) else special_file(path)
        if special:  # a FIFO or a device would block or never end
            raise DataError(f"{path} is {special}, not a TFRecord file.")
        if not tf.io.gfile.exists(path):
            raise DataError(f"{path} cannot be read (a link to a missing file?).")
    return tuple(files)


def shard_files(files, input_context):
    """This input pipeline's files: every n-th, starting at its id."""
    if input_context is None or input_context.num_input_pipelines == 1:
        return tuple(files)
    n, i = input_context.num_input_pipelines, input_context.input_pipeline_id
    if len(files) < n:
        raise DataError(
            f"{len(files)} file(s) ({files[0]}, ...) cannot be split between "
            f"{n} workers: write at least one shard per worker."
        )
    return tuple(files[i::n])


def read_info(data_dir):
    """{train, validation, num_classes} (those present) of `data_dir`'s
    dataset.json; {} without one."""
    path = os.path.join(data_dir, INFO_FILE)
    if not tf.io.gfile.exists(path):
        return {}
    special = special_file(path)
    if special:
        raise DataError(f"{path} is {special}, not a {INFO_FILE}.")
    try:
        with tf.io.gfile.GFile(path) as f:
            info = json.load(f)
        return {k: int(info[k]) for k in ("train", "validation", "num_classes") if k in info}
    except (ValueError, TypeError, AttributeError, KeyError) as error:
        raise DataError(f"{path} is not a valid {INFO_FILE}: {error}") from None


def infer_info(data_dir, train_files, eval_files, label_offset):
    """{train, validation, num_classes} of records without a dataset.json:
    ImageNet's for ImageNet's 1024 + 128 shards, else counted from the
    records (num_classes = largest label - label_offset + 1), saying which."""
    if (len(train_files), len(eval_files)) == IMAGENET_SHARDS:
        print(
            f"{data_dir} has no {INFO_FILE}; its 1024 + 128 shards are ImageNet's layout: "
            f"using ImageNet's counts and classes",
            flush=True,
        )
        return {
            "train": IMAGENET_TRAIN_EXAMPLES,
            "validation": IMAGENET_EVAL_EXAMPLES,
            "num_classes": IMAGENET_CLASSES,
        }
    print(
        f"{data_dir} has no {INFO_FILE}: counting the records of its "
        f"{len(train_files) + len(eval_files)} files (keras-lars-make-tfrecords writes one; "
        "or give --train_examples, --eval_examples and --num_classes)",
        flush=True,
    )
    label = {"image/class/label": FEATURES["image/class/label"]}

    def count(files):
        """(records, largest label) of `files`."""
        total, top = 0, -1
        for path in files:
            labels = tf.data.TFRecordDataset(path).map(
                lambda r: tf.io.parse_single_example(r, label)["image/class/label"]
            )
            try:
                n, high = labels.reduce(
                    (tf.constant(0, tf.int64), tf.constant(-1, tf.int64)),
                    lambda acc, y: (acc[0] + 1, tf.maximum(acc[1], y)),
                )
            except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as error:
                raise DataError(
                    f"{path} is not a TFRecord file of ImageNet-format examples: "
                    f"{first_line(error)}"
                ) from None
            total, top = total + int(n), max(top, int(high))
        return total, top

    train, top = count(train_files)
    validation, _ = count(eval_files)
    return {"train": train, "validation": validation, "num_classes": top - label_offset + 1}


def stored_count(info, key, data_dir):
    """info[key], or DataError naming the dataset.json that lacks it."""
    if key not in info:
        raise DataError(
            f"{os.path.join(data_dir, INFO_FILE)} has no {key!r}: convert that split with "
            "keras-lars-make-tfrecords, or give the count as a flag"
        )
    return info[key]
