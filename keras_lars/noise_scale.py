"""The gradient noise scale B_simple (McCandlish et al. 2018, arXiv:1812.06162).

For the mean gradient G_b of b examples drawn from a data set with true
gradient G and per-example covariance Sigma,

    E[|G_b|^2] = |G|^2 + tr(Sigma) / b,

so two squared norms taken at the same weights, N_small at batch b and
N_big at batch B > b, give unbiased estimates (the paper's appendix A.1):

    |G|^2     ~ (B * N_big - b * N_small) / (B - b)
    tr(Sigma) ~ (N_small - N_big) / (1/b - 1/B)

and the simple noise scale, the batch size beyond which larger batches
stop paying off, is

    B_simple = tr(Sigma) / |G|^2.

With S small gradients g_1..g_S of b examples each whose mean is the big
one (B = S * b), N_small = mean_s |g_s|^2 and N_big = |mean_s g_s|^2.

The two estimates are very noisy step to step (|G|^2 can come out
negative), and the ratio of noisy estimates is biased, so each estimate is
smoothed separately with an exponential moving average and B_simple is the
ratio of the averages (as in the paper). The averages start at 0 and are
bias-corrected like Adam's moments, avg_t / (1 - decay^t) after t
measurements, so that the first readings are not pulled towards 0; the
correction cancels in B_simple.

The optimizers measure it without an extra forward or backward pass (see
`NoiseScaleEstimator` for where the two gradient sizes come from), and
`NoiseScaleMonitor` puts the readings into the training logs. Beside the
averages the estimator keeps raw sums since their last reset
(`NoiseScaleEstimator.interval_stats`): B_simple of a recent interval, with no
lag from before it, and its standard error (`interval_noise_scale`), which
`keras_lars.AdaptiveBatchSize` acts on.
`measure_noise_scale` measures it at fixed weights instead, from many
micro-batches and with a confidence interval: no moving average, no lag.
"""

import dataclasses
import inspect
import math
import statistics

import keras
import numpy as np
from keras import ops

from keras_lars import _internals
from keras_lars._internals import KERAS_VERIFIED
from keras_lars.validation import check_integer
from keras_lars.validation import check_number

# The keys of `NoiseScaleEstimator.stats()` and of the logs `NoiseScaleMonitor` fills.
LOG_KEYS = ("noise_scale", "noise_scale_gradient_sq", "noise_scale_trace")
# With `NoiseScaleMonitor(interval=True)`: the epoch's own B_simple and its standard error.
INTERVAL_LOG_KEYS = {
    "noise_scale": "noise_scale_interval",
    "standard_error": "noise_scale_interval_error",
}
# What the interval sums hold, in order, over the n measurements since their reset.
INTERVAL_SUMS = ("count", "gradient_sq", "trace", "gradient_sq_sq", "trace_sq", "product")


# --- pure estimators (numpy, Python floats or keras tensors) ---------------
def squared_norm(tensors):
    """sum_i |t_i|^2 over a list of tensors (None skipped), in float32."""
    return sum(ops.sum(ops.square(ops.cast(t, "float32"))) for t in tensors if t is not None)


def gradient_norm_sq_estimate(small_norm_sq, big_norm_sq, small_batch, big_batch):
    """Unbiased |G|^2 from N_small at batch b and N_big at batch B > b:

    |G|^2 ~ (B * N_big - b * N_small) / (B - b)
    """
    return (big_batch * big_norm_sq - small_batch * small_norm_sq) / (big_batch - small_batch)


def trace_estimate(small_norm_sq, big_norm_sq, small_batch, big_batch):
    """Unbiased tr(Sigma), the summed per-example gradient variance:

    tr(Sigma) ~ (N_small - N_big) / (1/b - 1/B)
    """
    return (small_norm_sq - big_norm_sq) / (1.0 / small_batch - 1.0 / big_batch)


def simple_noise_scale(gradient_norm_sq, trace):
    """B_simple = tr(Sigma) / |G|^2 (in examples)."""
    return trace / gradient_norm_sq


