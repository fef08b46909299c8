"""keras#21054: metric state under several replicas (Keras < 3.10).

Keras before 3.10 creates a metric's state variables (totals, counts) with
the default synchronization, so under several replicas each replica's
update is merged into every copy and the losses and metrics that fit() and
evaluate() report are wrong (evaluate gives another loss and accuracy than
on one device, with the same weights). Keras 3.10 creates them on-read:
replica r accumulates its own part s_r, and a read from outside returns

    s = sum_r s_r

So does the patch, through a variable creator around `Metric.add_variable`
(and around the later creation of a variable whose creation Keras defers,
as for compiled metrics).
"""

from keras_lars._internals import first_mismatch
from keras_lars.compat._workaround import Workaround
from keras_lars.compat._workaround import swap


def install():
    import tensorflow as tf
    from keras.src.metrics.metric import Metric

    original = Metric.add_variable

    def on_read(next_creator, **kwargs):
        kwargs["synchronization"] = tf.VariableSynchronization.ON_READ
        return next_creator(**kwargs)

    def add_variable(self, *args, **kwargs):
        with tf.variable_creator_scope(on_read):
            variable = original(self, *args, **kwargs)
        if variable._value is None:  # deferred: created on first use
            initialize = variable._initialize

            def initialize_on_read(value):
                with tf.variable_creator_scope(on_read):
                    return initialize(value)

            variable._initialize = initialize_on_read
        return variable

    return swap(Metric, "add_variable", add_variable)


def shape():
    from keras.src.backend.tensorflow.core import Variable
    from keras.src.metrics.metric import Metric

    return first_mismatch(
        (Metric, "add_variable", ["self", "shape", "initializer", "dtype", "aggregation", "name"]),
        (Variable, "_initialize", ["self", "value"]),
    )


WORKAROUND = Workaround(
    "on_read_metric_variables",
    "keras#21054",
    "losses and metrics that fit()/evaluate() report under several replicas differ "
    "from one device's (the replicas' metric states are merged on every update)",
    "behaviour",
    install,
    shape,
    fixed_in=(3, 10),
    verified=((3, 8), (3, 9)),
    reproduced="Keras 3.8 with TensorFlow 2.17 and 2.18 (tests), 3.9.2 with TensorFlow "
    "2.18.1 (by hand); absent from 3.10 on",
)
