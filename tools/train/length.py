"""How long the run is, in steps: an epoch is one pass over the training set
(drop remainder), steps_per_epoch = floor(N / B)."""

import dataclasses
import math

import keras_lars
from keras_lars.tools.settings import ConfigError


@dataclasses.dataclass(frozen=True)
class RunLength:
    """The run's steps: per full epoch, in all, and of the warmup."""

    steps_per_epoch: int
    total_steps: int
    warmup_steps: int

    @property
    def epochs(self):
        return math.ceil(self.total_steps / self.steps_per_epoch)

    def steps_in(self, epoch):
        return min(self.steps_per_epoch, self.total_steps - epoch * self.steps_per_epoch)


def run_length(config, num_train):
    """The RunLength of `config` on `num_train` examples; a ConfigError names
    the flag when the batch, --steps_per_execution or the warmup does not fit."""
    if config.global_batch_size > num_train:
        raise ConfigError(
            f"--global_batch_size={config.global_batch_size} exceeds the "
            f"{num_train} training examples: an epoch would have no step."
        )
    per_epoch = keras_lars.steps_per_epoch(num_train, config.global_batch_size)
    total = config.train_steps or config.train_epochs * per_epoch
    warmup = keras_lars.epochs_to_steps(config.warmup_epochs, num_train, config.global_batch_size)
    length = RunLength(per_epoch, total, warmup)
    k = config.steps_per_execution
    for steps in sorted({length.steps_in(e) for e in range(length.epochs)}):
        if steps % k:
            raise ConfigError(
                f"--steps_per_execution={k} must divide the steps of every epoch "
                f"({steps} here; {per_epoch} per full epoch), since checkpoints and "
                "evaluation happen at epoch ends."
            )
    if warmup > total:
        raise ConfigError(
            f"--warmup_epochs={config.warmup_epochs} ({warmup} steps) is longer than "
            f"the training ({total} steps): lower it or train longer."
        )
    return length
