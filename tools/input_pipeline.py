"""Input pipelines of the training tool: ImageNet-format TFRecords, synthetic
images and scikit-learn's handwritten digits.

Every training split is built one epoch at a time, and an epoch's examples,
their order and their augmentation are a pure function of (seed, epoch): a
run resumed at epoch e in a new process sees exactly the batches that an
uninterrupted run saw. Datasets are built per input pipeline (one per
worker) from a `tf.distribute.InputContext` and batched with the per-replica
batch size, for `strategy.distribute_datasets_from_function`.

ImageNet format (as written by tensorflow/tpu's imagenet_to_gcs.py and by
keras-lars-make-tfrecords): shards `train-*` and `validation-*` of
`tf.train.Example`s with

    image/encoded       bytes, a JPEG
    image/class/label   int64, 1..num_classes (label_offset=1, tensorflow/tpu)
                        or 0..num_classes-1 (label_offset=0)

Training: a random crop covering 8%-100% of the image area with aspect ratio
in [3/4, 4/3] (Szegedy et al. 2015), decoded together with the crop
(`decode_and_crop_jpeg`), resized to image_size, randomly flipped.
Evaluation: the central square of side 0.875 * min(height, width) (a 224
crop of a 256 image), resized to image_size. Both normalise each channel
with the ImageNet mean and standard deviation (of 0..255 values).
"""

import dataclasses
import inspect
import json
import math
import os
import typing

import numpy as np
import tensorflow as tf

from keras_lars.recipes import IMAGENET_TRAIN_EXAMPLES
from keras_lars.tools.storage import first_line

MEAN_RGB = (0.485 * 255, 0.456 * 255, 0.406 * 255)
STDDEV_RGB = (0.229 * 255, 0.224 * 255, 0.225 * 255)
AREA_RANGE = (0.08, 1.0)
ASPECT_RATIO_RANGE = (3 / 4, 4 / 3)
EVAL_CROP_FRACTION = 224 / 256
IMAGENET_EVAL_EXAMPLES = 50000
IMAGENET_CLASSES = 1000
TRAIN_SPLIT, EVAL_SPLIT = "train", "validation"  # shard name prefixes
TRAIN_PATTERN = f"{TRAIN_SPLIT}-*"
EVAL_PATTERN = f"{EVAL_SPLIT}-*"
INFO_FILE = "dataset.json"  # written by keras-lars-make-tfrecords
DIGITS_CLASSES = 10
DIGITS_SPLIT_SEED = 0  # the train/test split never changes with --seed
DIGITS_TEST_FRACTION = 0.2
SHUFFLE_BUFFER = 10000
AUTOTUNE = tf.data.AUTOTUNE


class DataError(Exception):
    """Input data that cannot be used; the message names the file or flag."""


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    """What the tool needs to know about a data set before building it."""

    name: str
    num_train: int
    num_eval: int
    num_classes: int
    train_files: tuple = ()
    eval_files: tuple = ()


# --- geometry of the crops (pure functions of the image shape and a seed) ---
def sample_crop_window(image_shape, seed):
    """Random crop (offset_y, offset_x, height, width) of an image of shape
    (height, width, channels): area fraction in AREA_RANGE, aspect ratio
    width/height in ASPECT_RATIO_RANGE, up to integer rounding; the whole
    image if 10 attempts find no such crop. `seed`: int tensor of shape [2]."""
    begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
        image_size=image_shape,
        bounding_boxes=tf.constant([[[0.0, 0.0, 1.0, 1.0]]]),
        seed=seed,
        min_object_covered=0.0,
        aspect_ratio_range=ASPECT_RATIO_RANGE,
        area_range=AREA_RANGE,
        max_attempts=10,
        use_image_if_no_bounding_boxes=True,
    )
    return tf.stack([begin[0], begin[1], size[0], size[1]])


