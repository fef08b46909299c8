"""The model, optimizer, loss and metrics of a run, built from its Config."""

import keras

import keras_lars
from keras_lars import models
from keras_lars.tools.shapes_only import built_shapes_only


def create_model(config, num_classes):
    kwargs = {}
    if models.has_batch_norm(config.model):
        kwargs["sync_batch_norm"] = config.sync_batch_norm
    model = models.BUILDERS[config.model](
        num_classes=num_classes,
        input_shape=(config.image_size, config.image_size, 3),
        **kwargs,
    )
    if config.image_size_schedule:  # one model for every phase's size (global pooling)
        model.input_spec = keras.InputSpec(shape=(None, None, None, 3))
    return model


def create_optimizer(config, schedule):
    """LARS / LAMB / momentum SGD / Adam with LAMB's weight decay. Rank-1 variables
    (biases, batch norm) get no weight decay and no layer adaptation. With
    --gradient_accumulation_steps the optimizer accumulates (the schedule
    counts updates); with --noise_scale it measures B_simple at the batch of
    one step (keras_lars.noise_scale)."""
    record = config.trust_ratio_log_every > 0
    shared = {  # gradient accumulation and the noise scale (None: off)
        "gradient_accumulation_steps": config.gradient_accumulation_steps
        if config.gradient_accumulation_steps > 1
        else None,
        "noise_scale_batch_size": config.micro_batch_size
        if config.noise_scale or config.adaptive_batch != "off"
        else None,
    }
    adam = config.optimizer == "adam"
    if config.optimizer == "lamb" or adam:
        # Adam is LAMB with every variable excluded from layer adaptation:
        # w -= lr * (m_hat / (sqrt(v_hat) + eps) + wd * w), AdamW's decoupled decay.
        return keras_lars.LAMB(
            schedule,
            beta_1=config.momentum,
            weight_decay=config.weight_decay,
            exclude_rank_one=True,
            record_trust_ratios=record,
            allreduce_dtype=config.allreduce_dtype,
            **({"exclude_from_layer_adaptation": [".*"], "name": "adam"} if adam else {}),
            **shared,
        )
    # Momentum SGD is LARS with every variable excluded from layer adaptation:
    # v = m*v + lr*(g + wd*w), w -= v, the form of Goyal et al. and MLPerf.
    sgd = config.optimizer in ("sgd", "nesterov")
    return keras_lars.LARS(
        schedule,
        momentum=config.momentum,
        weight_decay=config.weight_decay,
        trust_coefficient=config.trust_coefficient,
        nesterov=config.optimizer == "nesterov",
        exclude_from_layer_adaptation=[".*"] if sgd else None,
        record_trust_ratios=record,
        name=config.optimizer,
        allreduce_dtype=config.allreduce_dtype,
        **shared,
    )


class CrossEntropy(keras.losses.Loss):
    """Softmax cross-entropy of logits against integer labels, with targets
    (1 - s) * one_hot + s / num_classes, averaged over the examples' weights
    (evaluation batches are padded with weight-0 examples)."""

    def __init__(self, num_classes, label_smoothing=0.0, name="cross_entropy"):
        super().__init__(name=name, reduction="mean_with_sample_weight")
        self.num_classes, self.label_smoothing = num_classes, label_smoothing

    def call(self, labels, logits):
        labels = keras.ops.reshape(keras.ops.cast(labels, "int32"), (-1,))
        return keras.losses.categorical_crossentropy(
            keras.ops.one_hot(labels, self.num_classes),
            logits,
            from_logits=True,
            label_smoothing=self.label_smoothing,
        )

    def get_config(self):
        return {
            "num_classes": self.num_classes,
            "label_smoothing": self.label_smoothing,
            "name": self.name,
        }


def metrics(num_classes):
    found = [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]
    if num_classes > 5:
        found.append(keras.metrics.SparseTopKCategoricalAccuracy(5, name="top5_accuracy"))
    return found


def compiled_model(config, num_classes, schedule):
    """The model of `config`, compiled with its optimizer, loss and metrics
    (call inside the strategy's scope)."""
    model = create_model(config, num_classes)
    model.compile(
        optimizer=create_optimizer(config, schedule),
        loss=CrossEntropy(num_classes, config.label_smoothing),
        weighted_metrics=metrics(num_classes),  # evaluation padding has weight 0
        steps_per_execution=config.steps_per_execution,
        run_eagerly=config.run_eagerly,
    )
    return model


def learning_rate_schedule(config, length, num_train, rate_factor=1.0, phases=None):
    """Linear warmup to the peak rate, then quadratic decay to the end rate,
    the whole curve times `rate_factor` (after divergence rollbacks): in
    steps (WarmupPolyDecay), or under --batch_schedule / --image_size_schedule
    in epochs done (EpochWarmupPolyDecay, --batch_coupling), or in the
    `phases` (keras_lars.BatchSchedule, a rate factor each) that
    --adaptive_batch decided."""
    if config.batch_phases is not None or phases is not None:
        coupling = config.batch_coupling
        schedule, factors = phases or (config.batch_phases, None)
        return keras_lars.EpochWarmupPolyDecay(
            schedule,
            num_train,
            config.peak_learning_rate * rate_factor,
            config.warmup_epochs,
            config.train_epochs,
            power=2.0,
            end_learning_rate=config.end_learning_rate * rate_factor,
            coupling="grow" if coupling == "grow" else "scale",
            scaling_rule="linear" if coupling == "grow" else coupling,
            rate_factors=factors,
        )
    return keras_lars.WarmupPolyDecay(
        config.peak_learning_rate * rate_factor,
        length.warmup_steps,
        length.total_steps,
        power=2.0,
        end_learning_rate=config.end_learning_rate * rate_factor,
    )


def variable_shapes(config, num_classes):
    """{path: shape} of the model's variables (a model built for its shapes
    alone and dropped: shapes_only.built_shapes_only)."""
    model = built_shapes_only(lambda: create_model(config, num_classes))
    shapes = {v.path: tuple(v.shape) for v in model.weights}
    keras.utils.set_random_seed(config.seed)
    return shapes
