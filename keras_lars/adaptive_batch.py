"""An adaptive global batch driven by the measured gradient noise scale.

`AdaptiveBatchSize` (its docstring states the equations), and the pure
functions it decides with.
"""

import math

import keras

from keras_lars.validation import check_integer
from keras_lars.validation import check_number

RATE_RULES = ("adascale", "linear", "sqrt", "none")


def gain_ratio(noise_scale, batch_size, base_batch_size):
    """AdaScale's r = (1 + B_simple / B_0) / (1 + B_simple / B')."""
    return (1.0 + noise_scale / base_batch_size) / (1.0 + noise_scale / batch_size)


def rate_factor(rule, noise_scale, batch_size, base_batch_size):
    """The factor of the base rate at batch B' under `rule` (RATE_RULES)."""
    if rule == "adascale":
        return gain_ratio(noise_scale, batch_size, base_batch_size)
    ratio = batch_size / base_batch_size
    return {"linear": ratio, "sqrt": math.sqrt(ratio), "none": 1.0}[rule]


def next_batch_size(
    batch_size, noise_scale, target_multiple, minimum, maximum, growth_factor, multiple_of=1
):
    """B' of `AdaptiveBatchSize` (batch_size B a multiple of q in [B_min,
    B_max]); B itself for a B_simple that is nan or not positive."""
    if not noise_scale > 0:  # nan too
        return batch_size
    q = multiple_of
    low = max(minimum, q * math.ceil(batch_size / growth_factor / q))
    high = min(maximum, q * math.floor(batch_size * growth_factor / q))
    target = q * math.floor(min(target_multiple * noise_scale, high) / q)
    return int(min(max(target, low), high))


