"""The data as the runtime wants it: the training stream of a fit (epochs cut
to their planned steps, a resumed epoch without its done steps), the
evaluation set, and a read failure turned into a line naming the bad record."""

import sys

from keras_lars.tools import input_pipeline
from keras_lars.tools import storage


def train_stream(
    data, length, start_epoch, global_batch_size, skip=0, end_epoch=None, micro_batches=1
):
    """Returns fn(input_context) -> the batches of epochs start_epoch ..
    end_epoch - 1 (default: to the end) in order, each epoch `data.train(epoch)`
    cut to its steps, the first without its first `skip` steps. With
    `micro_batches` = k a step is k batches of global_batch_size / k, in the
    epoch's order, so that the k of a step are the examples of its whole batch."""
    batch = global_batch_size // micro_batches

    def make(input_context):
        local_replicas = input_context.num_replicas_in_sync // input_context.num_input_pipelines
        per_step = local_replicas * micro_batches
        stream = None
        for epoch in range(start_epoch, end_epoch or length.epochs):
            done = skip if epoch == start_epoch else 0
            batches = data.train(epoch, batch, input_context, done * per_step)
            batches = batches.take((length.steps_in(epoch) - done) * per_step)
            stream = batches if stream is None else stream.concatenate(batches)
        return stream

    return make


class _Sized:
    """`config` with another image_size, for input_pipeline.load."""

    def __init__(self, config, image_size):
        self._config, self.image_size = config, image_size

    def __getattr__(self, name):
        return getattr(self._config, name)


def data_at(data, config, image_size):
    """The DataSource of `config` at `image_size` (--image_size_schedule's
    phases): `data` itself at its own size or for None."""
    if image_size is None or image_size == data.image_size:
        return data
    return input_pipeline.load(_Sized(config, image_size))


def evaluation(data, global_batch_size, strategy):
    """(the distributed evaluation set, a list that holds its steps once the
    strategy has made it). Keras gets the steps exactly: left to find the end
    of a dataset from a function, Keras 3.15 evaluated extra batches under
    MirroredStrategy in our runs."""
    steps = []

    def make(context):
        steps.append(data.eval_steps(global_batch_size, context.num_input_pipelines))
        return data.eval(global_batch_size, context)

    dataset = strategy.distribute_datasets_from_function(make)
    return dataset, steps


def read_failed(error):
    """Whether `error` is TensorFlow's for data it could not read (never
    where TensorFlow was not loaded: a JAX-only install)."""
    tf = sys.modules.get("tensorflow")
    read = (tf.errors.InvalidArgumentError, tf.errors.DataLossError) if tf else ()
    return isinstance(error, read)


def explain_data_error(data, config, error):
    """Raises a DataError naming the file and record when reading failed on one."""
    files = data.info.train_files + data.info.eval_files
    if not files:
        return
    print(
        f"reading the data failed ({storage.first_line(error)}); "
        f"looking for the bad record in {len(files)} files...",
        file=sys.stderr,
    )
    bad = input_pipeline.find_bad_record(files, config.label_offset, data.info.num_classes)
    if bad is not None:
        path, index, message = bad
        raise input_pipeline.DataError(f"{path}: record {index}: {message}") from None
