"""The data sources behind one protocol, and `load`, which builds the one a
Config names: what the training tool sees of its data."""

import dataclasses
import inspect
import math
import typing

import numpy as np

from keras_lars.tools.input_pipeline import host
from keras_lars.tools.input_pipeline.arrays import DIGITS_CLASSES
from keras_lars.tools.input_pipeline.arrays import arrays_train
from keras_lars.tools.input_pipeline.arrays import grey_to_rgb
from keras_lars.tools.input_pipeline.arrays import load_digits
from keras_lars.tools.input_pipeline.arrays import synthetic
from keras_lars.tools.input_pipeline.errors import DataError
from keras_lars.tools.input_pipeline.idx import FASHION_MNIST_CLASSES
from keras_lars.tools.input_pipeline.idx import load_fashion_mnist
from keras_lars.tools.tensorflow_or_none import INSTALL
from keras_lars.tools.tensorflow_or_none import tf

if tf is not None:  # the records and the synthetic images are tf.data pipelines
    from keras_lars.tools.input_pipeline import tfrecord_files
    from keras_lars.tools.input_pipeline.imagenet import imagenet_eval_examples
    from keras_lars.tools.input_pipeline.imagenet import imagenet_train
    from keras_lars.tools.input_pipeline.tfrecord_checks import validate_files


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    """What the tool needs to know about a data set before building it."""

    name: str
    num_train: int
    num_eval: int
    num_classes: int
    train_files: tuple = ()
    eval_files: tuple = ()


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
    return dataset.take(num_batches).prefetch(tf.data.AUTOTUNE)


class DataSource(typing.Protocol):
    """A data set ready to build its splits, per epoch and input pipeline.

    Constructed from settings of the tool's Config (its constructor's
    parameter names are Config field names; `load` passes them).
    `train(epoch, ...)` yields at least the epoch's steps of batches of
    `global_batch_size / num_replicas` examples (the caller takes the steps),
    without the epoch's first `skip_batches` batches (a resume within it);
    `eval(...)` yields `eval_steps(...)` full batches of (images, labels,
    weights) covering the evaluation split once, padding with weight 0.
    `test`: None, or when the evaluation split is held out of the training
    images (--validation_examples), a source whose `eval` is the test split.
    """

    info: DatasetInfo

    def train(self, epoch, global_batch_size, input_context=None, skip_batches=0): ...

    def eval_steps(self, global_batch_size, num_pipelines=1): ...

    def eval(self, global_batch_size, input_context=None): ...


class _Source:
    """What every source shares: the padded evaluation batches."""

    test = None  # the test split's source when the evaluation split is held out

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
        local_replicas = global_batch_size // pipelines // batch
        steps = self.eval_steps(global_batch_size, pipelines)
        if tf is None:  # in memory as numpy (host.py)
            _, (images, labels) = self.arrays
            share = images[pipeline_id::pipelines], labels[pipeline_id::pipelines]
            count = steps * local_replicas
            return host.padded_batches(*share, batch, count, self.image_size, self.preprocess)
        examples = self.eval_examples(batch, pipeline_id, pipelines, input_context)
        return padded_batches(examples, batch, steps * local_replicas, self.image_size)


class _InMemory(_Source):
    """A data set held in memory: `arrays` = ((train images, labels), (eval
    images, labels)) host variables, read in the order of `epoch_permutation`;
    `preprocess` (if any) converts a batch of images as it is read;
    `train_examples`, `eval_examples` (0: all) keep the first N of a split.
    With `validation_examples` V, V training images drawn by
    `validation_seed` (`hold_out`) are the evaluation split, before
    `train_examples` cuts the rest, and `test` evaluates the test split."""

    preprocess = None

    def __init__(
        self,
        name,
        arrays,
        image_size,
        seed,
        num_classes,
        train_examples=0,
        eval_examples=0,
        validation_examples=0,
        validation_seed=0,
    ):
        self.image_size, self.seed = image_size, seed
        train, test = arrays
        test = _first(test, eval_examples, "--eval_examples", f"the {name} test split")
        train, validation = hold_out(train, validation_examples, validation_seed, name)
        train = _first(train, train_examples, "--train_examples", f"the {name} training split")
        evaluation = validation if validation_examples else test
        # Variables on the host, not constants: each epoch's training pipeline
        # captures the arrays, and a captured constant is copied into every
        # epoch's dataset graph (the training stream concatenates one dataset an
        # epoch: 47 MB an epoch of Fashion-MNIST, 19 GB for 400 epochs), while a
        # captured variable is a reference. Without TensorFlow: numpy (host.py).
        self.arrays = (train, evaluation)
        if tf is not None:
            with tf.device("/cpu:0"):
                self.arrays = tf.nest.map_structure(
                    lambda array: tf.Variable(array, trainable=False), self.arrays
                )
        self.info = DatasetInfo(name, len(train[1]), len(evaluation[1]), num_classes)
        self.test = _Test(self, test) if validation_examples else None

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
            self.preprocess,
        )

    def eval_examples(self, batch, pipeline_id, pipelines, input_context):
        _, (images, labels) = self.arrays
        return _examples(images, labels, pipeline_id, pipelines, self.preprocess)


def _examples(images, labels, pipeline_id, pipelines, preprocess):
    """Pipeline `pipeline_id` of `pipelines`' share of in-memory examples."""
    examples = tf.data.Dataset.from_tensor_slices(
        (images[pipeline_id::pipelines], labels[pipeline_id::pipelines])
    )
    if preprocess is None:
        return examples
    return examples.map(lambda image, label: (preprocess(image), label))


