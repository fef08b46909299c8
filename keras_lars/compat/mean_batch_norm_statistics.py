"""Moving statistics of unsynchronized batch norm under several replicas.

Keras 3 creates a BatchNormalization's moving statistics with aggregation
"none" (keras#20601: Keras 3 creates no on-read variables), so under a
strategy with several replicas and `synchronized=False` each replica
updates its own copy from its own batches: the copies drift apart, and
get_weights(), saving and checkpoints keep replica 0's copy only. TF-Keras 2
created them synchronized on read with aggregation MEAN, and so does the
patch (moving_mean, moving_variance and the renorm statistics of layers
built under a strategy with more than one replica; `synchronized=True`
layers, whose copies are equal anyway, and single-replica builds are left
alone).

Semantics: in a training step replica r updates its own copy m_r as on one
device, with no communication:

    m_r <- momentum * m_r + (1 - momentum) * mean(batch_r)

Reading from outside the steps (get_weights, numpy(), saving .keras /
.weights.h5, tf.train.Checkpoint) gives (1/R) sum_r m_r, which (the update
being linear) is the moving average of the replicas' mean batch statistics.
Assigning or restoring from outside sets every copy to the value.
`evaluate()` and `predict()` first set every copy to that mean, so that
they use the statistics a saved model has (TF-Keras 2 used each replica's
copy there, cf. tensorflow#46488); this leaves the mean, and so training,
unchanged. Under MultiWorkerMirroredStrategy reading the mean is a
collective: every worker must save (read) together, as the chief-aware
savers of keras_lars do.
"""

import functools
import inspect

import keras

from keras_lars._internals import first_mismatch
from keras_lars.compat._workaround import REPRODUCED_ON_MATRIX
from keras_lars.compat._workaround import Workaround
from keras_lars.compat._workaround import swap
from keras_lars.compat._workaround import trainer_module

_STATISTICS = ("moving_mean", "moving_variance", "moving_stddev", "renorm_mean", "renorm_stddev")


def install():
    import tensorflow as tf
    from keras.src.layers.normalization.batch_normalization import BatchNormalization

    original = BatchNormalization.build

    def on_read(next_creator, **kwargs):
        if kwargs.get("name") in _STATISTICS:
            kwargs["synchronization"] = tf.VariableSynchronization.ON_READ
            kwargs["aggregation"] = tf.VariableAggregation.MEAN
        return next_creator(**kwargs)

    def build(self, input_shape):
        if self.synchronized or tf.distribute.get_strategy().num_replicas_in_sync == 1:
            return original(self, input_shape)
        with tf.variable_creator_scope(on_read):
            original(self, input_shape)
        for name in _STATISTICS:  # Keras's own record (and a deferred creation) agree
            variable = getattr(self, name, None)
            if variable is not None:
                variable._synchronization, variable._aggregation = "on_read", "mean"

    def statistics(model):
        for layer in model._flatten_layers():
            if isinstance(layer, BatchNormalization):
                for name in _STATISTICS:
                    variable = getattr(layer, name, None)
                    # `_synchronization`: set by build() above (Keras 3.8 has no
                    # Variable.synchronization; 3.10+ reads this attribute).
                    if getattr(variable, "_synchronization", None) == "on_read":
                        yield variable

    def averaging_copies_first(run):
        @functools.wraps(run)
        def method(self, *args, **kwargs):
            for variable in statistics(self):  # read: the mean; assign: every copy
                variable.assign(variable.value.read_value())
            return run(self, *args, **kwargs)

        return method

    trainer_class = trainer_module().TensorFlowTrainer
    undo = [swap(BatchNormalization, "build", build)]
    for name in ("evaluate", "predict"):
        method = averaging_copies_first(getattr(trainer_class, name))
        undo.append(swap(trainer_class, name, method))

    def undo_all():
        for step in reversed(undo):
            step()

    return undo_all


def shape():
    from keras.src.layers.normalization.batch_normalization import BatchNormalization

    trainer_class = trainer_module().TensorFlowTrainer
    if "synchronized" not in inspect.signature(BatchNormalization.__init__).parameters:
        return "BatchNormalization takes no `synchronized` argument"
    if not hasattr(keras.Model, "_flatten_layers"):
        return "Model._flatten_layers does not exist"
    return first_mismatch(
        (BatchNormalization, "build", ["self", "input_shape"]),
        (trainer_class, "evaluate", None),
        (trainer_class, "predict", None),
    )


WORKAROUND = Workaround(
    "mean_batch_norm_statistics",
    "keras#20601 (Keras 3 creates no on-read variables); no BatchNormalization issue found",
    "BatchNormalization(synchronized=False) under several replicas: each replica keeps "
    "its own moving statistics, get_weights()/saving keep replica 0's",
    "behaviour",
    install,
    shape,
    reproduced=REPRODUCED_ON_MATRIX,
)
