"""Callbacks: the warmup/poly-decay schedule in callback form, trust-ratio
logs, and a guard that stops training when it diverges."""

import math

import keras
import numpy as np
from keras import ops

from keras_lars.schedules import WarmupPolyDecay
from keras_lars.validation import check_integer


def inner_optimizer(optimizer):
    """The optimizer that owns the rate (unwraps a LossScaleOptimizer)."""
    return getattr(optimizer, "inner_optimizer", optimizer)


def _step(optimizer):
    # The optimizer's applied updates (`iterations`: with Keras's
    # gradient_accumulation_steps, micro-batches floor-divided by their
    # number), so that update n gets schedule(n) as LARS and LAMB give it
    # (LayerwiseOptimizer._get_current_learning_rate).
    return optimizer.iterations


@keras.saving.register_keras_serializable(package="keras_lars")
class _ScheduledRate:
    """Installed as an optimizer's rate: evaluates the schedule in-graph.

    Keras calls a callable learning rate with no arguments inside every
    update (base_optimizer._get_current_learning_rate), so the rate is the
    schedule at the optimizer's own step, exactly, at every step. The
    optimizer's float `learning_rate` variable is kept (still tracked, so
    checkpoints keep their layout), holds the rate last computed, and is
    restored as the optimizer's rate when training ends.

    Serialized (a `.keras` file saved by a checkpoint callback mid-training),
    it is stored as the current rate and loads back as that float.
    """

    def __init__(self, optimizer, variable, schedule, fit_params):
        self.optimizer = optimizer
        self.variable = variable
        self.schedule = schedule
        self.fit_params = fit_params  # the installing fit's `Callback.params`

    def __call__(self):
        rate = self.schedule(_step(self.optimizer))
        # Keep the variable at the rate in use, for checkpoints read later
        # without this callback.
        self.variable.assign(ops.cast(rate, self.variable.dtype))
        return rate

    def get_config(self):
        return {"learning_rate": float(ops.convert_to_numpy(self()))}

    @classmethod
    def from_config(cls, config):
        return config["learning_rate"]


@keras.saving.register_keras_serializable(package="keras_lars")
class WarmupPolyDecayCallback(keras.callbacks.Callback):
    """`keras_lars.WarmupPolyDecay` in callback form.

    Takes the schedule's arguments (or use `from_schedule`). At train begin
    it installs the schedule as the optimizer's rate, evaluated inside the
    compiled train step from the optimizer's `iterations`, so every step gets
    exactly the schedule's rate, also with `steps_per_execution > 1` (where
    callbacks only run every k-th step) and after resuming from a checkpoint
    (`BackupAndRestore`), since no counter of the callback's own is involved.
    At train end the optimizer gets back its float rate variable, set to the
    schedule's current rate.

    At each epoch end `logs["learning_rate"]` receives the optimizer's
    current rate, schedule(iterations): the rate of the next update, which
    is also what `optimizer.learning_rate` returns and what Keras's
    `TensorBoard` callback logs as `epoch_learning_rate`. `History` records
    it.

    The optimizer must have been built with a float `learning_rate`: one
    built with a `LearningRateSchedule` (or any callable) raises ValueError
    at train begin — use the schedule or this callback, not both; so do two
    of these callbacks in one fit.
    """

    def __init__(
        self,
        peak_learning_rate,
        warmup_steps,
        total_steps,
        power=2.0,
        end_learning_rate=1e-4,
        start_learning_rate=0.0,
    ):
        super().__init__()
        self.schedule = WarmupPolyDecay(
            peak_learning_rate,
            warmup_steps,
            total_steps,
            power=power,
            end_learning_rate=end_learning_rate,
            start_learning_rate=start_learning_rate,
        )
        self._installed = None

    @classmethod
    def from_schedule(cls, schedule):
        """The callback giving the rates of the `WarmupPolyDecay` `schedule`."""
        if not isinstance(schedule, WarmupPolyDecay):
            raise ValueError(
                f"`schedule` must be a keras_lars.WarmupPolyDecay, received {schedule!r}."
            )
        config = schedule.get_config()
        config.pop("name")
        return cls(**config)

    def on_train_begin(self, logs=None):
        optimizer = inner_optimizer(self.model.optimizer)
        current = optimizer._learning_rate
        if isinstance(current, _ScheduledRate):
            if self.params and current.fit_params is self.params:
                # Keras hands one `params` dict to all callbacks of a fit.
                raise ValueError(
                    "Two WarmupPolyDecayCallbacks in one fit: the optimizer's "
                    "`learning_rate` can follow only one."
                )
            # Left over by a fit that raised before on_train_end (an
            # interrupted run about to be resumed): take its variable back.
            variable = current.variable
        elif isinstance(current, keras.optimizers.schedules.LearningRateSchedule):
            raise ValueError(
                f"The optimizer's `learning_rate` is already a schedule "
                f"({type(current).__name__}); use either a schedule or "
                "WarmupPolyDecayCallback, not both: construct the optimizer "
                "with a float `learning_rate`."
            )
        elif isinstance(current, keras.Variable):
            variable = current
        else:
            raise ValueError(
                f"The optimizer's `learning_rate` is a callable ({current!r}); "
                "WarmupPolyDecayCallback needs an optimizer constructed with "
                "a float `learning_rate`."
            )
        # Set the private attribute, not the `learning_rate` property: the
        # property's setter would untrack the variable and change the
        # optimizer's checkpoint layout.
        optimizer._learning_rate = _ScheduledRate(optimizer, variable, self.schedule, self.params)
        self._installed = optimizer
        # A train function traced by an earlier fit reads the variable.
        self.model.make_train_function(force=True)

    def on_train_end(self, logs=None):
        optimizer, self._installed = self._installed, None
        if optimizer is None or not isinstance(optimizer._learning_rate, _ScheduledRate):
            return
        hook = optimizer._learning_rate
        hook()  # sets the variable to the current rate
        optimizer._learning_rate = hook.variable
        self.model.make_train_function(force=True)

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None and self._installed is not None:
            # Through `self.model`: on JAX that syncs the optimizer's state.
            rate = self.schedule(_step(inner_optimizer(self.model.optimizer)))
            logs["learning_rate"] = float(ops.convert_to_numpy(rate))

    def get_config(self):
        config = self.schedule.get_config()
        config.pop("name")
        return config