class _Test(_Source):
    """The test split of an _InMemory source whose evaluation split is held
    out of its training images (--validation_examples): evaluated like it."""

    def __init__(self, source, test):
        self.image_size, self.preprocess = source.image_size, source.preprocess
        with tf.device("/cpu:0"):
            self.arrays = tuple(tf.Variable(array, trainable=False) for array in test)
        self.info = dataclasses.replace(source.info, num_eval=len(test[1]))

    def eval_examples(self, batch, pipeline_id, pipelines, input_context):
        images, labels = self.arrays
        return _examples(images, labels, pipeline_id, pipelines, self.preprocess)


def hold_out(train, count, seed, name):
    """(the rest, the held-out) of the training split `train` = (images,
    labels): `count` examples drawn by a numpy permutation seeded by `seed`,
    the rest in their order (so --train_examples keeps its first N). A
    DataError names --validation_examples unless it leaves one example."""
    available = len(train[1])
    if count >= available:
        raise DataError(
            f"--validation_examples={count}: the {name} training split has {available} "
            "examples; hold out fewer, leaving at least one batch to train on."
        )
    held = np.random.default_rng(seed).permutation(available)[:count]
    rest = np.setdiff1d(np.arange(available), held)  # sorted
    return tuple(array[rest] for array in train), tuple(array[held] for array in train)


def _first(split, count, flag, what):
    """The first `count` examples of `split` = (images, labels) (0: all of
    them); a DataError names `flag` if the split has fewer."""
    available = len(split[1])
    if count > available:
        raise DataError(f"{flag}={count}: {what} has {available} examples; give at most that.")
    return split if count == 0 else tuple(array[:count] for array in split)


class Digits(_InMemory):
    """scikit-learn's 1797 handwritten digits in memory (`load_digits`),
    read in the order of `epoch_permutation`; nothing is downloaded."""

    def __init__(
        self,
        image_size=32,
        seed=0,
        num_classes=0,
        train_examples=0,
        eval_examples=0,
        validation_examples=0,
        validation_seed=0,
    ):
        arrays = load_digits(image_size)
        classes = num_classes or DIGITS_CLASSES
        super().__init__(
            "digits",
            arrays,
            image_size,
            seed,
            classes,
            train_examples,
            eval_examples,
            validation_examples,
            validation_seed,
        )


class FashionMNIST(_InMemory):
    """Fashion-MNIST (Xiao et al. 2017): 60000 training and 10000 test 28x28
    grey images of 10 classes, from the original IDX files in `data_dir`
    (default: where Debian's dataset-fashion-mnist puts them; `idx`). Held
    in memory as uint8, read in the order of `epoch_permutation`, each batch
    made RGB, resized and normalised as it is read (`grey_to_rgb`)."""

    def __init__(
        self,
        data_dir=None,
        image_size=28,
        seed=0,
        num_classes=0,
        train_examples=0,
        eval_examples=0,
        validation_examples=0,
        validation_seed=0,
    ):
        arrays = load_fashion_mnist(data_dir)
        classes = num_classes or FASHION_MNIST_CLASSES
        super().__init__(
            "fashion_mnist",
            arrays,
            image_size,
            seed,
            classes,
            train_examples,
            eval_examples,
            validation_examples,
            validation_seed,
        )

    def preprocess(self, images):
        return grey_to_rgb(images, self.image_size)


class Synthetic(_Source):
    """Random images of ImageNet's sizes (`synthetic`), for throughput."""

    def __init__(self, image_size=224, seed=0, num_classes=0, train_examples=0, eval_examples=0):
        self.image_size, self.seed = image_size, seed
        self.info = DatasetInfo(
            "synthetic",
            train_examples or tfrecord_files.IMAGENET_TRAIN_EXAMPLES,
            eval_examples or tfrecord_files.IMAGENET_EVAL_EXAMPLES,
            num_classes or tfrecord_files.IMAGENET_CLASSES,
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
        train_files = tfrecord_files.list_files(data_dir, tfrecord_files.TRAIN_PATTERN)
        eval_files = (
            tfrecord_files.list_files(data_dir, tfrecord_files.EVAL_PATTERN) if eval else ()
        )
        stored = tfrecord_files.read_info(data_dir)
        if not stored and not (train_examples and num_classes and (eval_examples or not eval)):
            stored = tfrecord_files.infer_info(data_dir, train_files, eval_files, label_offset)

        def count(key):
            return tfrecord_files.stored_count(stored, key, data_dir)

        self.info = DatasetInfo(
            "imagenet",
            train_examples or count("train"),
            (eval_examples or count("validation")) if eval else 0,
            num_classes or count("num_classes"),
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
        files = tfrecord_files.shard_files(self.info.eval_files, input_context)
        return imagenet_eval_examples(
            files, self.image_size, self.label_offset, self.info.num_classes
        )


# --dataset names the source; adding a source is a class above, a line here and one in
# tools/datasets.py (its default image size, its required settings).
SOURCES = {
    "digits": Digits,
    "fashion_mnist": FashionMNIST,
    "imagenet": ImageNetRecords,
    "synthetic": Synthetic,
}


def load(config):
    """The DataSource of `config.dataset`, built from the config's settings
    that its constructor names."""
    source = SOURCES[config.dataset]
    if tf is None and not issubclass(source, _InMemory):
        raise DataError(
            f"--dataset={config.dataset} is read through TensorFlow (tf.data), which is not "
            f"installed: {INSTALL}; digits and fashion_mnist train without it."
        )
    names = inspect.signature(source).parameters
    return source(**{name: getattr(config, name) for name in names})


def _per_replica(global_batch_size, input_context):
    if input_context is None:
        return global_batch_size
    return input_context.get_per_replica_batch_size(global_batch_size)
