"""TPU readiness without a TPU: a LARS or LAMB training step (forward,
backward, schedule, optimizer and metrics) compiles as one XLA computation and
holds no host op; the check itself rejects a numpy callback."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_lars
from tests import multiworker_worker as worker

# --- TPU readiness without a TPU ---------------------------------------------
HOST_OPS = {"PyFunc", "PyFuncStateless", "EagerPyFunc", "NumpyFunction", "Print", "PrintV2"}


def _op_types(graph):
    """Op types of a graph and of every function in its library."""
    graph_def = graph.as_graph_def()
    types = {node.op for node in graph_def.node}
    for function in graph_def.library.function:
        types |= {node.op for node in function.node_def}
    return types


@pytest.mark.parametrize("optimizer", ["LARS", "LAMB"])
def test_train_step_compiles_with_xla_and_has_no_host_ops(optimizer):
    schedule = keras_lars.WarmupPolyDecay(
        peak_learning_rate=0.5, warmup_steps=2, total_steps=8, end_learning_rate=0.01
    )
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((5,)),
            keras.layers.Dense(8),
            keras.layers.BatchNormalization(),
            keras.layers.Activation("relu"),
            keras.layers.Dense(3),
        ]
    )
    model.compile(
        optimizer=getattr(keras_lars, optimizer)(schedule, weight_decay=1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        jit_compile=True,
    )
    x, y = worker.make_data()
    history = model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    assert int(model.optimizer.iterations.numpy()) == 8

    # The whole step (forward, backward, schedule, optimizer, metrics) as
    # one XLA computation: lowering to HLO fails on any op XLA cannot compile.
    step = tf.function(model.train_step, jit_compile=True)
    batch = (tf.constant(x[:16]), tf.constant(y[:16]))
    assert "HloModule" in step.experimental_get_compiler_ir(batch)(stage="hlo")
    assert not _op_types(step.get_concrete_function(batch).graph) & HOST_OPS


def test_xla_check_rejects_a_host_op():
    """The checks above can fail: a numpy callback is a host op XLA rejects."""
    step = tf.function(lambda v: tf.numpy_function(np.sin, [v], tf.float32), jit_compile=True)
    value = tf.constant([1.0])
    assert _op_types(step.get_concrete_function(value).graph) & HOST_OPS
    with pytest.raises(Exception, match="(?i)compil|xla|supported"):
        step.experimental_get_compiler_ir(value)(stage="hlo")
