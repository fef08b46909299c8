"""Checkpointing: the run's state after every epoch, within epochs on request,
at the step a preemption asks for (then Preempted stops the run) and at the
evaluation that decides --target_accuracy: reached, or collapsed (then
TargetDecided).

The state of a checkpoint: {"epochs_done", "steps_done", "history",
"seed_generators", "settings" (config.json's record: a resume checks it when
config.json is gone), "layout" (workers and replicas: model_dir.check_layout),
"evaluations" and once decided "target" or "collapsed" (target.py), and
after a divergence "rate_factor", "rollbacks"}.
"""

import sys
import time

import keras

from keras_lars.tools import checkpoints
from keras_lars.tools import storage
from keras_lars.tools.train import model_dir
from keras_lars.tools.train import run_callbacks
from keras_lars.tools.train import target
from keras_lars.tools.train.preemption import Preempted


class Checkpointing(keras.callbacks.Callback):
    """Saves at every epoch end (with the epoch's record appended to the
    history), within epochs every --checkpoint_every_steps steps or
    --checkpoint_every_minutes, and at the first step boundary after a
    preemption (this process's signal, or the cluster's agreed step), then
    raises Preempted."""

    def __init__(self, run, state, counter, throughput):
        super().__init__()
        self.run, self.state = run, state
        self.counter, self.throughput = counter, throughput
        self._cluster = None  # the runtime's cluster preemption, made once

    @property
    def config(self):
        return self.run.config

    def on_train_begin(self, logs=None):
        self._saved_at = (self.counter.step, time.time())  # (step, time) of the last save
        if self._cluster is None:
            self._cluster = self.run.runtime.cluster_preemption(
                self._save_for_cluster, self._stop_for_cluster
            )

    def _save_for_cluster(self):
        if self.counter.done < self.counter.planned:  # else the epoch's end saves
            self._save(self.counter.epoch, self.counter.done)

    def _stop_for_cluster(self):
        self.run.preemption.signal = "SIGTERM"
        print(
            "a process of the cluster received SIGTERM: every process stops at this step",
            file=sys.stderr,
            flush=True,
        )

    def on_train_batch_end(self, batch, logs=None):
        step, done = self.counter.step, self.counter.done
        self._cluster.at_step(step, done)
        if done >= self.counter.planned or not self.counter.at_update_boundary:
            return  # the epoch's end saves; a checkpoint holds no half-accumulated update
        if self._due(step) or target.decided(self.state):
            if self._saved_at[0] != step:
                self._save(self.counter.epoch, done)
            self._stop_if_preempted(done)
            self._stop_if_decided()

    def _due(self, step):
        if self.run.preemption.signal:
            return True
        last_step, last_time = self._saved_at
        every = self.config.checkpoint_every_steps
        if every and step // every > last_step // every:
            return True
        minutes = self.config.checkpoint_every_minutes
        return bool(minutes) and time.time() - last_time >= 60 * minutes

    def on_epoch_end(self, epoch, logs=None):
        # convert_to_numpy: Keras 3.8 leaves a metric result that is an
        # on-read variable (compat's on_read_metric_variables) unconverted.
        record = {k: float(keras.ops.convert_to_numpy(v)) for k, v in (logs or {}).items()}
        record.update(
            epoch=epoch + 1,
            steps=self.counter.step,
            seconds=round(time.time() - self.throughput.started, 3),
            evaluation_seconds=round(self.throughput.evaluation_seconds, 3),
        )
        rate = self.throughput.epoch_rate()
        if rate is not None:
            record["images_per_second"] = rate
        self.state["history"].append(record)
        self.state["epochs_done"], self.state["steps_done"] = epoch + 1, 0
        self._save(epoch + 1, 0)
        self._stop_if_decided()
        if epoch + 1 < self.run.length.epochs:
            self._stop_if_preempted(self.run.length.steps_in(epoch))

    def _save(self, epochs_done, steps_done):
        state = dict(self.state, epochs_done=epochs_done, steps_done=steps_done)
        state["seed_generators"] = run_callbacks.seed_generator_states(self.model)
        strategy = self.run.runtime.strategy
        state[model_dir.SETTINGS] = self.run.record
        state[model_dir.LAYOUT] = model_dir.layout(strategy)
        first = model_dir.write_config_once(self.config, self.run.record, strategy)
        directory = model_dir.checkpoint_dir(self.config.model_dir)
        try:
            checkpoints.save(self.model, directory, epochs_done, state, strategy, steps_done)
        except storage.StorageError:
            if first:  # no checkpoint: the directory stays open to other settings
                model_dir.remove_config(self.config)
            raise
        self._saved_at = (self.counter.step, time.time())
        self._saved_stem = checkpoints.stem(directory, epochs_done, steps_done)

    def _stop_if_decided(self):
        if target.decided(self.state):
            raise target.TargetDecided(f"checkpoint {self._saved_stem}")

    def _stop_if_preempted(self, done):
        if self.run.preemption.signal:
            raise Preempted(
                f"stopped by {self.run.preemption.signal} at step {self.counter.step} (epoch "
                f"{self.counter.epoch + 1}, {done} of its {self.counter.planned} steps); "
                f"checkpoint {self._saved_stem}; run the same command to resume"
            )