@keras.saving.register_keras_serializable(package="keras_lars")
class AdaptiveBatchSize(keras.callbacks.Callback):
    """Sets the global batch to a multiple of the measured noise scale, and
    the learning rate by a rule.

    McCandlish et al. (2018, arXiv:1812.06162): the batch beyond which larger
    batches stop paying off is about the simple noise scale B_simple =
    tr(Sigma) / |G|^2, and it grows as the loss falls. At each decision the
    controller reads B_simple of the interval since the last decision (the raw
    sums of `NoiseScaleEstimator.interval_stats`, no moving average: no lag from
    before the interval) and sets the next global batch

        B' = clip(q * floor(m * B_simple / q), lo, hi)
        lo = max(B_min, q * ceil(B / g / q)),   hi = min(B_max, q * floor(B * g / q))

    with B the current batch, m `target_multiple`, g `growth_factor` (the most
    the batch changes by at one decision, either way), q `multiple_of` (what the
    devices divide: replicas, micro-batches) and B_min, B_max the bounds. A
    reading whose |G|^2 is not positive (the true gradient not resolved) keeps
    the batch and the rate. The learning rate is the base rate (tuned at the
    base batch B_0) times the factor of `rate_rule`:

        adascale: r = (1 + B_simple / B_0) / (1 + B_simple / B')
        linear:   B' / B_0
        sqrt:     sqrt(B' / B_0)
        none:     1

    AdaScale's gain ratio (Johnson et al., ICML 2020) r = (tr(Sigma) / B_0 +
    |G|^2) / (tr(Sigma) / B' + |G|^2), the gain of S = B' / B_0 times the batch,
    written with B_simple: it lies between 1 and S, near S while the batch is
    far below the noise scale and near 1 far above it.

    The optimizer (`keras_lars.LARS` / `LAMB`, possibly inside a
    `LossScaleOptimizer`) must be built with `noise_scale_batch_size`. Every
    `every_steps` updates or `every_epochs` epochs the callback reads
    B_simple of the updates since its last decision, with its standard error
    (`keras_lars.noise_scale.interval_noise_scale`), and decides; `decisions`
    lists each as a dict (step, noise_scale, standard_error, measurements,
    batch_size, rate_factor), `batch_size` and `rate_factor` hold the latest,
    `epochs_done` the epochs ended so far.
    A plain learning rate becomes base rate x factor at once; with a
    `LearningRateSchedule` multiply it by `rate_factor` yourself. A fit
    cannot change its batch: when the batch changes the callback sets the
    optimizer's noise-scale batch to it (divided by the
    `gradient_accumulation_steps` k), drops the traced train step and stops
    the fit (`model.stop_training`), and you fit again at the new batch
    (`batch_size` / k a step; give `multiple_of` a multiple of k):

        controller = keras_lars.AdaptiveBatchSize(64, 64, 1024, every_epochs=1)
        while controller.epochs_done < epochs:
            model.fit(x, y, batch_size=controller.batch_size,
                      initial_epoch=controller.epochs_done, epochs=epochs,
                      callbacks=[controller])

    `get_state()` / `set_state()` carry the decisions across a restart
    (checkpoint them with the model), so that a resumed run decides alike.

    Args:
        batch_size: int, the global batch to start at (a multiple of
            `multiple_of`, within the bounds).
        minimum_batch_size: int >= 1, B_min (a multiple of `multiple_of`).
        maximum_batch_size: int >= B_min, B_max (a multiple of `multiple_of`).
        growth_factor: float > 1, g: one decision changes the batch by at
            most this factor, up or down.
        target_multiple: float > 0, m: the target batch is m * B_simple.
        rate_rule: "adascale", "linear", "sqrt" or "none".
        every_steps: int >= 1 or None: decide after every this many updates.
        every_epochs: int >= 1 or None: decide at the end of every this many
            epochs (exactly one of the two).
        multiple_of: int >= 1, q: every batch is a multiple of it.
        base_batch_size: int >= 1, B_0, the batch the base rate is for;
            None: `batch_size`.
    """

    def __init__(
        self,
        batch_size,
        minimum_batch_size,
        maximum_batch_size,
        growth_factor=2.0,
        target_multiple=1.0,
        rate_rule="adascale",
        every_steps=None,
        every_epochs=None,
        multiple_of=1,
        base_batch_size=None,
    ):
        super().__init__()
        self.multiple_of = check_integer("multiple_of", multiple_of, at_least=1)
        self.minimum_batch_size = self._multiple("minimum_batch_size", minimum_batch_size)
        self.maximum_batch_size = self._multiple("maximum_batch_size", maximum_batch_size)
        if self.minimum_batch_size > self.maximum_batch_size:
            raise ValueError(
                f"`minimum_batch_size` ({minimum_batch_size}) must not exceed "
                f"`maximum_batch_size` ({maximum_batch_size})."
            )
        self.initial_batch_size = self._multiple("batch_size", batch_size)
        if not self.minimum_batch_size <= self.initial_batch_size <= self.maximum_batch_size:
            raise ValueError(
                f"`batch_size` ({batch_size}) must lie within `minimum_batch_size` "
                f"({minimum_batch_size}) and `maximum_batch_size` ({maximum_batch_size})."
            )
        self.growth_factor = check_number("growth_factor", growth_factor, above=1.0)
        self.target_multiple = check_number("target_multiple", target_multiple, above=0.0)
        if rate_rule not in RATE_RULES:
            raise ValueError(f"`rate_rule` must be one of {RATE_RULES}, received {rate_rule!r}.")
        self.rate_rule = rate_rule
        if (every_steps is None) == (every_epochs is None):
            raise ValueError(
                f"give one of `every_steps` and `every_epochs`, received {every_steps!r} "
                f"and {every_epochs!r}."
            )
        for name, value in (("every_steps", every_steps), ("every_epochs", every_epochs)):
            if value is not None:
                check_integer(name, value, at_least=1)
        self.every_steps, self.every_epochs = every_steps, every_epochs
        if base_batch_size is not None:
            base_batch_size = check_integer("base_batch_size", base_batch_size, at_least=1)
        self.base_batch_size = base_batch_size
        self.set_state(None)

    def _multiple(self, name, value):
        value = check_integer(name, value, at_least=1)
        if value % self.multiple_of:
            raise ValueError(
                f"`{name}` ({value}) must be a multiple of `multiple_of` ({self.multiple_of})."
            )
        return value

    # --- the decisions (no Keras) -------------------------------------------------------
    def decide(self, step, reading):
        """Decides from `reading` (`interval_noise_scale`'s dict) at update
        `step`; returns the decision (also appended to `decisions`)."""
        scale = reading["noise_scale"]
        batch = next_batch_size(
            self.batch_size,
            scale,
            self.target_multiple,
            self.minimum_batch_size,
            self.maximum_batch_size,
            self.growth_factor,
            self.multiple_of,
        )
        base = self.base_batch_size or self.initial_batch_size
        factor = rate_factor(self.rate_rule, scale, batch, base) if scale > 0 else self.rate_factor
        decision = {
            "step": int(step),
            "noise_scale": scale,
            "standard_error": reading["standard_error"],
            "measurements": reading["count"],
            "batch_size": batch,
            "rate_factor": factor,
        }
        self.batch_size, self.rate_factor = batch, factor
        self.decisions.append(decision)
        return decision

    def get_state(self):
        """The decisions so far (JSON-safe), for `set_state` after a restart."""
        return {"decisions": [dict(d) for d in self.decisions], "epochs_done": self.epochs_done}

    def set_state(self, state):
        """Goes on from `get_state()`'s dict (None: from the start)."""
        state = state or {}
        self.decisions = [dict(d) for d in state.get("decisions", [])]
        self.epochs_done = state.get("epochs_done", 0)
        last = self.decisions[-1] if self.decisions else {}
        self.batch_size = last.get("batch_size", self.initial_batch_size)
        self.rate_factor = last.get("rate_factor", 1.0)

    def get_config(self):
        return {
            "batch_size": self.initial_batch_size,
            "minimum_batch_size": self.minimum_batch_size,
            "maximum_batch_size": self.maximum_batch_size,
            "growth_factor": self.growth_factor,
            "target_multiple": self.target_multiple,
            "rate_rule": self.rate_rule,
            "every_steps": self.every_steps,
            "every_epochs": self.every_epochs,
            "multiple_of": self.multiple_of,
            "base_batch_size": self.base_batch_size,
        }

    @classmethod
    def from_config(cls, config):
        return cls(**config)

    # --- as a Keras callback ------------------------------------------------------------
    def _optimizer(self):
        optimizer = getattr(self.model.optimizer, "inner_optimizer", self.model.optimizer)
        if getattr(optimizer, "noise_scale_estimator", None) is None:
            raise ValueError(
                f"AdaptiveBatchSize needs a keras_lars.LARS or LAMB optimizer constructed "
                f"with `noise_scale_batch_size`, received {type(optimizer).__name__} "
                f"{getattr(optimizer, 'name', '')!r}."
            )
        return optimizer

    def on_train_begin(self, logs=None):
        optimizer = self._optimizer()
        self._micro = optimizer.gradient_accumulation_steps or 1
        self._batches = int(keras.ops.convert_to_numpy(optimizer.iterations)) * self._micro

    def on_train_batch_end(self, batch, logs=None):
        self._batches += 1
        if self.every_steps and self._batches % (self.every_steps * self._micro) == 0:
            self._decide_now(self._batches // self._micro)

    def on_epoch_end(self, epoch, logs=None):
        self.epochs_done = epoch + 1
        if self.every_epochs and self.epochs_done % self.every_epochs == 0:
            self._decide_now(self._batches // self._micro)

    def _decide_now(self, step):
        optimizer = self._optimizer()
        before_batch, before_factor = self.batch_size, self.rate_factor
        self.decide(step, optimizer.noise_scale_estimator.interval_stats(reset=True))
        rate = optimizer._learning_rate
        if self.rate_factor != before_factor and isinstance(rate, keras.Variable):
            current = float(keras.ops.convert_to_numpy(rate))
            rate.assign(current / before_factor * self.rate_factor)
        if self.batch_size != before_batch:
            accumulation = optimizer.gradient_accumulation_steps or 1
            optimizer.noise_scale_estimator.batch_size = self.batch_size // accumulation
            self.model.train_function = None  # traced anew for the new batch
            self.model.stop_training = True
