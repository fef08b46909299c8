"""In-memory data: scikit-learn's handwritten digits and grey images such as
Fashion-MNIST's, read in a seeded order per epoch, and synthetic images for
throughput. Without TensorFlow (a JAX-only install) the in-memory data
are numpy batches (host.py) in the same order."""

import numpy as np

from keras_lars.tools.input_pipeline.errors import DataError
from keras_lars.tools.input_pipeline.host import Batches
from keras_lars.tools.input_pipeline.transforms import normalize
from keras_lars.tools.tensorflow_or_none import tf

DIGITS_CLASSES = 10
DIGITS_SPLIT_SEED = 0  # the train/test split never changes with --seed
DIGITS_TEST_FRACTION = 0.2


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
    images = normalize(np.repeat(resized(images, image_size), 3, axis=-1))
    labels = labels.astype("int32")
    order = np.random.default_rng(DIGITS_SPLIT_SEED).permutation(len(labels))
    test = round(len(labels) * DIGITS_TEST_FRACTION)
    train_index, test_index = order[test:], order[:test]
    return (images[train_index], labels[train_index]), (images[test_index], labels[test_index])


def resized(images, image_size):
    """float32 numpy images (n, rows, cols, channels) at (image_size,
    image_size), bilinear: by TensorFlow where it is installed, else by
    Keras's backend; unchanged where already that size."""
    if images.shape[1:3] == (image_size, image_size):
        return images
    if tf is not None:
        return tf.image.resize(images, [image_size, image_size], method="bilinear").numpy()
    import keras

    size = (image_size, image_size)
    return np.asarray(keras.ops.image.resize(images, size, interpolation="bilinear"))


def grey_to_rgb(images, image_size):
    """uint8 grey images (..., rows, cols) -> normalised float32
    (..., image_size, image_size, 3): resized (bilinear) unless already that
    size, the grey channel repeated, ImageNet's channel normalisation. A
    numpy batch (host.py's) gives a numpy batch."""
    if isinstance(images, np.ndarray):
        rgb = np.repeat(resized(images[..., np.newaxis].astype(np.float32), image_size), 3, -1)
        return normalize(rgb)
    images = tf.cast(images[..., tf.newaxis], tf.float32)
    if tuple(images.shape[-3:-1]) != (image_size, image_size):
        images = tf.image.resize(images, [image_size, image_size], method="bilinear")
    return normalize(tf.repeat(images, 3, axis=-1))


def epoch_permutation(num_examples, seed, epoch):
    """The order of the training examples in `epoch`: a numpy permutation
    seeded by (seed, epoch)."""
    return np.random.default_rng([seed, epoch]).permutation(num_examples)


def arrays_train(
    images, labels, epoch, batch_size, seed, input_context=None, skip_batches=0, preprocess=None
):
    """One epoch of in-memory examples (tensors) in the order of
    `epoch_permutation`, every n-th for pipeline i of n, without its first
    `skip_batches` batches; no augmentation. `preprocess` maps each batch of
    images (stored compact, converted as they are read)."""
    order = epoch_permutation(int(labels.shape[0]), seed, epoch)
    if input_context is not None:
        order = order[input_context.input_pipeline_id :: input_context.num_input_pipelines]
    order = order[skip_batches * batch_size :]
    if tf is None:  # numpy arrays (host.py)

        def make(index):
            chosen = order[index * batch_size : (index + 1) * batch_size]
            batch = images[chosen] if preprocess is None else preprocess(images[chosen])
            return batch, labels[chosen]

        return Batches.of(len(order) // batch_size, make)
    dataset = tf.data.Dataset.from_tensor_slices(order)
    dataset = dataset.batch(batch_size, drop_remainder=True)
    dataset = dataset.map(lambda index: (tf.gather(images, index), tf.gather(labels, index)))
    if preprocess is not None:
        dataset = dataset.map(lambda batch, batch_labels: (preprocess(batch), batch_labels))
    return dataset.prefetch(tf.data.AUTOTUNE)


def synthetic(batch_size, image_size, num_classes, seed):
    """One batch of random normal images and labels, generated once and
    repeated forever: measures everything but the input pipeline."""
    images = tf.random.stateless_normal([batch_size, image_size, image_size, 3], [seed, 1])
    labels = tf.random.stateless_uniform(
        [batch_size], [seed, 2], minval=0, maxval=num_classes, dtype=tf.int32
    )
    return tf.data.Dataset.from_tensors((images, labels)).repeat()
