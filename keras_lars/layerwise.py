"""What LARS and LAMB share beyond the trust ratio (keras_lars.trust): their
base class, `LayerwiseOptimizer`.

It holds the per-variable policy (weight decay and layer adaptation, decided
once per variable in `build()` from its path and rank, and kept in the
config), the float32 slots of float16/bfloat16 variables, the recorded trust
ratios, the gradient-noise-scale hooks, and where a step meets Keras's
replicas: clipping after the all-reduce, the all-reduce in a lower precision,
and gradient accumulation with a schedule or under a strategy.
"""

import re

import keras
from keras import ops

from keras_lars import _internals
from keras_lars import distribute
from keras_lars import noise_scale
from keras_lars._internals import KERAS_VERIFIED
from keras_lars.validation import ALLREDUCE_DTYPES
from keras_lars.validation import check_bool
from keras_lars.validation import check_number

_RANK_ONE_NOTE = "biases, batch-norm gamma/beta"


def variable_path(variable):
    """The name exclusion patterns are matched against: `variable.path`."""
    path = getattr(variable, "path", None)
    if path is None:  # a raw tf.Variable handed to apply_gradients
        path = variable.name.split(":")[0]
    return path


def compile_patterns(patterns, argument):
    """Validates a list of regular expressions; returns them compiled.

    A single string counts as one pattern (not as a list of characters,
    the tensorflow-addons#1530 trap). `None` means no pattern.
    """
    if patterns is None:
        return []
    if isinstance(patterns, str):
        patterns = [patterns]
    try:
        patterns = list(patterns)
    except TypeError:
        raise ValueError(
            f"`{argument}` must be a list of regular expressions, received {patterns!r}."
        ) from None
    compiled = []
    for pattern in patterns:
        if not isinstance(pattern, str) or not pattern:
            raise ValueError(
                f"`{argument}` must hold non-empty regular expression "
                f"strings, received {pattern!r}."
            )
        try:
            compiled.append(re.compile(pattern))
        except re.error as error:
            raise ValueError(
                f"`{argument}` holds an invalid regular expression {pattern!r}: {error}."
            ) from None
    return compiled


