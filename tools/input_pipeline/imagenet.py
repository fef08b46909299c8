"""tf.data pipelines of ImageNet-format records: one training epoch
(sharded, shuffled and augmented as a pure function of seed and epoch) and
the evaluation examples in file order."""

import tensorflow as tf

from keras_lars.tools.input_pipeline.tfrecord_files import parse_record
from keras_lars.tools.input_pipeline.tfrecord_files import shard_files
from keras_lars.tools.input_pipeline.transforms import preprocess_for_eval
from keras_lars.tools.input_pipeline.transforms import preprocess_for_train

SHUFFLE_BUFFER = 10000


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
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,
    )
    dataset = dataset.shuffle(SHUFFLE_BUFFER, seed=epoch_seed).repeat()
    dataset = dataset.enumerate().skip(skip_batches * batch_size)

    def decode(index, record):
        jpeg, label = parse_record(record, label_offset, num_classes)
        element_seed = _element_seed(seed, epoch, pipeline_id, index)
        return preprocess_for_train(jpeg, image_size, element_seed), label

    dataset = dataset.map(decode, num_parallel_calls=tf.data.AUTOTUNE)
    return dataset.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def imagenet_eval_examples(files, image_size, label_offset, num_classes):
    """This pipeline's evaluation examples (unbatched), in file order."""
    dataset = tf.data.Dataset.from_tensor_slices(list(files))
    dataset = dataset.interleave(
        tf.data.TFRecordDataset,
        cycle_length=min(8, len(files)),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,
    )

    def decode(record):
        jpeg, label = parse_record(record, label_offset, num_classes)
        return preprocess_for_eval(jpeg, image_size), label

    return dataset.map(decode, num_parallel_calls=tf.data.AUTOTUNE)
