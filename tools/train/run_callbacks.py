"""The run's callbacks, each one idea; data flows from StepCounter to the rest.

    StepCounter         reads the optimizer's step once per batch (a device
                        sync); stops a short last epoch at its planned steps
    ReseedDropout       an epoch's random layers draw from (seed, epoch)
    Throughput          images/s of an epoch, from its steps after the first,
                        and the seconds of its evaluations (left out of them)
    LearningRateLog     the scheduled rate at the epoch's end, into the logs
    BatchLog            the epoch's batch and image size (phases), into the logs
    ProgressLine        off a terminal, a line within an epoch every N seconds
    ProgressBar         Keras's bar, sized to each epoch's planned steps
    log_writers         TensorBoard and the trust ratios (the chief's)

Checkpointing (checkpoint_callback.py) uses StepCounter and Throughput.
"""

import contextlib
import importlib.util
import os
import sys
import time

import keras
import numpy as np

import keras_lars
from keras_lars.tools import tensorflow_or_none


def optimizer_step(model):
    """The optimizer's step count (the inner optimizer's under loss scaling:
    Keras 3.8's LossScaleOptimizer.iterations stays 0)."""
    optimizer = keras_lars.callbacks.inner_optimizer(model.optimizer)
    return int(keras.ops.convert_to_numpy(optimizer.iterations))


class StepCounter(keras.callbacks.Callback):
    """`step` (the optimizer's applied updates), `epoch`, `done` (steps of this
    epoch run so far, from the optimizer: Keras < 3.11 hands an execution's
    first step as `batch`, 3.11+ its last), `resumed_steps` (of an epoch
    resumed inside) and `at_update_boundary` (the last batch applied an
    update: always, but inside a --gradient_accumulation_steps update)."""

    def __init__(self, length, resumed_inside=(None, 0)):
        super().__init__()
        self.length = length
        self._inside = resumed_inside  # (epoch, steps already done in it)

    def on_train_begin(self, logs=None):
        self.step = optimizer_step(self.model)

    def on_epoch_begin(self, epoch, logs=None):
        self.resumed_steps = self._inside[1] if epoch == self._inside[0] else 0
        self._inside = (None, 0)
        self.epoch, self.done = epoch, self.resumed_steps
        self.step = optimizer_step(self.model)
        self._epoch_start_step = self.step - self.resumed_steps

    @property
    def planned(self):
        """The planned steps of this epoch."""
        return self.length.steps_in(self.epoch)

    def on_train_batch_end(self, batch, logs=None):
        step = optimizer_step(self.model)  # one read of the device counter per batch
        # Under gradient accumulation a batch is a micro-batch, and the step (the
        # optimizer's applied updates) moves only on the last of an update's.
        self.at_update_boundary = step != self.step
        self.step = step
        self.done = self.step - self._epoch_start_step
        short = not self.length.phases and self.planned < self.length.steps_per_epoch
        if short and self.done >= self.planned:
            self.model.stop_training = True  # the end of a short last epoch

    def on_epoch_end(self, epoch, logs=None):
        self.step = optimizer_step(self.model)


class ReseedDropout(keras.callbacks.Callback):
    """Per epoch, the model's seed generators (dropout) start from (seed,
    epoch), so that a resumed epoch draws what the uninterrupted one drew;
    an epoch resumed inside starts from the generators' saved state. The
    counter of epoch e starts at (e + 1) << 32 (int64 state, on TensorFlow)
    or (e + 1) << 20 (uint32, on JAX: 2^20 draws an epoch, 4095 epochs)."""

    def __init__(self, counter, saved_states):
        super().__init__()
        self.counter, self.saved_states = counter, saved_states

    def on_epoch_begin(self, epoch, logs=None):
        # Keras's save_weights leaves out the generators' state.
        saved = self.saved_states if self.counter.resumed_steps else {}
        for variable in seed_generators(self.model):
            if variable.path in saved:
                variable.assign(saved[variable.path])
            else:
                state = keras.ops.convert_to_numpy(variable)
                shift = 32 if state.dtype.itemsize == 8 else 20
                variable.assign(np.array([state[0], (epoch + 1) << shift], state.dtype))


def seed_generators(model):
    return [v for v in model.variables if v.path.endswith("seed_generator_state")]


def seed_generator_states(model):
    """{path: state} of the model's seed generators, for a checkpoint."""
    return {v.path: keras.ops.convert_to_numpy(v).tolist() for v in seed_generators(model)}