def interval_noise_scale(sums):
    """B_simple of n measurements (g_i, t_i) of |G|^2 and tr(Sigma), from the
    sums (n, sum g, sum t, sum g^2, sum t^2, sum g*t) (`INTERVAL_SUMS`):

        B = sum t / sum g                          (the ratio of the means)
        se(B) = sqrt(sum (t_i - B g_i)^2 / (n (n - 1))) / |mean g|

    (the delta method's standard error of a ratio of means; the residuals
    t_i - B g_i sum to 0). Returns {"noise_scale", "standard_error",
    "gradient_sq", "trace", "count"} (floats): B is nan where sum g <= 0
    (the true gradient not resolved), the error nan below 2 measurements."""
    n, g, t, gg, tt, gt = (float(value) for value in sums)
    gradient_sq = g / n if n else float("nan")
    trace = t / n if n else float("nan")
    scale = error = float("nan")
    if n and g > 0:
        scale = t / g
        if n >= 2:
            residual = max(0.0, tt - 2.0 * scale * gt + scale * scale * gg)
            error = math.sqrt(residual / (n * (n - 1))) / gradient_sq
    return {
        "noise_scale": scale,
        "standard_error": error,
        "gradient_sq": gradient_sq,
        "trace": trace,
        "count": int(n),
    }


def ema_update(average, value, decay):
    """avg <- decay * avg + (1 - decay) * value."""
    return decay * average + (1.0 - decay) * value


def debiased(average, decay, count):
    """avg_t / (1 - decay^t) after t >= 1 updates from 0 (Adam's bias
    correction); nan before the first."""
    return average / (1.0 - decay**count) if count > 0 else float("nan")


