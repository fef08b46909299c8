"""The linear scaling rule, in plain Python: no Keras is imported (the
training tool checks its flags with it before Keras loads)."""

from keras_lars.validation import check_integer
from keras_lars.validation import check_number


def linear_scaling(base_learning_rate, global_batch_size, base_batch_size=256):
    """The linear scaling rule (Goyal et al. 2017).

    lr = base_learning_rate * global_batch_size / base_batch_size
    """
    base_learning_rate = check_number("base_learning_rate", base_learning_rate, at_least=0.0)
    global_batch_size = check_integer("global_batch_size", global_batch_size, at_least=1)
    base_batch_size = check_integer("base_batch_size", base_batch_size, at_least=1)
    return base_learning_rate * global_batch_size / base_batch_size
