"""The variance of synchronized batch norm, in two passes.

Keras's TensorFlow backend computes `BatchNormalization(synchronized=True)`'s
statistics over all replicas in one pass (`_compute_moments_sync`; keras-core
#866 chose the fast form):

    mean = S1 / N,  var = max(S2 / N - mean^2, 0),  S1 = sum x,  S2 = sum x^2

(sums over every replica's batch). In float32 the difference cancels: with
|mean| >> std the variance keeps few or no correct digits (x = 100 + 0.01 z
gives var 0 or a multiple of 2^-10 instead of 1e-4), so a step on several
replicas differs from the same step on one device, which uses tf.nn.moments'
two passes (a small model whose batch norm sees |mean| = 300 std: 3e-3
between 2 replicas and 1 after two steps; 1.3e-5 with the patch, the sums'
order alone). No upstream issue found. The patch computes, as one device does,

    mean = S1 / N,  var = sum (x - mean)^2 / N

with a second all-reduce after the first (three in all, as before: the sum,
the count, the squared deviations). The mean's gradient through var is
stopped, as in tf.nn.moments: d var / d mean = -2 sum (x - mean) / N = 0.
"""

import inspect

from keras_lars.compat._workaround import Workaround
from keras_lars.compat._workaround import swap


def _backend_nn():
    from keras.src.backend.tensorflow import nn

    return nn


def install():
    import tensorflow as tf

    nn = _backend_nn()
    one_device = nn._compute_moments
    total = tf.distribute.ReduceOp.SUM

    def two_pass_moments_sync(x, axes, keepdims):
        context = tf.distribute.get_replica_context()
        if not context:
            return one_device(x, axes, keepdims)
        count = context.all_reduce(total, tf.reduce_sum(tf.ones_like(x), axes, keepdims=True))
        mean = tf.math.divide_no_nan(
            context.all_reduce(total, tf.reduce_sum(x, axes, keepdims=True)), count
        )
        squares = tf.reduce_sum(
            tf.math.squared_difference(x, tf.stop_gradient(mean)), axes, keepdims=True
        )
        variance = tf.math.divide_no_nan(context.all_reduce(total, squares), count)
        if not keepdims:
            mean, variance = tf.squeeze(mean, axes), tf.squeeze(variance, axes)
        return mean, variance

    return swap(nn, "_compute_moments_sync", two_pass_moments_sync)


def shape():
    nn = _backend_nn()
    for name in ("_compute_moments_sync", "_compute_moments"):
        target = getattr(nn, name, None)
        if target is None:
            return f"keras.src.backend.tensorflow.nn.{name} does not exist"
        found = list(inspect.signature(target).parameters)
        if found != ["x", "axes", "keepdims"]:
            return f"nn.{name} takes ({', '.join(found)}), expected (x, axes, keepdims)"
    if "_compute_moments_sync(x, axes, keepdims)" not in inspect.getsource(nn.moments):
        return "nn.moments no longer calls _compute_moments_sync(x, axes, keepdims)"
    return None


WORKAROUND = Workaround(
    "sync_batch_norm_variance",
    "no upstream issue found (the one-pass form is keras-core#866's choice)",
    "BatchNormalization(synchronized=True) under several replicas: the variance "
    "E[x^2] - E[x]^2 cancels in float32, so a step differs from one device's",
    "behaviour",
    install,
    shape,
    reproduced="Keras 3.8.0 / TF 2.17.1 and Keras 3.15.1 / TF 2.21 (tests/test_compat.py)",
)