@keras.saving.register_keras_serializable(package="keras_lars")
class TrustRatioMonitor(keras.callbacks.Callback):
    """Writes each adapted layer's trust ratio and norms to TensorBoard.

    Every `every_n_steps` training steps (at the first batch end at or past
    each multiple, with `steps_per_execution > 1`), for every variable the
    optimizer adapts, three scalars at the optimizer's step (`iterations`):

        trust_ratio/<variable path>   the factor applied to the global rate
        weight_norm/<variable path>   ||w||
        update_norm/<variable path>   the norm the ratio divides by
                                      (see `LayerwiseOptimizer.trust_ratio_stats`)

    The optimizer (`keras_lars.LARS` / `LAMB`, possibly inside a
    `LossScaleOptimizer`) must be constructed with `record_trust_ratios=True`.
    Needs TensorFlow installed (it writes with `tf.summary`), whatever the
    backend; not the tensorboard package.

    Args:
        log_dir: directory of the TensorBoard event files.
        every_n_steps: int >= 1.
    """

    def __init__(self, log_dir, every_n_steps=100):
        super().__init__()
        if not isinstance(log_dir, str) or not log_dir:
            raise ValueError(f"`log_dir` must be a directory path, received {log_dir!r}.")
        check_integer("every_n_steps", every_n_steps, at_least=1)
        self.log_dir = log_dir
        self.every_n_steps = every_n_steps
        self._writer = None

    def on_train_begin(self, logs=None):
        optimizer = inner_optimizer(self.model.optimizer)
        if not hasattr(optimizer, "trust_ratio_stats"):
            raise ValueError(
                f"TrustRatioMonitor needs a keras_lars.LARS or LAMB optimizer, "
                f"received {type(optimizer).__name__}."
            )
        if not optimizer.record_trust_ratios:
            raise ValueError(
                f"TrustRatioMonitor needs the optimizer {optimizer.name!r} to be "
                "constructed with `record_trust_ratios=True`."
            )
        try:
            import tensorflow as tf
        except ImportError:  # pragma: no cover
            raise ImportError(
                "TrustRatioMonitor writes with tf.summary: install TensorFlow "
                '(pip install "keras_lars[cpu]").'
            ) from None
        self._tf = tf
        # What tensorboard's tf.summary.scalar writes, without needing the
        # tensorboard package installed.
        self._metadata = tf.compat.v1.SummaryMetadata(
            plugin_data=tf.compat.v1.SummaryMetadata.PluginData(plugin_name="scalars"),
            data_class="DATA_CLASS_SCALAR",
        ).SerializeToString()
        self._writer = tf.summary.create_file_writer(self.log_dir)
        self._last_step = self._optimizer_step()

    def _optimizer_step(self):
        # Through `self.model`: on JAX that syncs the training state.
        optimizer = inner_optimizer(self.model.optimizer)
        return int(ops.convert_to_numpy(optimizer.iterations))

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_start = self._optimizer_step()

    def on_train_batch_end(self, batch, logs=None):
        # Decide from the batch count (no state sync on JAX), write at the
        # optimizer's step. With steps_per_execution > 1, Keras < 3.11 hands
        # the first step of the execution as `batch`: read the step there.
        if getattr(self.model, "steps_per_execution", 1) > 1:
            seen = self._optimizer_step()
        else:
            seen = self._epoch_start + batch + 1
        if seen // self.every_n_steps == self._last_step // self.every_n_steps:
            return
        self._last_step = seen
        tf = self._tf
        optimizer = inner_optimizer(self.model.optimizer)
        step = int(ops.convert_to_numpy(optimizer.iterations))
        with self._writer.as_default(step=step):
            for path, stats in optimizer.trust_ratio_stats().items():
                for kind, value in zip(("trust_ratio", "weight_norm", "update_norm"), stats):
                    tf.summary.write(
                        f"{kind}/{path}",
                        tf.constant(value, tf.float32),
                        metadata=self._metadata,
                    )

    def on_train_end(self, logs=None):
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def get_config(self):
        return {"log_dir": self.log_dir, "every_n_steps": self.every_n_steps}