# --- measurement inside the optimizers --------------------------------------
class NoiseScaleEstimator:
    """The noise-scale state of one optimizer and the hooks that feed it.

    Where the two gradient sizes come from, with `batch_size` m the global
    batch of one training step (what `model.fit` is given: one micro-batch,
    all replicas together) and k = `gradient_accumulation_steps`:

    - under a tf.distribute strategy with R >= 2 replicas (TensorFlow
      backend; MirroredStrategy, MultiWorkerMirroredStrategy): small = each
      replica's gradient (batch b = m/R; Keras's scale_loss divides each
      replica's loss by R, so it is R times the partial gradient the
      optimizer sees), big = their all-reduced mean (B = m). Measured in the
      optimizer's cross-replica sum, with one scalar all-reduce more for
      mean_r |g_r|^2. (Keras cannot accumulate under these strategies: see
      `LayerwiseOptimizer._check_accumulation`.)
    - on one device with `gradient_accumulation_steps` = k >= 2 (TensorFlow
      without a strategy or under OneDeviceStrategy; JAX): small = each
      micro-batch's gradient (b = m), big = their mean at the update step
      (B = k*m). |g_j|^2 is summed into a variable at each micro-batch.

    One device without accumulation has one gradient size only: there it
    raises ValueError. The loss must be a mean over the batch (Keras's
    default "sum_over_batch_size"), so that a gradient is a mean of
    per-example gradients.

    Five float32 optimizer variables hold the state (saved in checkpoints; a
    resumed run goes on exactly): the number of measurements t, the two
    moving averages (not yet bias-corrected), the micro-batch sum of |g_j|^2,
    and the raw interval sums (`INTERVAL_SUMS`, since the last
    `interval_stats(reset=True)`). `stats()` reads the bias-corrected values.
    """

    def __init__(self, batch_size, decay):
        self.batch_size = check_integer("noise_scale_batch_size", batch_size, at_least=1)
        self.decay = check_number("noise_scale_decay", decay, at_least=0.0, below=1.0)
        self.count = self.gradient_sq = self.trace = self.small_sum = self.sums = None

    def check_backend(self, accumulation_steps):
        """Refuses the backends (and set-ups) where it cannot be measured."""
        backend = keras.backend.backend()
        if backend not in ("tensorflow", "jax"):
            raise ValueError(
                f"`noise_scale_batch_size` is measured on the TensorFlow and JAX backends, "
                f"not on {backend!r}."
            )
        if backend == "jax" and not accumulation_steps:
            raise ValueError(
                "`noise_scale_batch_size` on the JAX backend needs "
                "`gradient_accumulation_steps` >= 2: the noise scale compares the "
                "micro-batches' gradients with their mean."
            )
        reason = _internals.problem("keras", KERAS_VERIFIED, _shape)
        if reason:
            raise _internals.UnsupportedVersionError(
                f"`noise_scale_batch_size` hooks into Keras's optimizer, but {reason}. "
                f"Use {_internals.describe_versions('keras', KERAS_VERIFIED)}."
            )

    def check_replicas(self, accumulation_steps, replicas):
        """Refuses one replica without accumulation (one gradient size)."""
        if not accumulation_steps and replicas < 2:
            raise ValueError(
                "`noise_scale_batch_size` needs two gradient sizes at the same weights, but "
                "this optimizer sees one gradient per update: set "
                "`gradient_accumulation_steps` >= 2, or train under a tf.distribute "
                "strategy with >= 2 replicas."
            )

    def build(self, optimizer):
        def scalar(name, shape=()):
            return optimizer.add_variable(
                shape=shape,
                initializer="zeros",
                dtype="float32",
                aggregation="only_first_replica",
                name=name,
            )

        self.count = scalar("noise_scale_count")
        self.gradient_sq = scalar("noise_scale_gradient_sq_average")
        self.trace = scalar("noise_scale_trace_average")
        self.small_sum = scalar("noise_scale_micro_batch_norm_sq_sum")
        self.sums = scalar("noise_scale_interval_sums", (len(INTERVAL_SUMS),))

    def _record(self, measured, small_norm_sq, big_norm_sq, small_batch, big_batch):
        """Moves the averages where `measured` (a boolean tensor) is true."""
        gradient_sq = gradient_norm_sq_estimate(small_norm_sq, big_norm_sq, small_batch, big_batch)
        trace = trace_estimate(small_norm_sq, big_norm_sq, small_batch, big_batch)
        for variable, value in ((self.gradient_sq, gradient_sq), (self.trace, trace)):
            variable.assign(
                ops.where(measured, ema_update(variable.value, value, self.decay), variable.value)
            )
        self.count.assign(self.count.value + ops.cast(measured, "float32"))
        terms = ops.stack(
            [ops.ones((), "float32"), gradient_sq, trace]
            + [gradient_sq * gradient_sq, trace * trace, gradient_sq * trace]
        )
        self.sums.assign(ops.where(measured, self.sums.value + terms, self.sums.value))

    def on_micro_batch(self, optimizer, grads, trainable_variables):
        """Called by the optimizer's `_backend_apply_gradients` with each
        micro-batch's gradients, before Keras adds them to its accumulators
        (`_accumulated_gradients`, the sum of this update's earlier ones)."""
        steps = optimizer.gradient_accumulation_steps
        small_sum = self.small_sum.value + squared_norm(grads)
        is_update = ops.equal((optimizer._iterations + 1) % steps, 0)
        accumulated = [
            optimizer._accumulated_gradients[optimizer._get_variable_index(v)]
            for v in trainable_variables
        ]

        def big_norm_sq():
            return squared_norm(
                [(g + ops.convert_to_tensor(a)) / steps for g, a in zip(grads, accumulated)]
            )

        big = ops.cond(is_update, big_norm_sq, lambda: ops.zeros((), "float32"))
        m = float(self.batch_size)
        self._record(is_update, small_sum / steps, big, m, steps * m)
        self.small_sum.assign(ops.where(is_update, ops.zeros_like(small_sum), small_sum))

    def on_all_reduce(self, optimizer, local_grads, reduced_grads):
        """Called in replica context with one replica's gradients (each
        g_r / R) and their all-reduced sum (the update's mean gradient)."""
        replicas = _internals.replicas_in_sync()
        local = squared_norm(local_grads) * float(replicas**2)  # |g_r|^2
        small = _sum_over_replicas(local) / replicas
        big = squared_norm(reduced_grads)
        global_batch = float(self.batch_size)
        self._record(True, small, big, global_batch / replicas, global_batch)

    def stats(self):
        """{"noise_scale": B_simple, "noise_scale_gradient_sq": |G|^2,
        "noise_scale_trace": tr(Sigma)} from the bias-corrected averages
        (Python floats; nan before the first measurement)."""
        count = float(ops.convert_to_numpy(self.count))
        gradient_sq = debiased(float(ops.convert_to_numpy(self.gradient_sq)), self.decay, count)
        trace = debiased(float(ops.convert_to_numpy(self.trace)), self.decay, count)
        if math.isnan(gradient_sq) or gradient_sq == 0:
            scale = float("nan")
        else:
            scale = simple_noise_scale(gradient_sq, trace)
        return dict(zip(LOG_KEYS, (scale, gradient_sq, trace)))

    def interval_stats(self, reset=False):
        """`interval_noise_scale` of the raw measurements since the last
        reset (or the start): B_simple of that interval alone, with its
        standard error; `reset=True` then zeroes the sums (call it from
        outside the train step, e.g. in a callback)."""
        found = interval_noise_scale(ops.convert_to_numpy(self.sums))
        if reset:
            self.sums.assign(ops.zeros_like(self.sums.value))
        return found