class Throughput(keras.callbacks.Callback):
    """Training images/s of an epoch: B * (steps between its first and last
    batch) / (their time less the evaluations between them), leaving out
    tracing and the pipeline's start. With one execution per epoch, the
    epoch's steps over its time, from the second epoch of this process on
    (the first traces). Each rate measured is also appended to `measured` (a
    list: this process's rates, which the summary reports; the history
    restored from a checkpoint holds those of earlier processes).

    `evaluation_seconds`: the seconds of the epoch's evaluations so far,
    Keras's at the epoch end (its on_test_begin / on_test_end) and those
    made within `evaluation()`."""

    def __init__(self, counter, global_batch_size, measured=None):
        super().__init__()
        self.counter, self.global_batch_size = counter, global_batch_size
        self.measured = [] if measured is None else measured
        self._traced = False  # an epoch ran in this process (its functions are traced)
        self.batch_of_epoch = None  # epoch -> its global batch, under --batch_schedule
        self.evaluation_seconds, self._test_started = 0.0, None

    def on_epoch_begin(self, epoch, logs=None):
        self.started, self._first, self._last = time.time(), None, None
        self.evaluation_seconds = 0.0
        if self.batch_of_epoch is not None:
            self.global_batch_size = self.batch_of_epoch(epoch)

    def on_test_begin(self, logs=None):
        self._test_started = time.time()

    def on_test_end(self, logs=None):
        self.evaluation_seconds += time.time() - self._test_started

    @contextlib.contextmanager
    def evaluation(self):
        """Times an evaluation made within the epoch (Model.evaluate called
        without this callback)."""
        started = time.time()
        try:
            yield
        finally:
            self.evaluation_seconds += time.time() - started

    def on_train_batch_end(self, batch, logs=None):
        mark = (self.counter.done, time.time(), self.evaluation_seconds)
        if self._first is None:
            self._first = mark
        self._last = mark

    def epoch_rate(self):
        """This epoch's images/s, or None when it cannot be measured."""
        (first, t0, e0), (last, t1, e1) = self._first, self._last
        rate, training = None, (t1 - t0) - (e1 - e0)
        if last > first and training > 0:
            rate = round((last - first) * self.global_batch_size / training, 2)
        elif self._traced and t1 - self.started - e1 > 0:
            rate = round(last * self.global_batch_size / (t1 - self.started - e1), 2)
        self._traced = True
        if rate is not None:
            self.measured.append(rate)
        return rate


class LearningRateLog(keras.callbacks.Callback):
    """Adds the scheduled learning rate at the epoch's last step to the logs."""

    def __init__(self, counter, schedule):
        super().__init__()
        self.counter, self.schedule = counter, schedule

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            rate = self.schedule(self.counter.step)
            logs["learning_rate"] = float(keras.ops.convert_to_numpy(rate))


class BatchLog(keras.callbacks.Callback):
    """Under --batch_schedule / --image_size_schedule, adds the epoch's global
    batch and image size to the logs (history, summary.json, TensorBoard's
    epoch_global_batch_size and epoch_image_size)."""

    def __init__(self, length, image_size):
        super().__init__()
        self.length, self.image_size = length, image_size

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            phase = self.length.phase_of(epoch)
            logs["global_batch_size"] = phase.global_batch_size
            logs["image_size"] = phase.image_size or self.image_size


class ProgressLine(keras.callbacks.Callback):
    """Off a terminal (batch jobs, log files), `epoch e/E: step s/S, loss l`
    at most every `every_seconds` within an epoch."""

    def __init__(self, counter, every_seconds):
        super().__init__()
        self.counter, self.every_seconds = counter, every_seconds

    def on_epoch_begin(self, epoch, logs=None):
        self._logged_at = time.time()

    def on_train_batch_end(self, batch, logs=None):
        every = self.every_seconds
        if not every or sys.stdout.isatty() or time.time() - self._logged_at < every:
            return
        self._logged_at = time.time()
        loss = (logs or {}).get("loss")
        shown = "" if loss is None else f", loss {float(keras.ops.convert_to_numpy(loss)):.4f}"
        counter = self.counter
        print(
            f"epoch {counter.epoch + 1}/{counter.length.epochs}: "
            f"step {counter.done}/{counter.planned}{shown}",
            flush=True,
        )


class ProgressBar(keras.callbacks.ProgbarLogger):
    """Keras's progress bar (one line per epoch when not on a terminal),
    sized to each epoch's planned steps."""

    def __init__(self, length):
        super().__init__()
        self.length = length

    def set_params(self, params):
        super().set_params(params)
        self.verbose = 1 if sys.stdout.isatty() else 2
        self.epochs = self.length.epochs  # the run's, not this fit's (a resume's first)
        self._fit_steps = params.get("steps") or self.length.steps_per_epoch

    def on_epoch_begin(self, epoch, logs=None):
        # The fit's own steps: fewer in an epoch resumed from inside.
        self.target = min(self.length.steps_in(epoch), self._fit_steps)
        super().on_epoch_begin(epoch, logs)


def log_writers(config):
    """TensorBoard (if installed) and, with --trust_ratio_log_every, the trust
    ratios, under <model_dir>/logs."""
    logs = os.path.join(config.model_dir, "logs")
    found = []
    if importlib.util.find_spec("tensorboard") is None:
        print(
            "warning: the tensorboard package is not installed "
            "(pip install tensorboard): no TensorBoard logs.",
            file=sys.stderr,
        )
    elif tensorflow_or_none.tf is None:  # Keras writes them through it
        print(
            "warning: no TensorBoard logs: Keras writes them through TensorFlow, which is not "
            f"installed; {tensorflow_or_none.INSTALL} adds it.",
            file=sys.stderr,
        )
    else:
        found.append(keras.callbacks.TensorBoard(logs, write_graph=False))
    if config.trust_ratio_log_every:
        found.append(
            keras_lars.TrustRatioMonitor(
                os.path.join(logs, "trust_ratios"), config.trust_ratio_log_every
            )
        )
    return found