class NonFiniteLossError(RuntimeError):
    """Training diverged: a non-finite loss, or non-finite variables.

    Attributes: `step` (the optimizer's step count when it was seen) and
    `epoch` (1-based).
    """

    def __init__(self, message, step, epoch):
        super().__init__(message)
        self.step, self.epoch = step, epoch


@keras.saving.register_keras_serializable(package="keras_lars")
class DivergenceGuard(keras.callbacks.Callback):
    """Stops training at the first sign of divergence.

    Checks, at every training batch end, the loss in the logs (Keras's
    running mean over the epoch, so one non-finite step keeps it non-finite
    however many steps an execution runs), and at every epoch end the
    validation loss and every model and optimizer variable (a finite last
    loss can precede the update that made the weights non-finite).

    With `raise_error=True` (default) it raises `NonFiniteLossError` from
    that callback hook, so `fit` stops there and no later hook, such as a
    checkpoint at the epoch's end, runs: put this callback first. With
    `raise_error=False` it sets `model.stop_training`, as Keras's
    `TerminateOnNaN` does, and records `diverged` (the error it would
    have raised); later hooks of that epoch still run and should check it.
    """

    def __init__(self, raise_error=True):
        super().__init__()
        if not isinstance(raise_error, bool):
            raise ValueError(f"`raise_error` must be True or False, received {raise_error!r}.")
        self.raise_error = raise_error
        self.diverged = None
        self._epoch = 0

    def _step(self):
        optimizer = inner_optimizer(self.model.optimizer)
        return int(ops.convert_to_numpy(optimizer.iterations))

    def _stop(self, what):
        step = self._step()
        error = NonFiniteLossError(
            f"{what} became non-finite at step {step} (epoch {self._epoch + 1})",
            step,
            self._epoch + 1,
        )
        self.diverged = error
        self.model.stop_training = True
        if self.raise_error:
            raise error

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is not None and not math.isfinite(float(ops.convert_to_numpy(loss))):
            self._stop("loss")

    def on_epoch_end(self, epoch, logs=None):
        for key in ("loss", "val_loss"):
            value = (logs or {}).get(key)
            if value is not None and not math.isfinite(float(ops.convert_to_numpy(value))):
                self._stop(key)
                return
        variables = list(self.model.variables) + list(self.model.optimizer.variables)
        for variable in variables:
            # (integers, such as the step count, are always finite)
            if not np.isfinite(ops.convert_to_numpy(variable)).all():
                self._stop(f"variable {variable.path}")
                return

    def get_config(self):
        return {"raise_error": self.raise_error}
