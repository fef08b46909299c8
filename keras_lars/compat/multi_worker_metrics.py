"""keras#20585 / tensorflow#72388 (2): metric reduction under MultiWorkerMirroredStrategy.

After each step Keras averages the per-replica logs; in multi-worker mode it
calls `strategy.reduce("MEAN", v, axis=0)`, which fails on the scalar loss
and metrics. The replica mean Keras means here (the one it computes for
single-worker strategies, `reduce_mean(values, axis=0)` over replicas) is
`strategy.reduce("MEAN", v, axis=None)`:

    log = (1/R) sum_r v_r
"""

import keras

from keras_lars._internals import first_mismatch
from keras_lars.compat._workaround import REPRODUCED_ON_MATRIX
from keras_lars.compat._workaround import Workaround
from keras_lars.compat._workaround import swap
from keras_lars.compat._workaround import trainer_module


def install():
    trainer = trainer_module()
    original = trainer.reduce_per_replica

    def reduce_per_replica(values, strategy, reduction):
        if reduction in ("auto", "mean") and (
            trainer._collective_all_reduce_multi_worker(strategy)
        ):
            return keras.tree.map_structure(lambda v: strategy.reduce("MEAN", v, axis=None), values)
        return original(values, strategy, reduction)

    return swap(trainer, "reduce_per_replica", reduce_per_replica)


def shape():
    trainer = trainer_module()
    return first_mismatch(
        (trainer, "reduce_per_replica", ["values", "strategy", "reduction"]),
        (trainer, "_collective_all_reduce_multi_worker", ["strategy"]),
    )


WORKAROUND = Workaround(
    "multi_worker_metrics",
    "keras#20585, tensorflow#72388",
    "fit() under MultiWorkerMirroredStrategy fails reducing scalar metrics with axis=0",
    "crash",
    install,
    shape,
    reproduced=REPRODUCED_ON_MATRIX,
)
