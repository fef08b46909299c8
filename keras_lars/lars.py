"""LARS: layer-wise adaptive rate scaling (You, Gitman, Ginsburg 2017)."""

import keras
from keras import ops

from keras_lars import kernels
from keras_lars.layerwise import LayerwiseOptimizer
from keras_lars.trust import trust_ratio
from keras_lars.validation import check_bool
from keras_lars.validation import check_number

TRUST_DENOMINATORS = ("sum_of_norms", "norm_of_sum", "update_norm")


@keras.saving.register_keras_serializable(package="keras_lars")
class LARS(LayerwiseOptimizer):
    """Layer-wise Adaptive Rate Scaling, arXiv:1708.03888.

    For each variable w with gradient g, global rate lr, momentum m,
    weight decay beta and trust coefficient eta (the paper's default form):

        ratio = eta * ||w|| / (||g|| + beta * ||w|| + epsilon)
        v = m * v + lr * ratio * (g + beta * w)
        w = w - v

    Options:

    - `trust_denominator="norm_of_sum"`: `ratio = eta*||w|| / (||g + beta*w|| + eps)`
      (tensorflow/models and optax).
    - `classic_momentum=False`: the rate outside the buffer (timm):
      `v = m*v + ratio*(g + beta*w); w = w - lr*v`.
    - `classic_momentum=False, trust_denominator="update_norm"`: the ratio
      of the momentum update (tensorflow/models' `classic_momentum=False`
      mode): `v = m*v + (g + beta*w); u = v` (Nesterov:
      `u = m*v + (g + beta*w)`); `ratio = eta*||w|| / (||u|| + eps)`;
      `w = w - lr*ratio*u`.
    - `nesterov=True`: w takes the look-ahead step, `m*v` + (this step's
      term), instead of v.
    - `clip_trust_ratio=True` (LARC "clip" mode, timm's `trust_clip`): the
      local rate is `min(ratio, lr)` instead of `lr * ratio`. Where a norm is 0
      the ratio stays 1 (rate lr); timm then uses min(lr, 1), and LARC also
      skips the weight decay.

    The ratio is 1 where ||w|| = 0 or the gradient norm in the ratio is 0;
    weight decay still applies then. Norms are accumulated in float32.
    Variables excluded from layer adaptation take plain momentum at the
    global rate; by default (`exclude_rank_one=True`) that is every variable
    of rank <= 1 (biases, batch-norm gamma/beta), which also gets no weight
    decay, as in the MLPerf ResNet-50 reference.

    Momentum is kept in Keras's sign convention (a velocity u = -v, so
    w = w + u) when `classic_momentum=True`, and as v when False.
    Sparse gradients are densified: the ratio needs the whole norm.

    Args:
        learning_rate: float >= 0 or a `LearningRateSchedule`: the global
            rate lr. Large-batch recipes use 1-30 (see `keras_lars.recipes`).
        momentum: float in [0, 1). 0 runs without a momentum buffer.
        weight_decay: float >= 0, beta, coupled (inside the ratio and the
            momentum). Not Keras's decoupled decay.
        trust_coefficient: float > 0, eta.
        epsilon: float >= 0 added to the ratio's denominator.
        nesterov: bool, Nesterov momentum.
        classic_momentum: bool, whether lr is inside the momentum buffer.
        trust_denominator: "sum_of_norms" (paper), "norm_of_sum", or
            "update_norm" (needs `classic_momentum=False`).
        clip_trust_ratio: bool, LARC clipping of the local rate to lr.
        exclude_from_weight_decay: list of regular expressions searched in
            `variable.path` ("dense/kernel"); matched variables get no decay.
        exclude_from_layer_adaptation: the same for layer adaptation; None
            falls back to `exclude_from_weight_decay`.
        exclude_rank_one: bool, exclude variables of rank <= 1 from both.
        record_trust_ratios: bool, keep each adapted variable's last trust
            ratio and norms for `trust_ratio_stats()` and
            `keras_lars.TrustRatioMonitor`.
        **kwargs: Keras's base optimizer arguments (`clipnorm`,
            `global_clipnorm`, `use_ema`, `loss_scale_factor`,
            `gradient_accumulation_steps`, ...), except `weight_decay`.

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
    norm normalises each micro-batch with its own statistics and updates its
    moving averages k times); a `LearningRateSchedule` gets the number of
    applied updates. Not under several tf.distribute replicas (ValueError).
    """

    def __init__(
        self,
        learning_rate=1.0,
        momentum=0.9,
        weight_decay=0.0,
        trust_coefficient=0.001,
        epsilon=0.0,
        nesterov=False,
        classic_momentum=True,
        trust_denominator="sum_of_norms",
        clip_trust_ratio=False,
        exclude_from_weight_decay=None,
        exclude_from_layer_adaptation=None,
        exclude_rank_one=True,
        record_trust_ratios=False,
        name="lars",
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
        self.momentum = check_number("momentum", momentum, at_least=0.0, below=1.0)
        self.trust_coefficient = check_number("trust_coefficient", trust_coefficient, above=0.0)
        self.epsilon = check_number("epsilon", epsilon, at_least=0.0)
        if nesterov and self.momentum == 0:
            raise ValueError("`nesterov=True` needs `momentum` > 0, received 0.")
        if trust_denominator not in TRUST_DENOMINATORS:
            raise ValueError(
                f"`trust_denominator` must be one of {TRUST_DENOMINATORS}, "
                f"received {trust_denominator!r}."
            )
        self.nesterov = check_bool("nesterov", nesterov)
        self.classic_momentum = check_bool("classic_momentum", classic_momentum)
        if trust_denominator == "update_norm" and self.classic_momentum:
            raise ValueError(
                "`trust_denominator='update_norm'` needs `classic_momentum=False`: the "
                "ratio is taken from the momentum update, which then holds no rate."
            )
        self.trust_denominator = trust_denominator
        self.clip_trust_ratio = check_bool("clip_trust_ratio", clip_trust_ratio)

    def build(self, variables):
        if self.built:
            return
        super().build(variables)
        self.momentums = []
        if self.momentum > 0:
            (self.momentums,) = self._add_slots(variables, ["momentum"])

    def update_step(self, gradient, variable, learning_rate):
        index = self._get_variable_index(variable)
        dtype = variable.dtype
        gradient = ops.cast(kernels.dense(gradient), dtype)
        lr = ops.cast(learning_rate, "float32")
        beta = self.weight_decay if self._decays[index] else 0.0
        step = gradient + beta * variable if beta else gradient  # g + beta*w

        if self.trust_denominator == "update_norm":
            self._update_norm_step(index, variable, lr, step)
            return
        scale = 1.0  # the layer's rate is lr * scale
        if self._adapts[index]:
            weight_norm = kernels.l2_norm(variable)
            if self.trust_denominator == "sum_of_norms":
                gradient_norm = kernels.l2_norm(gradient)
                denominator = gradient_norm + beta * weight_norm
            else:
                gradient_norm = denominator = kernels.l2_norm(step)
            scale = trust_ratio(
                weight_norm,
                gradient_norm,
                denominator,
                coefficient=self.trust_coefficient,
                epsilon=self.epsilon,
                clip_to_learning_rate=lr if self.clip_trust_ratio else None,
            )
            self._record_trust_stats(index, scale, weight_norm, gradient_norm)

        if self.momentum == 0:
            kernels.descent_step(self, variable, ops.cast(lr * scale, dtype), step)
        elif self.classic_momentum:  # u = m*u - lr*ratio*step; w += u
            kernels.momentum_step(
                self,
                variable,
                self.momentums[index],
                ops.cast(lr * scale, dtype),
                step,
                ops.cast(self.momentum, dtype),
                self.nesterov,
                classic=True,
            )
        else:  # v = m*v + ratio*step; w -= lr*v
            kernels.momentum_step(
                self,
                variable,
                self.momentums[index],
                ops.cast(lr, dtype),
                ops.cast(scale, dtype) * step,
                ops.cast(self.momentum, dtype),
                self.nesterov,
                classic=False,
            )

    def _update_norm_step(self, index, variable, lr, step):
        """v = m*v + s; u = v (Nesterov: m*v + s); w -= lr * ratio(||u||) * u."""
        update = step
        if self.momentum > 0:
            buffer = self.momentums[index]
            momentum = ops.cast(self.momentum, variable.dtype)
            velocity = momentum * buffer + step
            self.assign(buffer, velocity)
            update = momentum * velocity + step if self.nesterov else velocity
        scale = 1.0
        if self._adapts[index]:
            weight_norm, update_norm = kernels.l2_norm(variable), kernels.l2_norm(update)
            scale = trust_ratio(
                weight_norm,
                update_norm,
                coefficient=self.trust_coefficient,
                epsilon=self.epsilon,
                clip_to_learning_rate=lr if self.clip_trust_ratio else None,
            )
            self._record_trust_stats(index, scale, weight_norm, update_norm)
        kernels.descent_step(self, variable, ops.cast(lr * scale, variable.dtype), update)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "momentum": self.momentum,
                "trust_coefficient": self.trust_coefficient,
                "epsilon": self.epsilon,
                "nesterov": self.nesterov,
                "classic_momentum": self.classic_momentum,
                "trust_denominator": self.trust_denominator,
                "clip_trust_ratio": self.clip_trust_ratio,
            }
        )
        return config