class LayerwiseOptimizer(keras.optimizers.Optimizer):
    """Base class of LARS and LAMB: coupled weight decay and exclusions.

    Weight decay here is *coupled*: it is folded into the update before the
    trust ratio. It is therefore not handed to Keras's base class, whose
    `weight_decay` is decoupled and would be applied a second time.

    Which variables get weight decay and which get layer adaptation is
    decided once per variable in `build()`:

    - a variable of rank <= 1 (biases, batch-norm gamma/beta) gets neither
      when `exclude_rank_one` is true (the MLPerf ResNet reference);
    - a variable whose `path` (e.g. "dense/kernel") is matched (`re.search`)
      by a pattern of `exclude_from_weight_decay` gets no weight decay;
    - one matched by `exclude_from_layer_adaptation` is not adapted: it takes
      the global learning rate. When that list is None it falls back to
      `exclude_from_weight_decay` (as in tensorflow-addons); pass `[]` to
      adapt every variable;
    - variables excluded through Keras's `exclude_from_weight_decay()`
      method get no weight decay either.
    """

    def __init__(
        self,
        learning_rate,
        weight_decay,
        exclude_from_weight_decay,
        exclude_from_layer_adaptation,
        exclude_rank_one,
        record_trust_ratios,
        name,
        allreduce_dtype=None,
        noise_scale_batch_size=None,
        noise_scale_decay=0.99,
        **kwargs,
    ):
        if kwargs.get("weight_decay") is not None:  # pragma: no cover
            raise ValueError("`weight_decay` given twice.")
        if isinstance(learning_rate, int) and not isinstance(learning_rate, bool):
            learning_rate = float(learning_rate)
        if isinstance(learning_rate, float):
            check_number("learning_rate", learning_rate, at_least=0.0)
        super().__init__(learning_rate=learning_rate, name=name, **kwargs)
        self.weight_decay = check_number("weight_decay", weight_decay, at_least=0.0)
        self._decay_patterns = compile_patterns(
            exclude_from_weight_decay, "exclude_from_weight_decay"
        )
        if exclude_from_layer_adaptation is None:
            self._adaptation_patterns = self._decay_patterns
        else:
            self._adaptation_patterns = compile_patterns(
                exclude_from_layer_adaptation, "exclude_from_layer_adaptation"
            )
        self._exclude_from_weight_decay_arg = _as_list(exclude_from_weight_decay)
        self._exclude_from_layer_adaptation_arg = _as_list(exclude_from_layer_adaptation)
        self.exclude_rank_one = check_bool("exclude_rank_one", exclude_rank_one)
        self.record_trust_ratios = check_bool("record_trust_ratios", record_trust_ratios)
        if allreduce_dtype not in ALLREDUCE_DTYPES:
            raise ValueError(
                f"`allreduce_dtype` must be one of {ALLREDUCE_DTYPES}, "
                f"received {allreduce_dtype!r}."
            )
        if allreduce_dtype not in (None, "float32") and keras.backend.backend() != "tensorflow":
            raise ValueError(
                f"`allreduce_dtype={allreduce_dtype!r}` acts on tf.distribute's all-reduce "
                f"(the TensorFlow backend), not on {keras.backend.backend()!r}."
            )
        self.allreduce_dtype = allreduce_dtype
        self.noise_scale_estimator = None
        self.noise_scale_batch_size = noise_scale_batch_size
        self.noise_scale_decay = check_number(
            "noise_scale_decay", noise_scale_decay, at_least=0.0, below=1.0
        )
        if noise_scale_batch_size is not None:
            self.noise_scale_estimator = noise_scale.NoiseScaleEstimator(
                noise_scale_batch_size, noise_scale_decay
            )
            self.noise_scale_estimator.check_backend(self.gradient_accumulation_steps)

    def _get_current_learning_rate(self):
        """Keras's rate, except that with `gradient_accumulation_steps` a
        `LearningRateSchedule` is called with the number of applied updates
        (`iterations`, which Keras floor-divides by the steps) instead of the
        micro-batches (`_iterations`, what Keras 3.8 to 3.15 pass): the rate
        of applied update n is schedule(n), as without accumulation."""
        schedule = getattr(self, "_learning_rate", None)
        if self.gradient_accumulation_steps and isinstance(
            schedule, keras.optimizers.schedules.LearningRateSchedule
        ):
            return schedule(self.iterations)
        return super()._get_current_learning_rate()

    def _backend_apply_gradients(self, grads, trainable_variables):
        """Keras's apply, after feeding each micro-batch's gradients to
        the noise-scale estimate when it measures from micro-batches (see
        `keras_lars.noise_scale.NoiseScaleEstimator`). Its variables are
        assigned before Keras's JAX apply takes the optimizer state that it
        keeps on the micro-batches that apply no update."""
        replicas = _internals.replicas_in_sync()
        self._check_accumulation()
        estimator = self.noise_scale_estimator
        if estimator is not None:
            estimator.check_replicas(self.gradient_accumulation_steps, replicas)
            if not _internals.in_one_of_several_replicas():
                estimator.on_micro_batch(self, grads, trainable_variables)
        return super()._backend_apply_gradients(grads, trainable_variables)

    def _check_accumulation(self):
        """Refuses `gradient_accumulation_steps` under a tf.distribute strategy
        that synchronises its replicas (MirroredStrategy, even on one device;
        MultiWorkerMirroredStrategy; TPUStrategy): Keras 3.8 to 3.15 reach the
        all-reduce's `merge_call` inside the tf.cond that picks the update
        step, which tf.distribute refuses ("`merge_call` called while defining
        a new graph"). Keras's own SGD fails the same way (checked on Keras
        3.8.0 and 3.15.1 with TF 2.21); OneDeviceStrategy works."""
        if not self.gradient_accumulation_steps:
            return
        if isinstance(
            getattr(self, "_learning_rate", None), keras.optimizers.schedules.LearningRateSchedule
        ):
            reason = _internals.problem("keras", KERAS_VERIFIED, _schedule_step_shape)
            if reason:
                raise _internals.UnsupportedVersionError(
                    f"`gradient_accumulation_steps` with a learning-rate schedule in "
                    f"{self.name!r} needs the schedule to count applied updates, which "
                    f"keras_lars cannot vouch for here: {reason}. "
                    f"Use {_internals.describe_versions('keras', KERAS_VERIFIED)}."
                )
        strategy = _synchronising_strategy()
        if strategy:
            raise ValueError(
                f"`gradient_accumulation_steps={self.gradient_accumulation_steps}` under "
                f"tf.distribute's {strategy}: Keras all-reduces inside the tf.cond of its "
                "update step, which tf.distribute refuses; accumulate on one device "
                "(OneDeviceStrategy) or on the JAX backend, or use a larger global batch."
            )

    def noise_scale_stats(self):
        """{"noise_scale": B_simple, "noise_scale_gradient_sq": |G|^2,
        "noise_scale_trace": tr(Sigma)}, smoothed and bias-corrected, after
        the last applied update (nan before the first); needs
        `noise_scale_batch_size`. See `keras_lars.noise_scale`."""
        if self.noise_scale_estimator is None:
            raise ValueError(
                f"Optimizer {self.name!r} does not measure the gradient noise scale: "
                "construct it with `noise_scale_batch_size`."
            )
        if not self.built:
            return dict.fromkeys(noise_scale.LOG_KEYS, float("nan"))
        return self.noise_scale_estimator.stats()

    def _clip_gradients(self, grads):
        """Keras's clipping (clipnorm, global_clipnorm, clipvalue), except
        inside one replica of several: there `_all_reduce_sum_gradients`
        clips the all-reduced gradient instead."""
        if self._clips_after_all_reduce():
            return grads
        return super()._clip_gradients(grads)

    def _clips_after_all_reduce(self):
        """Whether this step clips after the all-reduce (clipping is set and
        this runs in one replica of several). Keras 3 clips in `apply()`,
        before the all-reduce: each replica would clip its own partial
        gradient g_r, and the threshold would mean something else for every
        replica count (TF-Keras refused clipping under a strategy for this
        reason, tensorflow#33929). Clipping g = sum_r g_r instead is what
        one device does, e.g. global_clipnorm c:

            g_i <- g_i * min(1, c / ||(g_1, ..., g_n)||)

        This relies on Keras calling `_clip_gradients(self, grads)` before
        `_all_reduce_sum_gradients(self, grads_and_vars)`: where that cannot
        be vouched for, clipping under several replicas refuses."""
        if not (self.clipnorm or self.global_clipnorm or self.clipvalue):
            return False
        if not _internals.in_one_of_several_replicas():
            return False
        reason = _internals.problem("keras", KERAS_VERIFIED, _clip_order_shape)
        if reason:
            raise _internals.UnsupportedVersionError(
                f"clipping (clipnorm/global_clipnorm/clipvalue) in {self.name!r} under "
                f"{_internals.replicas_in_sync()} replicas clips after the all-reduce, "
                f"which keras_lars cannot do here: {reason}. "
                f"Use {_internals.describe_versions('keras', KERAS_VERIFIED)}."
            )
        return True

    def _all_reduce_sum_gradients(self, grads_and_vars):
        """Sums the replicas' gradients (TensorFlow backend, under a
        tf.distribute strategy), in `allreduce_dtype` if one is set
        (`keras_lars.distribute.all_reduce_in`), then clips the sum if
        clipping is set (see `_clips_after_all_reduce`)."""
        clip = self._clips_after_all_reduce()
        reduce = super()._all_reduce_sum_gradients
        local_grads = [g for g, _ in grads_and_vars]
        if self.allreduce_dtype in (None, "float32") or _internals.replicas_in_sync() <= 1:
            grads_and_vars = reduce(grads_and_vars)
        else:
            grads_and_vars = distribute.all_reduce_in(self.allreduce_dtype, reduce, grads_and_vars)
        if self.noise_scale_estimator is not None and _internals.in_one_of_several_replicas():
            self.noise_scale_estimator.on_all_reduce(
                self, local_grads, [g for g, _ in grads_and_vars]
            )
        if not clip:
            return grads_and_vars
        grads = super()._clip_gradients([g for g, _ in grads_and_vars])
        return list(zip(grads, [v for _, v in grads_and_vars]))

    def _apply_weight_decay(self, variables):
        """No decoupled decay: ours is coupled, inside `update_step`."""
        return

    def build(self, variables):
        if self.built:
            return
        sharded = any(_internals.sharded(v) for v in variables)  # on JAX only
        problem = sharded and _internals.distribution_problem("model")
        if problem:
            raise _internals.UnsupportedVersionError(
                f"{type(self).__name__} on variables sharded over a keras.distribution mesh: "
                f"{problem}."
            )
        super().build(variables)
        self._check_accumulation()
        if self.noise_scale_estimator is not None:
            self.noise_scale_estimator.check_replicas(
                self.gradient_accumulation_steps, _internals.replicas_in_sync()
            )
            self.noise_scale_estimator.build(self)
        self._decays = []
        self._adapts = []
        for variable in variables:
            path = variable_path(variable)
            low_rank = self.exclude_rank_one and len(variable.shape) <= 1
            decays = (
                self.weight_decay > 0
                and not low_rank
                and not any(p.search(path) for p in self._decay_patterns)
                and self._use_weight_decay(variable)
            )
            adapts = not low_rank and not any(p.search(path) for p in self._adaptation_patterns)
            self._decays.append(decays)
            self._adapts.append(adapts)
        # One float32 vector (ratio, ||w||, ||u||) per adapted variable.
        self._trust_stats = [
            self.add_variable((3,), dtype="float32", name=path.replace("/", "_") + "_trust_stats")
            if self.record_trust_ratios and adapts
            else None
            for path, adapts in zip(map(variable_path, variables), self._adapts)
        ]

    # Names of the slots kept in float32 for float16/bfloat16 variables.
    float32_slots = ()

    def add_variable_from_reference(self, reference_variable, name=None, initializer="zeros"):
        """Keras's slot constructor, except that the slots named in
        `float32_slots` of a float16/bfloat16 variable are float32."""
        low_precision = str(reference_variable.dtype) in ("float16", "bfloat16")
        if name not in self.float32_slots or not low_precision:
            return super().add_variable_from_reference(reference_variable, name, initializer)
        layout = getattr(reference_variable, "_layout", None)
        return self.add_variable(
            shape=reference_variable.shape,
            initializer=initializer,
            dtype="float32",
            name=f"{variable_path(reference_variable).replace('/', '_')}_{name}",
            **({} if layout is None else {"layout": layout}),
        )

    def _add_slots(self, variables, names):
        """One zero-initialised optimizer variable per model variable for each
        of `names` (a list of lists, one per name, in `variables` order).

        Keras >= 3.10 has `Optimizer.add_optimizer_variables`, which also
        leaves out variables that are overwritten with their gradient (None
        in their place). On older Keras, `_add_slots_before_3_10` does the
        same through `add_variable_from_reference`, interleaving the names
        like Keras so that checkpoints list the variables in one order.
        """
        if hasattr(self, "add_optimizer_variables"):
            return self.add_optimizer_variables(variables, names)
        return _add_slots_before_3_10(self, variables, names)

    def _record_trust_stats(self, index, ratio, weight_norm, update_norm):
        """Keeps this step's statistics when `record_trust_ratios` is set."""
        if self._trust_stats[index] is not None:
            self.assign(
                self._trust_stats[index],
                ops.stack([ratio, weight_norm, update_norm]),
            )

    def trust_ratio_stats(self):
        """{variable path: (trust ratio, ||w||, ||u||)} of the last step.

        Only adapted variables are listed; needs `record_trust_ratios=True`.
        The ratio is the factor applied to the global rate (after clipping);
        u is the norm the ratio was computed from (LARS: ||g|| or
        ||g + beta*w||; LAMB: ||r + lambda*w||).
        """
        if not self.record_trust_ratios:
            raise ValueError(
                f"Optimizer {self.name!r} does not record trust ratios: "
                "construct it with `record_trust_ratios=True`."
            )
        if not self.built:
            return {}
        return {
            variable_path(variable): tuple(float(x) for x in ops.convert_to_numpy(stats))
            for variable, stats in zip(self._trainable_variables, self._trust_stats)
            if stats is not None
        }

    def uses_weight_decay(self, variable):
        """Whether `variable` gets weight decay (known once built)."""
        return self._decays[self._get_variable_index(variable)]

    def uses_layer_adaptation(self, variable):
        """Whether `variable`'s rate is scaled by its trust ratio."""
        return self._adapts[self._get_variable_index(variable)]

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "weight_decay": self.weight_decay,
                "exclude_from_weight_decay": self._exclude_from_weight_decay_arg,
                "exclude_from_layer_adaptation": (self._exclude_from_layer_adaptation_arg),
                "exclude_rank_one": self.exclude_rank_one,
                "record_trust_ratios": self.record_trust_ratios,
                "allreduce_dtype": self.allreduce_dtype,
                "noise_scale_batch_size": self.noise_scale_batch_size,
                "noise_scale_decay": self.noise_scale_decay,
            }
        )
        return config


