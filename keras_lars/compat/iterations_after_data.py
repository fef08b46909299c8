"""optimizer.iterations counted once more at the end of a finite dataset.

When a dataset of unknown cardinality (a filter, TFRecordDataset, ...) ends,
Keras learns it from the OutOfRangeError of `get_next()` in the train
function. The step's ops that do not depend on the batch, above all the
optimizer's `iterations.assign_add(1)`, may already have run by then (the
step function is inlined into the one that calls `get_next`): the count
gains one per epoch though no update is applied, and a learning-rate
schedule runs one step ahead per epoch:

    iterations after E epochs of B batches = E * (B + 1)   (instead of E * B)

This concerns every strategy with steps_per_execution=1, and the first step
of each execution of `steps_per_execution_loop` (Keras's own loop for
steps_per_execution > 1 reads batches as Optionals and is exact). The patch
runs the train step under a control dependency on the batch's tensors, so
that nothing of a step runs without its batch. Only the scheduling changes;
the numbers a step computes do not.
"""

from keras_lars._internals import first_mismatch
from keras_lars.compat._workaround import REPRODUCED_ON_MATRIX
from keras_lars.compat._workaround import Workaround
from keras_lars.compat._workaround import swap
from keras_lars.compat._workaround import trainer_module


def install():
    import tensorflow as tf

    trainer_class = trainer_module().TensorFlowTrainer

    def free_of_data(next_creator, **kwargs):
        # A variable that the first trace creates (Keras builds the optimizer
        # there: its slots) must not depend on the batch, or tf.function
        # cannot lift it out of the step, and a jit-compiled step fails ("We
        # failed to lift variable creations"; Keras 3.8.0 and 3.15.1).
        with tf.control_dependencies(None):
            return next_creator(**kwargs)

    def make_train_function(self, force=False):
        if self.train_function is not None and not force:
            return self.train_function
        train_step = self.train_step

        def step_after_data(data):
            tensors = [t for t in tf.nest.flatten(data, expand_composites=True) if tf.is_tensor(t)]
            with tf.control_dependencies(tensors), tf.variable_creator_scope(free_of_data):
                return train_step(data)

        self.train_function = self._make_function(step_after_data)
        return self.train_function

    return swap(trainer_class, "make_train_function", make_train_function)


def shape():
    trainer_class = trainer_module().TensorFlowTrainer
    return first_mismatch(
        (trainer_class, "make_train_function", ["self", "force"]),
        (trainer_class, "_make_function", ["self", "step_function"]),
    )


WORKAROUND = Workaround(
    "iterations_after_data",
    "no upstream issue found",
    "a dataset of unknown cardinality: optimizer.iterations (and the learning-rate "
    "schedule) one step ahead per epoch",
    "behaviour",
    install,
    shape,
    reproduced=REPRODUCED_ON_MATRIX,
)
