"""--save_weights_at_steps: the model's weights at chosen optimizer steps, kept
(the checkpoints keep the last two only), for measurements at fixed weights
such as keras_lars.measure_noise_scale."""

import os

import keras

WEIGHTS = "weights"  # in the model dir


def weights_path(model_dir, step):
    """The file of the weights saved after `step` optimizer steps."""
    return os.path.join(model_dir, WEIGHTS, f"step-{step:06d}.weights.h5")


class SavedWeights(keras.callbacks.Callback):
    """Saves the model's weights after each step of `steps` (0: before the
    first), once: a step already saved (a resumed run) is kept. `counter`:
    the run's StepCounter, earlier in the callbacks."""

    def __init__(self, counter, steps, model_dir):
        super().__init__()
        self.counter, self.model_dir = counter, model_dir
        self.steps = frozenset(map(int, steps))

    def _save(self, step):
        path = weights_path(self.model_dir, step)
        if step in self.steps and not os.path.exists(path):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            self.model.save_weights(path)

    def on_train_begin(self, logs=None):
        self._save(self.counter.step)

    def on_train_batch_end(self, batch, logs=None):
        if self.counter.at_update_boundary:
            self._save(self.counter.step)