def _sum_over_replicas(value):
    """The sum of a scalar over the replicas (replica context, TensorFlow)."""
    import tensorflow as tf

    context = tf.distribute.get_replica_context()
    return context.all_reduce(tf.distribute.ReduceOp.SUM, value)


def _shape():
    """None if Keras's optimizer still has what the measurement and the
    accumulated schedule rely on, else what differs: `_backend_apply_gradients`
    sees each micro-batch's gradients, `_accumulated_gradients` holds their sum
    so far, `_iterations` counts micro-batches (verified on Keras 3.8.0 and 3.15.1)."""
    checks = [
        (keras.optimizers.Optimizer, "_backend_apply_gradients", None),
        (keras.optimizers.Optimizer, "_get_current_learning_rate", ["self"]),
        (keras.optimizers.Optimizer, "_get_variable_index", ["self", "variable"]),
    ]
    if keras.backend.backend() == "tensorflow":
        from keras.src.backend.tensorflow.optimizer import TFOptimizer

        checks.append((TFOptimizer, "_all_reduce_sum_gradients", ["self", "grads_and_vars"]))
    found = _internals.first_mismatch(*checks)
    if found:
        return found
    from keras.src.optimizers.base_optimizer import BaseOptimizer

    if "_accumulated_gradients" not in inspect.getsource(BaseOptimizer.build):
        return "BaseOptimizer.build no longer creates `_accumulated_gradients`"
    return None


# --- logs ------------------------------------------------------------------
@keras.saving.register_keras_serializable(package="keras_lars")
class NoiseScaleMonitor(keras.callbacks.Callback):
    """Puts the optimizer's smoothed noise-scale readings into the logs.

    At each epoch end (and, with `every_batch=True`, at each batch end) it
    adds three keys, so that the fit history, `keras.callbacks.TensorBoard`
    (list this callback before it) and CSVLogger get them:

        noise_scale              B_simple = tr(Sigma) / |G|^2, in examples
        noise_scale_gradient_sq  |G|^2, the squared norm of the true gradient
        noise_scale_trace        tr(Sigma), the summed per-example variance

    These are moving averages (decay `noise_scale_decay`): they lag, weighted
    toward earlier epochs. With `interval=True` each epoch end also adds

        noise_scale_interval        B_simple of this epoch's updates alone
        noise_scale_interval_error  its standard error

    (`NoiseScaleEstimator.interval_stats`, whose sums it resets: not with a
    callback that reads and resets them itself, such as the training tool's
    adaptive batch; a key is left out where its value is nan: |G|^2 <= 0 or
    fewer than 2 measurements).

    The optimizer (`keras_lars.LARS` / `LAMB`, possibly inside a
    `LossScaleOptimizer`) must be constructed with `noise_scale_batch_size`.
    Reading the values syncs with the device: `every_batch=True` costs a
    little each step.
    """

    def __init__(self, every_batch=False, interval=False):
        super().__init__()
        for name, value in (("every_batch", every_batch), ("interval", interval)):
            if not isinstance(value, bool):
                raise ValueError(f"`{name}` must be True or False, received {value!r}.")
        self.every_batch = every_batch
        self.interval = interval

    def _estimator(self):
        optimizer = getattr(self.model.optimizer, "inner_optimizer", self.model.optimizer)
        estimator = getattr(optimizer, "noise_scale_estimator", None)
        if estimator is None:
            raise ValueError(
                f"NoiseScaleMonitor needs a keras_lars.LARS or LAMB optimizer constructed "
                f"with `noise_scale_batch_size`, received {type(optimizer).__name__} "
                f"{getattr(optimizer, 'name', '')!r}."
            )
        return estimator

    def on_train_begin(self, logs=None):
        self._estimator()

    def on_train_batch_end(self, batch, logs=None):
        if self.every_batch and logs is not None:
            logs.update(self._estimator().stats())

    def on_epoch_end(self, epoch, logs=None):
        estimator = self._estimator()
        found = estimator.interval_stats(reset=True) if self.interval else {}
        if logs is not None:
            logs.update(estimator.stats())
            for name, key in INTERVAL_LOG_KEYS.items() if self.interval else ():
                if math.isfinite(found[name]):
                    logs[key] = found[name]

    def get_config(self):
        return {"every_batch": self.every_batch, "interval": self.interval}