def central_crop_window(image_shape):
    """The evaluation crop (offset_y, offset_x, side, side): the central
    square of side floor(EVAL_CROP_FRACTION * min(height, width))."""
    height, width = image_shape[0], image_shape[1]
    side = tf.cast(EVAL_CROP_FRACTION * tf.cast(tf.minimum(height, width), tf.float64), tf.int32)
    return tf.stack([(height - side + 1) // 2, (width - side + 1) // 2, side, side])


def normalize(images):
    """(x - mean) / stddev per channel, x in 0..255."""
    return (tf.cast(images, tf.float32) - MEAN_RGB) / STDDEV_RGB


def preprocess_for_train(jpeg, image_size, seed):
    """JPEG bytes -> normalised float32 (image_size, image_size, 3):
    random-area crop, resize, random left-right flip. `seed`: shape [2]."""
    crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, num=2))
    window = sample_crop_window(tf.image.extract_jpeg_shape(jpeg), crop_seed)
    image = tf.image.decode_and_crop_jpeg(jpeg, window, channels=3)
    image = tf.image.resize(image, [image_size, image_size])
    image = tf.image.stateless_random_flip_left_right(image, flip_seed)
    return normalize(image)


def preprocess_for_eval(jpeg, image_size):
    """JPEG bytes -> normalised float32 (image_size, image_size, 3): the
    central 224/256 crop, resized."""
    window = central_crop_window(tf.image.extract_jpeg_shape(jpeg))
    image = tf.image.decode_and_crop_jpeg(jpeg, window, channels=3)
    return normalize(tf.image.resize(image, [image_size, image_size]))


# --- ImageNet-format records ---------------------------------------------------
_FEATURES = {
    "image/encoded": tf.io.FixedLenFeature([], tf.string),
    "image/class/label": tf.io.FixedLenFeature([], tf.int64),
}


def parse_record(record, label_offset, num_classes):
    """Serialized tf.train.Example -> (JPEG bytes, int32 label in
    [0, num_classes)); a label out of range fails the pipeline."""
    features = tf.io.parse_single_example(record, _FEATURES)
    label = tf.cast(features["image/class/label"] - label_offset, tf.int32)
    check = tf.debugging.assert_equal(
        tf.logical_and(label >= 0, label < num_classes),
        True,
        message=f"label - label_offset ({label_offset}) outside [0, {num_classes}): "
        "check --label_offset and --num_classes",
    )
    with tf.control_dependencies([check]):
        return tf.identity(features["image/encoded"]), label


def record_problem(record, label_offset, num_classes, decode=True):
    """Why the serialized `record` (eager) is not a usable ImageNet-format
    example, or None if it is. The image is checked with the ops training
    uses (`extract_jpeg_shape`, then with `decode` the whole
    `decode_and_crop_jpeg`), which refuse PNG and other formats that
    `decode_jpeg` would accept."""
    try:
        features = tf.io.parse_single_example(record, _FEATURES)
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


def list_files(data_dir, pattern):
    """Sorted files of `data_dir` matching `pattern`; DataError if none."""
    if not data_dir:
        raise DataError("--data_dir is required with --dataset=imagenet.")
    files = sorted(tf.io.gfile.glob(os.path.join(data_dir, pattern)))
    if not files:
        raise DataError(f"--data_dir={data_dir}: no file matches {os.path.join(data_dir, pattern)}")
    for path in files:
        if tf.io.gfile.isdir(path):
            raise DataError(f"{path} is a directory, not a TFRecord file.")
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


def _element_seed(seed, epoch, pipeline_id, index):
    """Per-example augmentation seed, shape [2]: (seed, epoch|pipeline|index)."""
    counter = tf.constant((epoch << 40) + (pipeline_id << 32), tf.int64) + index
    return tf.stack([tf.constant(seed, tf.int64), counter])


def imagenet_train(
    files,
    epoch,
    batch_size,
    image_size,
    seed,
    label_offset,
    num_classes,
    input_context=None,
    skip_batches=0,
):
    """One epoch of training batches (repeated: the caller takes the steps).

    Files are sharded per pipeline, then file order, record order (a
    SHUFFLE_BUFFER shuffle) and augmentation follow seeds of (seed, epoch).
    The first `skip_batches` batches are skipped before decoding (a resume
    within the epoch); each example keeps its index and so its augmentation.
    """
    files = shard_files(files, input_context)
    pipeline_id = input_context.input_pipeline_id if input_context else 0
    epoch_seed = seed * 100003 + epoch
    dataset = tf.data.Dataset.from_tensor_slices(list(files))
    dataset = dataset.shuffle(len(files), seed=epoch_seed)
    dataset = dataset.interleave(
        lambda path: tf.data.TFRecordDataset(path, buffer_size=8 << 20),
        cycle_length=min(16, len(files)),
        num_parallel_calls=AUTOTUNE,
        deterministic=True,
    )
    dataset = dataset.shuffle(SHUFFLE_BUFFER, seed=epoch_seed).repeat()
    dataset = dataset.enumerate().skip(skip_batches * batch_size)

    def decode(index, record):
        jpeg, label = parse_record(record, label_offset, num_classes)
        element_seed = _element_seed(seed, epoch, pipeline_id, index)
        return preprocess_for_train(jpeg, image_size, element_seed), label

    dataset = dataset.map(decode, num_parallel_calls=AUTOTUNE)
    return dataset.batch(batch_size, drop_remainder=True).prefetch(AUTOTUNE)


