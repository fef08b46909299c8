"""The elementwise tail of the updates, and layer norms, in one place.

Written with keras.ops, every arithmetic operation is one kernel and one pass
over the layer's memory; a momentum step alone is five or six passes.
TensorFlow ships fused kernels that read and write each tensor once (and that
XLA lowers too), so on the TensorFlow backend these functions use them:

    momentum_step, classic:  u = m*u - lr*s;  w = w + u          (ResourceApplyKerasMomentum)
                   Nesterov: w = w + m*u - lr*s
    momentum_step, else:     v = m*v + s;     w = w - lr*v       (ResourceApplyMomentum)
                   Nesterov: w = w - lr*(m*v + s)
    descent_step:            w = w - lr*s                        (ResourceApplyGradientDescent)
    l2_norm:                 sqrt(sum(x^2)) in float32           (l2_loss: one pass)

Every other backend runs the keras.ops formulation of the same equations.
`optimizer` is the calling optimizer: its `assign*` methods are backend-aware.
"""

import keras
from keras import ops

FUSED = keras.backend.backend() == "tensorflow"

if FUSED:
    import tensorflow as tf


def dense(gradient):
    """The gradient as a dense tensor (TF IndexedSlices are scattered out):
    a layer's trust ratio needs its whole norm."""
    return tf.convert_to_tensor(gradient) if FUSED else gradient


def l2_norm(x):
    """||x||, accumulated in float32 whatever the dtype of x."""
    if FUSED:
        return tf.sqrt(2.0 * tf.nn.l2_loss(tf.cast(x, tf.float32)))
    x = ops.cast(x, "float32")
    return ops.sqrt(ops.sum(ops.square(x)))


def descent_step(optimizer, variable, learning_rate, step):
    """w = w - lr * s."""
    if FUSED:
        tf.raw_ops.ResourceApplyGradientDescent(
            var=variable.handle, alpha=learning_rate, delta=step
        )
    else:
        optimizer.assign_sub(variable, learning_rate * step)


def momentum_step(optimizer, variable, buffer, learning_rate, step, momentum, nesterov, classic):
    """Classic: u = m*u - lr*s, w += u.  Otherwise: v = m*v + s, w -= lr*v."""
    if FUSED:
        apply = (
            tf.raw_ops.ResourceApplyKerasMomentum if classic else tf.raw_ops.ResourceApplyMomentum
        )
        apply(
            var=variable.handle,
            accum=buffer.handle,
            lr=learning_rate,
            grad=step,
            momentum=momentum,
            use_nesterov=nesterov,
        )
    elif classic:
        optimizer.assign(buffer, momentum * buffer - learning_rate * step)
        if nesterov:
            optimizer.assign_add(variable, momentum * buffer - learning_rate * step)
        else:
            optimizer.assign_add(variable, buffer)
    else:
        optimizer.assign(buffer, momentum * buffer + step)
        if nesterov:
            optimizer.assign_sub(variable, learning_rate * (momentum * buffer + step))
        else:
            optimizer.assign_sub(variable, learning_rate * buffer)
