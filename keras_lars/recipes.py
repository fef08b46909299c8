"""Step arithmetic and published large-batch recipes (the linear scaling rule:
scaling.py). Plain Python: the tools read the recipes while they check their
flags, before Keras loads (keras_lars/__init__.py registers LarsRecipe with
Keras; learning_rate_schedule imports the schedule)."""

import dataclasses
import math

from keras_lars.validation import check_bool
from keras_lars.validation import check_integer
from keras_lars.validation import check_number

IMAGENET_TRAIN_EXAMPLES = 1281167


def steps_per_epoch(num_examples, global_batch_size, drop_remainder=True):
    """Optimizer steps in one pass over `num_examples` examples.

        floor(num_examples / global_batch_size)   drop_remainder=True
        ceil(num_examples / global_batch_size)    drop_remainder=False

    (`drop_remainder` as in `tf.data.Dataset.batch`.)
    """
    num_examples = check_integer("num_examples", num_examples, at_least=1)
    global_batch_size = check_integer("global_batch_size", global_batch_size, at_least=1)
    check_bool("drop_remainder", drop_remainder)
    if drop_remainder:
        steps = num_examples // global_batch_size
        if steps == 0:
            raise ValueError(
                f"`global_batch_size` ({global_batch_size}) exceeds "
                f"`num_examples` ({num_examples}): with drop_remainder=True "
                "an epoch has no step."
            )
        return steps
    return math.ceil(num_examples / global_batch_size)


def epochs_to_steps(epochs, num_examples, global_batch_size, drop_remainder=True):
    """Steps in `epochs` (may be fractional) epochs, to the nearest step:

    floor(epochs * steps_per_epoch(num_examples, global_batch_size,
                                   drop_remainder) + 1/2)
    """
    epochs = check_number("epochs", epochs, at_least=0.0)
    per_epoch = steps_per_epoch(num_examples, global_batch_size, drop_remainder)
    return math.floor(epochs * per_epoch + 0.5)


@dataclasses.dataclass(frozen=True)
class LarsRecipe:
    """Hyperparameters of a LARS training run (rates are absolute, not per 256)."""

    global_batch_size: int
    peak_learning_rate: float
    warmup_epochs: float
    train_epochs: float
    momentum: float
    weight_decay: float
    end_learning_rate: float = 1e-4
    power: float = 2.0
    label_smoothing: float = 0.1
    epsilon: float = 0.0

    def learning_rate_schedule(
        self,
        num_examples=IMAGENET_TRAIN_EXAMPLES,
        train_epochs=None,
        drop_remainder=True,
    ):
        """The recipe's `WarmupPolyDecay` for a data set of `num_examples`.

        `train_epochs` overrides the recipe's; warmup stays at
        `warmup_epochs` (capped at the run's length).
        """
        from keras_lars.schedules import WarmupPolyDecay

        epochs = self.train_epochs if train_epochs is None else train_epochs
        total = epochs_to_steps(epochs, num_examples, self.global_batch_size, drop_remainder)
        warmup = epochs_to_steps(
            self.warmup_epochs, num_examples, self.global_batch_size, drop_remainder
        )
        return WarmupPolyDecay(
            peak_learning_rate=self.peak_learning_rate,
            warmup_steps=min(warmup, total),
            total_steps=total,
            power=self.power,
            end_learning_rate=self.end_learning_rate,
        )

    def get_config(self):
        return dataclasses.asdict(self)

    @classmethod
    def from_config(cls, config):
        return cls(**config)


def resnet50_lars_recipe(global_batch_size):
    """ResNet-50 on ImageNet with LARS, by global batch size.

    Source: Google's MLPerf Training v0.7 ResNet-50 submission (JAX, TPU
    v3), mlcommons/training_results_v0.7,
    Google/benchmarks/resnet/implementations/resnet-research-JAX-tpu-v3-8192/
    train.py (`polynomial_learning_rate_fn` and `main`):

        batch          peak lr   warmup ep  epochs  momentum   weight decay
        < 16K          10        5          56      0.9        2e-4
        16K - < 32K    25        5          56      0.9        2e-4
        32K - < 64K    29        18         64      0.929      1e-4
        >= 64K         23.0810   33         92      0.953721   1e-4

    with end rate 1e-4, power 2, label smoothing 0.1, LARS epsilon 0, and
    biases / batch-norm parameters trained with plain momentum and no weight
    decay (`keras_lars.LARS`'s default `exclude_rank_one=True`). The reference
    counts fractional epochs (1281167 / batch steps each) and warms up from
    rate 0 at step 0; see `WarmupPolyDecay` for the one-step difference.
    """
    batch = check_integer("global_batch_size", global_batch_size, at_least=1)
    if batch < 16384:
        peak, warmup = 10.0, 5
    elif batch < 32768:
        peak, warmup = 25.0, 5
    elif batch < 65536:
        peak, warmup = 29.0, 18
    else:
        peak, warmup = 23.080977304670448, 33
    if batch < 32768:
        epochs, momentum, weight_decay = 56, 0.9, 2e-4
    elif batch < 65536:
        epochs, momentum, weight_decay = 64, 0.929, 1e-4
    else:
        epochs, momentum, weight_decay = 92, 0.9537213777059405, 1e-4
    return LarsRecipe(
        global_batch_size=batch,
        peak_learning_rate=peak,
        warmup_epochs=warmup,
        train_epochs=epochs,
        momentum=momentum,
        weight_decay=weight_decay,
    )