def imagenet_eval_examples(files, image_size, label_offset, num_classes):
    """This pipeline's evaluation examples (unbatched), in file order."""
    dataset = tf.data.Dataset.from_tensor_slices(list(files))
    dataset = dataset.interleave(
        tf.data.TFRecordDataset,
        cycle_length=min(8, len(files)),
        num_parallel_calls=AUTOTUNE,
        deterministic=True,
    )

    def decode(record):
        jpeg, label = parse_record(record, label_offset, num_classes)
        return preprocess_for_eval(jpeg, image_size), label

    return dataset.map(decode, num_parallel_calls=AUTOTUNE)


def padded_batches(examples, batch_size, num_batches, image_size):
    """(images, labels, weights) batches: the examples with weight 1, then
    weight-0 blank examples, cut to exactly `num_batches` full batches, so
    every replica of every worker runs every evaluation step on a full batch
    (static shapes for TPUs; no empty batch) and the weighted metrics count
    each real example once."""
    real = examples.map(lambda image, label: (image, label, 1.0))
    blank = tf.data.Dataset.from_tensors(
        (tf.zeros([image_size, image_size, 3]), tf.constant(0, tf.int32), 0.0)
    ).repeat()
    dataset = real.concatenate(blank).batch(batch_size, drop_remainder=True)
    return dataset.take(num_batches).prefetch(AUTOTUNE)


# --- synthetic images ------------------------------------------------------------
def synthetic(batch_size, image_size, num_classes, seed):
    """One batch of random normal images and labels, generated once and
    repeated forever: measures everything but the input pipeline."""
    images = tf.random.stateless_normal([batch_size, image_size, image_size, 3], [seed, 1])
    labels = tf.random.stateless_uniform(
        [batch_size], [seed, 2], minval=0, maxval=num_classes, dtype=tf.int32
    )
    return tf.data.Dataset.from_tensors((images, labels)).repeat()


# --- scikit-learn's handwritten digits ---------------------------------------------
def load_digits(image_size):
    """((train images, labels), (test images, labels)) as numpy arrays: the
    1797 8x8 digits, upsampled to (image_size, image_size, 3) and normalised,
    split 80/20 by a fixed seeded permutation."""
    try:
        from sklearn.datasets import load_digits as sklearn_digits
    except ImportError:
        raise DataError(
            "--dataset=digits needs scikit-learn: pip install scikit-learn "
            "(or the tools extra: pip install 'keras-lars[tools]')."
        ) from None
    pixels, labels = sklearn_digits(return_X_y=True)
    images = pixels.reshape(-1, 8, 8, 1).astype("float32") * (255.0 / 16.0)
    images = tf.image.resize(images, [image_size, image_size], method="bilinear")
    images = normalize(tf.repeat(images, 3, axis=-1)).numpy()
    labels = labels.astype("int32")
    order = np.random.default_rng(DIGITS_SPLIT_SEED).permutation(len(labels))
    test = round(len(labels) * DIGITS_TEST_FRACTION)
    train_index, test_index = order[test:], order[:test]
    return (images[train_index], labels[train_index]), (images[test_index], labels[test_index])


def epoch_permutation(num_examples, seed, epoch):
    """The order of the training examples in `epoch`: a numpy permutation
    seeded by (seed, epoch)."""
    return np.random.default_rng([seed, epoch]).permutation(num_examples)


