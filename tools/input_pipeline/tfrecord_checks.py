"""Checks of ImageNet-format records: the first record of every file up
front, and, only to report a failure, the search for the first bad record."""

import tensorflow as tf

from keras_lars.tools.input_pipeline.errors import DataError
from keras_lars.tools.input_pipeline.tfrecord_files import FEATURES
from keras_lars.tools.storage import first_line


def record_problem(record, label_offset, num_classes, decode=True):
    """Why the serialized `record` (eager) is not a usable ImageNet-format
    example, or None if it is. The image is checked with the ops training
    uses (`extract_jpeg_shape`, then with `decode` the whole
    `decode_and_crop_jpeg`), which refuse PNG and other formats that
    `decode_jpeg` would accept."""
    try:
        features = tf.io.parse_single_example(record, FEATURES)
    except tf.errors.InvalidArgumentError as error:
        return (
            "not an ImageNet-format example (image/encoded JPEG bytes, "
            f"image/class/label int64): {first_line(error)}"
        )
    jpeg = features["image/encoded"]
    try:
        shape = tf.image.extract_jpeg_shape(jpeg)
        if decode:
            window = tf.stack([0, 0, shape[0], shape[1]])
            tf.image.decode_and_crop_jpeg(jpeg, window, channels=3)
    except tf.errors.InvalidArgumentError as error:
        return f"image/encoded is not a readable JPEG: {first_line(error)}"
    label = int(features["image/class/label"])
    if not 0 <= label - label_offset < num_classes:
        return (
            f"label {label} minus --label_offset={label_offset} is outside "
            f"[0, {num_classes}); check --label_offset (1 for labels 1..N, 0 "
            "for 0..N-1) and --num_classes"
        )
    return None


def validate_files(files, label_offset, num_classes):
    """Checks the first record of each file up front (DataError naming it)."""
    for path in files:
        try:
            records = list(tf.data.TFRecordDataset(path).take(1))
        except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as error:
            raise DataError(f"{path} is not a TFRecord file: {first_line(error)}") from None
        if not records:
            raise DataError(f"{path} holds no record.")
        problem = record_problem(records[0], label_offset, num_classes)
        if problem:
            raise DataError(f"{path}: first record: {problem}")


def find_bad_record(files, label_offset, num_classes):
    """(path, record index, problem) of the first bad record, or None; only
    for reporting a failure. A first pass reads every record's features and
    JPEG header (no image is decoded); only if that finds nothing, a second
    pass decodes every image."""
    for decode in (False, True):
        for path in files:
            index = -1
            try:
                for index, record in enumerate(tf.data.TFRecordDataset(path)):
                    problem = record_problem(record, label_offset, num_classes, decode)
                    if problem:
                        return path, index, problem
            except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as error:
                return path, index + 1, f"unreadable TFRecord data: {first_line(error)}"
    return None
