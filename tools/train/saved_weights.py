"""--save_weights_at_steps: the model's weights at chosen optimizer steps, kept
(the checkpoints keep the last two only), for measurements at fixed weights
such as keras_lars.measure_noise_scale."""

import os

import keras

import keras_lars

WEIGHTS = "weights"  # in the model dir


def weights_path(model_dir, step):
    """The file of the weights saved after `step` optimizer steps."""
    return os.path.join(model_dir, WEIGHTS, f"step-{step:06d}.weights.h5")


class SavedWeights(keras.callbacks.Callback):
    """Saves the model's weights after each step of `steps` (0: before the
    first). Every process saves, only the chief's file is kept
    (`keras_lars.distribute.save_on_chief`: gathering sharded weights takes
    all processes, so the decision to save depends on the step alone, not on
    a file one of them may have written). A resumed run saves its first step
    again: the same weights, as the resume is exact. `counter`: the run's
    StepCounter, earlier in the callbacks."""

    def __init__(self, counter, steps, model_dir, strategy):
        super().__init__()
        self.counter, self.model_dir, self.strategy = counter, model_dir, strategy
        self.steps = frozenset(map(int, steps))

    def _save(self, step):
        if step not in self.steps:
            return
        name = os.path.basename(weights_path(self.model_dir, step))

        def save(directory):
            os.makedirs(directory, exist_ok=True)
            self.model.save_weights(os.path.join(directory, name))

        directory = os.path.dirname(weights_path(self.model_dir, step))
        keras_lars.distribute.save_on_chief(save, directory, self.strategy)

    def on_train_begin(self, logs=None):
        self._save(self.counter.step)

    def on_train_batch_end(self, batch, logs=None):
        if self.counter.at_update_boundary:
            self._save(self.counter.step)