def arrays_train(images, labels, epoch, batch_size, seed, input_context=None, skip_batches=0):
    """One epoch of in-memory examples (tensors) in the order of
    `epoch_permutation`, every n-th for pipeline i of n, without its first
    `skip_batches` batches; no augmentation."""
    order = epoch_permutation(int(labels.shape[0]), seed, epoch)
    if input_context is not None:
        order = order[input_context.input_pipeline_id :: input_context.num_input_pipelines]
    order = order[skip_batches * batch_size :]
    dataset = tf.data.Dataset.from_tensor_slices(order)
    dataset = dataset.batch(batch_size, drop_remainder=True)
    dataset = dataset.map(lambda index: (tf.gather(images, index), tf.gather(labels, index)))
    return dataset.prefetch(AUTOTUNE)


# --- the data sources: one class each, behind one protocol ---------------------------
class DataSource(typing.Protocol):
    """A data set ready to build its splits, per epoch and input pipeline.

    Constructed from settings of the tool's Config (its constructor's
    parameter names are Config field names; `load` passes them).
    `train(epoch, ...)` yields at least the epoch's steps of batches of
    `global_batch_size / num_replicas` examples (the caller takes the steps),
    without the epoch's first `skip_batches` batches (a resume within it);
    `eval(...)` yields `eval_steps(...)` full batches of (images, labels,
    weights) covering the evaluation split once, padding with weight 0.
    """

    info: DatasetInfo

    def train(self, epoch, global_batch_size, input_context=None, skip_batches=0): ...

    def eval_steps(self, global_batch_size, num_pipelines=1): ...

    def eval(self, global_batch_size, input_context=None): ...


