"""keras#19246: steps_per_execution > 1 under (MultiWorker)MirroredStrategy.

Keras runs the steps of one execution inside a `tf.while_loop` as a
`tf.cond` branch, carrying the outputs in an Optional whose element spec it
sets while tracing. With several replicas the traced graph ends up with an
unfed placeholder in that cond: "You must feed a value for placeholder
tensor 'while/cond/Placeholder'". The patch builds the multi-step function
without either: one step, then a while loop whose condition is "another
batch and fewer than steps_per_execution steps" (the cond was redundant
with it) and whose body runs the step, carrying the outputs as plain loop
variables. Single steps and other strategies keep Keras's code.
"""

from keras_lars._internals import first_mismatch
from keras_lars.compat._workaround import REPRODUCED_ON_MATRIX
from keras_lars.compat._workaround import Workaround
from keras_lars.compat._workaround import swap
from keras_lars.compat._workaround import trainer_module


def install():
    import tensorflow as tf

    trainer = trainer_module()
    trainer_class = trainer.TensorFlowTrainer
    original = trainer_class._make_function
    mirrored = (tf.distribute.MirroredStrategy, tf.distribute.MultiWorkerMirroredStrategy)

    def _make_function(self, step_function):
        strategy = self.distribute_strategy
        if self.steps_per_execution == 1 or not isinstance(strategy, mirrored):
            return original(self, step_function)

        def one_step_on_data(data):
            outputs = strategy.run(step_function, args=(data,))
            return trainer.reduce_per_replica(outputs, strategy, reduction="auto")

        if not self.run_eagerly:
            one_step_on_data = tf.function(
                one_step_on_data, reduce_retracing=True, jit_compile=self.jit_compile
            )
        if hasattr(self, "_autoconvert_optionals"):  # Keras 3.12+ does this too
            one_step_on_data = self._autoconvert_optionals(one_step_on_data)

        def multi_step_on_iterator(iterator):
            steps = self.steps_per_execution

            def next_or_empty(step, current):
                """The next batch as an Optional; empty once `steps` ran."""
                return tf.cond(
                    step < steps,
                    iterator.get_next_as_optional,
                    lambda: tf.experimental.Optional.empty(current.element_spec),
                )

            # The first step runs outside the loop so that the loop has the
            # outputs' structure; get_next() raises OutOfRangeError (the end
            # of the epoch for Keras) when no worker has data left.
            outputs = one_step_on_data(iterator.get_next())

            def body(step, outputs, batch):
                outputs = one_step_on_data(batch.get_value())
                return step + 1, outputs, next_or_empty(step + 1, batch)

            _, outputs, _ = tf.while_loop(
                lambda step, outputs, batch: batch.has_value(),
                body,
                (tf.constant(1), outputs, iterator.get_next_as_optional()),
            )
            return outputs

        if not self.run_eagerly:
            multi_step_on_iterator = tf.function(
                multi_step_on_iterator, reduce_retracing=True, autograph=False
            )

        def function(iterator):
            if isinstance(iterator, (tf.data.Iterator, tf.distribute.DistributedIterator)):
                return multi_step_on_iterator(iterator)
            for _, data in zip(range(self.steps_per_execution), iterator):
                outputs = one_step_on_data(data)
            return outputs

        return function

    return swap(trainer_class, "_make_function", _make_function)


def shape():
    trainer = trainer_module()
    return first_mismatch(
        (trainer.TensorFlowTrainer, "_make_function", ["self", "step_function"]),
        (trainer, "reduce_per_replica", ["values", "strategy", "reduction"]),
    )


WORKAROUND = Workaround(
    "steps_per_execution_loop",
    "keras#19246",
    "steps_per_execution > 1 under (MultiWorker)MirroredStrategy: "
    '"You must feed a value for placeholder tensor"',
    "crash",
    install,
    shape,
    reproduced=REPRODUCED_ON_MATRIX,
)
