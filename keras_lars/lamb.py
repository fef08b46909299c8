"""LAMB: layer-wise adaptive moments (You et al. 2019)."""

import math

import keras
from keras import ops

from keras_lars import kernels
from keras_lars.layerwise import LayerwiseOptimizer
from keras_lars.trust import trust_ratio
from keras_lars.validation import check_number


@keras.saving.register_keras_serializable(package="keras_lars")
class LAMB(LayerwiseOptimizer):
    """Layer-wise Adaptive Moments optimizer for Batch training, arXiv:1904.00962.

    A drop-in for `tfa.optimizers.LAMB` (same argument names, defaults and
    numbers). For each variable w with gradient g at step t:

        m = beta_1 * m + (1 - beta_1) * g
        v = beta_2 * v + (1 - beta_2) * g^2
        r = (m / (1 - beta_1^t)) / (sqrt(v / (1 - beta_2^t)) + epsilon)
        u = r + weight_decay * w
        ratio = ||w|| / ||u||    (1 where ||w|| = 0 or ||u|| = 0;
                                  clipped to `trust_ratio_bounds` if given)
        w = w - lr * ratio * u

    The moments of float16/bfloat16 variables are kept in float32 (v = g^2
    underflows float16 below |g| ~ 8e-3), and their step is computed in
    float32 and rounded once.

    Weight decay sits inside the ratio, unlike Keras 3's own `Lamb`, whose
    decay is decoupled and applied outside it (the two agree only without
    weight decay). Norms are accumulated in float32.

    Args:
        learning_rate: float >= 0 or a `LearningRateSchedule`.
        beta_1: float in [0, 1), first-moment decay.
        beta_2: float in [0, 1), second-moment decay.
        epsilon: float > 0 added to sqrt(v_hat).
        weight_decay: float >= 0, coupled decay inside the ratio.
        exclude_from_weight_decay: list of regular expressions searched in
            `variable.path`; matched variables get no weight decay.
        exclude_from_layer_adaptation: the same for the ratio; None falls
            back to `exclude_from_weight_decay` (as in tensorflow-addons).
        exclude_rank_one: bool, also exclude every variable of rank <= 1 from
            both (False by default, as in tensorflow-addons).
        trust_ratio_bounds: None or (lower, upper) to clip the ratio to.
        record_trust_ratios: bool, keep each adapted variable's last trust
            ratio and norms for `trust_ratio_stats()` and
            `keras_lars.TrustRatioMonitor`.
        **kwargs: Keras's base optimizer arguments, except `weight_decay`.

    Other Parameters:
        allreduce_dtype: None, "float32", "bfloat16" or "float16": the
            precision of the cross-replica gradient sum under a tf.distribute
            strategy (`keras_lars.distribute.all_reduce_in`); None and
            "float32" sum in the gradients' own dtype.
        noise_scale_batch_size: None, or the global batch size of one
            training step (one micro-batch, all replicas together): measure
            the gradient noise scale B_simple (`keras_lars.noise_scale`),
            read with `noise_scale_stats()` or `keras_lars.NoiseScaleMonitor`.
            Needs >= 2 tf.distribute replicas or `gradient_accumulation_steps`.
        noise_scale_decay: float in [0, 1), the decay of the moving averages
            of |G|^2 and tr(Sigma) (0.99 by default).

    With `gradient_accumulation_steps=k` an update averages k micro-batches'
    gradients and equals one step on their whole batch (no batch norm; batch
    norm normalises each micro-batch with its own statistics); t above and a
    `LearningRateSchedule` count applied updates. Not under several
    tf.distribute replicas (ValueError).
    """

    def __init__(
        self,
        learning_rate=0.001,
        beta_1=0.9,
        beta_2=0.999,
        epsilon=1e-6,
        weight_decay=0.0,
        exclude_from_weight_decay=None,
        exclude_from_layer_adaptation=None,
        exclude_rank_one=False,
        trust_ratio_bounds=None,
        record_trust_ratios=False,
        name="LAMB",
        **kwargs,
    ):
        super().__init__(
            learning_rate=learning_rate,
            weight_decay=weight_decay,
            exclude_from_weight_decay=exclude_from_weight_decay,
            exclude_from_layer_adaptation=exclude_from_layer_adaptation,
            exclude_rank_one=exclude_rank_one,
            record_trust_ratios=record_trust_ratios,
            name=name,
            **kwargs,
        )
        self.beta_1 = check_number("beta_1", beta_1, at_least=0.0, below=1.0)
        self.beta_2 = check_number("beta_2", beta_2, at_least=0.0, below=1.0)
        self.epsilon = check_number("epsilon", epsilon, above=0.0)
        if trust_ratio_bounds is not None:
            try:
                lower, upper = trust_ratio_bounds
            except (TypeError, ValueError):
                raise ValueError(
                    "`trust_ratio_bounds` must be None or a pair (lower, upper), "
                    f"received {trust_ratio_bounds!r}."
                ) from None
            lower = check_number("trust_ratio_bounds[0]", lower, at_least=0.0)
            upper = check_number("trust_ratio_bounds[1]", upper, above=lower, finite=False)
            trust_ratio_bounds = (lower, upper)
        self.trust_ratio_bounds = trust_ratio_bounds

    float32_slots = ("m", "v")

    def build(self, variables):
        if self.built:
            return
        super().build(variables)
        self.momentums, self.velocities = self._add_slots(variables, ["m", "v"])

    def update_step(self, gradient, variable, learning_rate):
        index = self._get_variable_index(variable)
        m = self.momentums[index]
        v = self.velocities[index]
        dtype = m.dtype  # float32 for float16/bfloat16 variables
        gradient = ops.cast(kernels.dense(gradient), dtype)
        weights = ops.cast(variable, dtype)
        self.assign_add(m, (gradient - m) * (1 - self.beta_1))
        self.assign_add(v, (ops.square(gradient) - v) * (1 - self.beta_2))

        # r = m_hat / (sqrt(v_hat) + eps) = c * m / (sqrt(v) + eps'), with the
        # bias corrections folded into scalars: c = sqrt(1 - beta_2^t) / (1 -
        # beta_1^t) and eps' = eps * sqrt(1 - beta_2^t).
        t = ops.cast(self.iterations + 1, "float32")
        root = ops.sqrt(one_minus_power(self.beta_2, t))
        c = root / one_minus_power(self.beta_1, t)
        update = m / (ops.sqrt(v) + ops.cast(self.epsilon * root, dtype)) * ops.cast(c, dtype)
        if self._decays[index]:
            update = update + ops.cast(self.weight_decay, dtype) * weights

        scale = 1.0
        if self._adapts[index]:
            weight_norm, update_norm = kernels.l2_norm(weights), kernels.l2_norm(update)
            scale = trust_ratio(weight_norm, update_norm, bounds=self.trust_ratio_bounds)
            self._record_trust_stats(index, scale, weight_norm, update_norm)
        lr = ops.cast(learning_rate, "float32")
        if dtype == variable.dtype:
            kernels.descent_step(self, variable, ops.cast(lr * scale, dtype), update)
        else:  # the new weights are computed in float32 and rounded once
            new_weights = weights - ops.cast(lr * scale, dtype) * update
            self.assign(variable, ops.cast(new_weights, variable.dtype))

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "beta_1": self.beta_1,
                "beta_2": self.beta_2,
                "epsilon": self.epsilon,
                "trust_ratio_bounds": (
                    None if self.trust_ratio_bounds is None else list(self.trust_ratio_bounds)
                ),
            }
        )
        return config


def one_minus_power(beta, t):
    """1 - beta^t in float32 to about one ulp, as -expm1(t * log(beta)) with
    log(beta) taken in float64. `1 - beta**t` computed in float32 loses the
    digits of small 1 - beta (beta_2 = 0.999 is off by 1.3e-5 at t = 1),
    while the moment update uses (1 - beta) exactly: the two would disagree."""
    if beta == 0:
        return ops.ones_like(t)
    return -ops.expm1(t * math.log(beta))