class _Source:
    """What every source shares: the padded evaluation batches."""

    default_image_size = 224
    required_settings = ()  # constructor arguments that must be given

    def eval_share(self, num_pipelines):
        """The most evaluation examples one input pipeline holds."""
        return math.ceil(self.info.num_eval / num_pipelines)

    def eval_steps(self, global_batch_size, num_pipelines=1):
        """Evaluation steps: enough for the largest pipeline's share."""
        return math.ceil(self.eval_share(num_pipelines) / (global_batch_size // num_pipelines))

    def eval(self, global_batch_size, input_context=None):
        batch = _per_replica(global_batch_size, input_context)
        pipelines = input_context.num_input_pipelines if input_context else 1
        pipeline_id = input_context.input_pipeline_id if input_context else 0
        examples = self.eval_examples(batch, pipeline_id, pipelines, input_context)
        local_replicas = global_batch_size // pipelines // batch
        steps = self.eval_steps(global_batch_size, pipelines)
        return padded_batches(examples, batch, steps * local_replicas, self.image_size)


class Digits(_Source):
    """scikit-learn's 1797 handwritten digits in memory (`load_digits`),
    read in the order of `epoch_permutation`; nothing is downloaded."""

    default_image_size = 32

    def __init__(self, image_size=32, seed=0, num_classes=0):
        self.image_size, self.seed = image_size, seed
        self.arrays = tf.nest.map_structure(tf.constant, load_digits(image_size))
        (_, train_labels), (_, eval_labels) = self.arrays
        self.info = DatasetInfo(
            "digits", len(train_labels), len(eval_labels), num_classes or DIGITS_CLASSES
        )

    def train(self, epoch, global_batch_size, input_context=None, skip_batches=0):
        (images, labels), _ = self.arrays
        return arrays_train(
            images,
            labels,
            epoch,
            _per_replica(global_batch_size, input_context),
            self.seed,
            input_context,
            skip_batches,
        )

    def eval_examples(self, batch, pipeline_id, pipelines, input_context):
        _, (images, labels) = self.arrays
        return tf.data.Dataset.from_tensor_slices(
            (images[pipeline_id::pipelines], labels[pipeline_id::pipelines])
        )


class Synthetic(_Source):
    """Random images of ImageNet's sizes (`synthetic`), for throughput."""

    def __init__(self, image_size=224, seed=0, num_classes=0, train_examples=0, eval_examples=0):
        self.image_size, self.seed = image_size, seed
        self.info = DatasetInfo(
            "synthetic",
            train_examples or IMAGENET_TRAIN_EXAMPLES,
            eval_examples or IMAGENET_EVAL_EXAMPLES,
            num_classes or IMAGENET_CLASSES,
        )

    def train(self, epoch, global_batch_size, input_context=None, skip_batches=0):
        return synthetic(
            _per_replica(global_batch_size, input_context),
            self.image_size,
            self.info.num_classes,
            self.seed,
        )

    def eval_examples(self, batch, pipeline_id, pipelines, input_context):
        return synthetic(batch, self.image_size, self.info.num_classes, self.seed + 1).unbatch()


class ImageNetRecords(_Source):
    """ImageNet-format TFRecords: `data_dir/train-*` and `data_dir/validation-*`.

    The first record of every file is checked here (DataError naming the
    file). Counts and classes: the arguments if > 0, else
    `data_dir/dataset.json` (written by keras-lars-make-tfrecords); without
    it, ImageNet's 1281167 / 50000 / 1000 for the 1024 + 128 shards that
    tensorflow/tpu's imagenet_to_gcs.py writes, else counted from the
    records (saying so). With eval=False no validation-* is needed.
    """

    required_settings = ("data_dir",)

    def __init__(
        self,
        data_dir=None,
        eval=True,
        image_size=224,
        seed=0,
        label_offset=1,
        num_classes=0,
        train_examples=0,
        eval_examples=0,
    ):
        self.image_size, self.seed, self.label_offset = image_size, seed, label_offset
        train_files = list_files(data_dir, TRAIN_PATTERN)
        eval_files = list_files(data_dir, EVAL_PATTERN) if eval else ()
        stored = _read_info(data_dir)
        if not stored and not (train_examples and num_classes and (eval_examples or not eval)):
            stored = _infer_info(data_dir, train_files, eval_files, label_offset)
        self.info = DatasetInfo(
            "imagenet",
            train_examples or _count(stored, "train", data_dir),
            (eval_examples or _count(stored, "validation", data_dir)) if eval else 0,
            num_classes or _count(stored, "num_classes", data_dir),
            train_files,
            eval_files,
        )
        validate_files(train_files + eval_files, label_offset, self.info.num_classes)

    def train(self, epoch, global_batch_size, input_context=None, skip_batches=0):
        return imagenet_train(
            self.info.train_files,
            epoch,
            _per_replica(global_batch_size, input_context),
            self.image_size,
            self.seed,
            self.label_offset,
            self.info.num_classes,
            input_context,
            skip_batches,
        )

    def eval_share(self, num_pipelines):
        if num_pipelines == 1:
            return self.info.num_eval
        # At most ceil(F / P) files of at most ceil(N / F) records each (shards
        # of near-equal size, as make_tfrecords and tensorflow/tpu write them).
        files = len(self.info.eval_files)
        return math.ceil(files / num_pipelines) * math.ceil(self.info.num_eval / files)

    def eval_examples(self, batch, pipeline_id, pipelines, input_context):
        files = shard_files(self.info.eval_files, input_context)
        return imagenet_eval_examples(
            files, self.image_size, self.label_offset, self.info.num_classes
        )


# --dataset names the source; adding a source is a class above and a line here.
SOURCES = {"digits": Digits, "imagenet": ImageNetRecords, "synthetic": Synthetic}


def load(config):
    """The DataSource of `config.dataset`, built from the config's settings
    that its constructor names."""
    source = SOURCES[config.dataset]
    names = inspect.signature(source).parameters
    return source(**{name: getattr(config, name) for name in names})


def _per_replica(global_batch_size, input_context):
    if input_context is None:
        return global_batch_size
    return input_context.get_per_replica_batch_size(global_batch_size)


IMAGENET_SHARDS = (1024, 128)  # train-*, validation-* of tensorflow/tpu's imagenet_to_gcs.py


def _infer_info(data_dir, train_files, eval_files, label_offset):
    """Counts and classes of records without a dataset.json (see ImageNetRecords)."""
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
    label = {"image/class/label": _FEATURES["image/class/label"]}

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


def _count(info, key, data_dir):
    if key not in info:
        raise DataError(
            f"{os.path.join(data_dir, INFO_FILE)} has no {key!r}: convert that split with "
            "keras-lars-make-tfrecords, or give the count as a flag"
        )
    return info[key]


def _read_info(data_dir):
    path = os.path.join(data_dir, INFO_FILE)
    if not tf.io.gfile.exists(path):
        return {}
    try:
        with tf.io.gfile.GFile(path) as f:
            info = json.load(f)
        return {k: int(info[k]) for k in ("train", "validation", "num_classes") if k in info}
    except (ValueError, TypeError, AttributeError, KeyError) as error:
        raise DataError(f"{path} is not a valid {INFO_FILE}: {error}") from None
