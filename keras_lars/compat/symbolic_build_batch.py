"""keras#20585 / tensorflow#72388 (1): the symbolic build under MultiWorkerMirroredStrategy.

fit()/evaluate() build the model from a first batch, which Keras takes as
`strategy.reduce("MEAN", batch, axis=None)` of the whole distributed
(x, y, sample_weight) structure. Under MultiWorkerMirroredStrategy that
reduce is a collective on a nested structure and fails; it is also
needless, since only the shapes and dtypes are used. The patch hands Keras
the first local replica's batch instead.
"""

import keras

from keras_lars._internals import UnsupportedVersionError
from keras_lars._internals import signature_mismatch
from keras_lars.compat._workaround import REPRODUCED_ON_MATRIX
from keras_lars.compat._workaround import Workaround
from keras_lars.compat._workaround import swap
from keras_lars.compat._workaround import trainer_module


def install():
    import tensorflow as tf

    trainer_class = trainer_module().TensorFlowTrainer
    original = trainer_class._maybe_symbolic_build

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        if iterator is not None and self._distribute_strategy is not None:
            strategy = self.distribute_strategy
            for item in iterator:
                # Keras 3.7-3.10 yield (step, batches), 3.11+ (begin, end, batches).
                if not isinstance(item, tuple) or len(item) not in (2, 3):
                    raise UnsupportedVersionError(
                        "keras_lars.compat's `symbolic_build_batch` expected Keras's "
                        "epoch iterator to yield (step, batches) or (begin, end, "
                        f"batches), got {type(item).__name__} on Keras {keras.__version__}; "
                        f"it was verified on {WORKAROUND.describe_versions()}."
                    )
                data_batch = tf.nest.map_structure(
                    lambda v: strategy.experimental_local_results(v)[0],
                    next(item[-1]),
                )
                break
            iterator = None
        return original(self, iterator=iterator, data_batch=data_batch)

    return swap(trainer_class, "_maybe_symbolic_build", _maybe_symbolic_build)


def shape():
    return signature_mismatch(
        trainer_module().TensorFlowTrainer,
        "_maybe_symbolic_build",
        ["self", "iterator", "data_batch"],
    )


WORKAROUND = Workaround(
    "symbolic_build_batch",
    "keras#20585, tensorflow#72388",
    'fit() under MultiWorkerMirroredStrategy: "Attempt to convert a value (PerReplica...)"',
    "crash",
    install,
    shape,
    reproduced=REPRODUCED_ON_MATRIX,
)