def _add_slots_before_3_10(optimizer, variables, names):
    """`Optimizer.add_optimizer_variables` for Keras < 3.10 (same result)."""
    slots = tuple([] for _ in names)
    for variable in variables:
        overwritten = getattr(variable, "overwrite_with_gradient", False)
        for name, slot in zip(names, slots):
            slot.append(
                None if overwritten else optimizer.add_variable_from_reference(variable, name=name)
            )
    return slots


def _schedule_step_shape():
    """None if Keras's optimizer still takes its rate from
    `_get_current_learning_rate(self)` (which `_get_current_learning_rate`
    above overrides), else what differs."""
    return _internals.signature_mismatch(
        keras.optimizers.Optimizer, "_get_current_learning_rate", ["self"]
    )


def _synchronising_strategy():
    """The class name of the current tf.distribute strategy if its replicas
    synchronise through `merge_call` (any but the default strategy and
    OneDeviceStrategy), else None; None on other backends."""
    if keras.backend.backend() != "tensorflow":
        return None
    import tensorflow as tf

    if not tf.distribute.has_strategy():
        return None
    strategy = tf.distribute.get_strategy()
    if isinstance(strategy, tf.distribute.OneDeviceStrategy):
        return None
    return type(strategy).__name__


def _as_list(patterns):
    if patterns is None:
        return None
    if isinstance(patterns, str):
        return [patterns]
    return list(patterns)


def _clip_order_shape():
    """None if Keras's optimizer still has the clipping and all-reduce
    methods `_clips_after_all_reduce` relies on, else what differs."""
    from keras.src.backend.tensorflow.optimizer import TFOptimizer

    return _internals.first_mismatch(
        (keras.optimizers.Optimizer, "_clip_gradients", ["self", "grads"]),
        (TFOptimizer, "_all_reduce_sum_gradients", ["self", "grads_and_vars"]),
    )