# --- at fixed weights ------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class NoiseScaleMeasurement:
    """What `measure_noise_scale` found (see there). Attributes:

    noise_scale: B_simple = trace / gradient_sq, in examples.
    gradient_sq, trace: |G|^2 and tr(Sigma), the means of the groups' estimates.
    interval: (low, high), B_simple's two-sided `confidence` interval.
    standard_error: B_simple's jackknife standard error.
    small_batch, big_batch: b and B = micro_batches * b.
    small_norm_sq, big_norm_sq: each group's N_small and N_big (numpy arrays).
    indices: the examples of each micro-batch, shape (groups, micro_batches, b).
    """

    noise_scale: float
    gradient_sq: float
    trace: float
    interval: tuple
    standard_error: float
    small_batch: int
    big_batch: int
    small_norm_sq: object
    big_norm_sq: object
    indices: object


def noise_scale_from_norms(small_norm_sq, big_norm_sq, small_batch, big_batch, confidence=0.95):
    """B_simple and its confidence interval from G groups' squared norms
    (sequences of N_small at batch b and N_big at batch B, one pair a group):
    |G|^2 and tr(Sigma) are the means of the groups' unbiased estimates, and
    B_simple their ratio, with the delete-one-group jackknife's standard
    error and a normal interval around it. Needs G >= 2 groups.

    Returns (noise_scale, gradient_sq, trace, (low, high), standard_error)."""
    small = np.asarray(small_norm_sq, dtype="float64")
    big = np.asarray(big_norm_sq, dtype="float64")
    if small.shape != big.shape or small.ndim != 1 or len(small) < 2:
        raise ValueError(
            f"`small_norm_sq` and `big_norm_sq` must be two sequences of one number a group, "
            f"at least 2 groups; received shapes {small.shape} and {big.shape}."
        )
    check_number("confidence", confidence, above=0.0, below=1.0)
    gradient_sq = gradient_norm_sq_estimate(small, big, small_batch, big_batch)
    trace = trace_estimate(small, big, small_batch, big_batch)
    groups = len(small)
    scale = simple_noise_scale(gradient_sq.mean(), trace.mean())
    # Delete-one jackknife of the ratio of means.
    left_out = (trace.sum() - trace) / (gradient_sq.sum() - gradient_sq)
    error = math.sqrt((groups - 1) / groups * float(np.sum((left_out - left_out.mean()) ** 2)))
    z = statistics.NormalDist().inv_cdf(0.5 + confidence / 2)
    interval = (float(scale - z * error), float(scale + z * error))
    return float(scale), float(gradient_sq.mean()), float(trace.mean()), interval, error


def measure_noise_scale(
    model,
    x,
    y,
    loss,
    micro_batch_size,
    micro_batches=8,
    groups=32,
    seed=0,
    confidence=0.95,
    training=False,
):
    """The gradient noise scale B_simple of `model` at its current weights.

    McCandlish et al. 2018 (arXiv:1812.06162, appendix A.1): the mean
    gradient of b examples has E|G_b|^2 = |G|^2 + tr(Sigma) / b, so squared
    norms at two batch sizes b = B_small < B_big = B, taken at the same
    weights, give unbiased estimates of the true gradient's squared norm and
    of the summed per-example variance:

        |G|^2     = (B |G_big|^2 - b |G_small|^2) / (B - b)
        tr(Sigma) = (|G_small|^2 - |G_big|^2) / (1/b - 1/B)
        B_simple  = tr(Sigma) / |G|^2

    Here the weights do not move: each of `groups` groups draws
    `micro_batches` micro-batches of `micro_batch_size` examples of (x, y)
    uniformly with replacement (seeded by `seed`; so the identity above holds
    exactly for the data set's gradient moments), takes each micro-batch's
    gradient g_j, and N_small = mean_j |g_j|^2 at b, N_big = |mean_j g_j|^2
    at B = micro_batches * b. |G|^2 and tr(Sigma) are the means of the
    groups' estimates, B_simple their ratio: no moving average, so no lag
    (unlike the optimizers' `noise_scale_batch_size`, which reads a training
    run's gradients as the weights move). The interval is the delete-one-group
    jackknife's normal interval (`noise_scale_from_norms`).

    Args:
        model: a built Keras model (TensorFlow or JAX backend).
        x: the data set's inputs indexed by example: a numpy array, a list,
            or an object with len() and numpy's indexing by an array of
            indices (which may, e.g., decode images only as they are drawn).
        y: its targets, indexed as `x`.
        loss: a Keras loss (name, function or instance) that averages over the
            batch (Keras's default "sum_over_batch_size"); the model's own
            regularisation losses are not included.
        micro_batch_size: b, at least 1.
        micro_batches: B / b, at least 2.
        groups: independent groups of micro-batches, at least 2.
        seed: the seed of the draw.
        confidence: of the interval, in (0, 1).
        training: the model's call mode (False: batch norm uses its moving
            statistics and dropout is off, so each example's gradient is a
            fixed function of the weights).

    Returns:
        A `NoiseScaleMeasurement`.
    """
    b = check_integer("micro_batch_size", micro_batch_size, at_least=1)
    k = check_integer("micro_batches", micro_batches, at_least=2)
    groups = check_integer("groups", groups, at_least=2)
    x, y = (np.asarray(a) if isinstance(a, (list, tuple)) else a for a in (x, y))
    if len(x) != len(y) or not len(x):
        raise ValueError(
            f"`x` and `y` must hold the same number of examples, at least one; received "
            f"{len(x)} and {len(y)}."
        )
    gradient = _gradient_function(model, keras.losses.get(loss), training)
    indices = np.random.default_rng(seed).integers(0, len(x), size=(groups, k, b))
    small, big = [], []
    for group in indices:
        grads = [[np.asarray(g, "float64") for g in gradient(x[i], y[i])] for i in group]
        small.append(np.mean([sum(np.sum(g * g) for g in gs) for gs in grads]))
        mean = [np.mean(parts, axis=0) for parts in zip(*grads)]
        big.append(sum(np.sum(g * g) for g in mean))
    small, big = np.array(small), np.array(big)
    found = noise_scale_from_norms(small, big, b, k * b, confidence)
    return NoiseScaleMeasurement(*found, b, k * b, small, big, indices)


def _gradient_function(model, loss, training):
    """grad(x, y): the gradients of the batch's mean loss(y, model(x)) (a
    loss function's per-example values averaged) with respect to the model's
    trainable variables, at their current values."""
    backend = keras.backend.backend()
    variables = model.trainable_variables
    if backend == "tensorflow":
        import tensorflow as tf

        @tf.function(reduce_retracing=True)
        def gradient(x, y):
            with tf.GradientTape() as tape:
                value = ops.mean(loss(y, model(x, training=training)))
            return tape.gradient(value, variables)

        return gradient
    if backend == "jax":
        import jax

        trainable = [v.value for v in variables]
        non_trainable = [v.value for v in model.non_trainable_variables]

        def value(weights, x, y):
            output, _ = model.stateless_call(weights, non_trainable, x, training=training)
            return ops.mean(loss(y, output))

        jitted = jax.jit(jax.grad(value))
        return lambda x, y: jitted(trainable, x, y)
    raise ValueError(
        f"`measure_noise_scale` runs on the TensorFlow and JAX backends, not on {backend!r}."
    )
