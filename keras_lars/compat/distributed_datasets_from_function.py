"""keras#20134: fit() on strategy.distribute_datasets_from_function (Keras < 3.9).

Keras before 3.9 does not recognise the dataset that
`strategy.distribute_datasets_from_function` returns (its `is_tf_dataset`
knows DatasetV2 and DistributedDataset only), so `fit()` on it fails with
"Unrecognized data type". keras PR #20829 (Keras 3.9) adds the class to that
list; so does the patch.
"""

from keras_lars._internals import signature_mismatch
from keras_lars.compat._workaround import Workaround
from keras_lars.compat._workaround import swap


def install():
    from keras.src.trainers import data_adapters

    original = data_adapters.is_tf_dataset

    def is_tf_dataset(x):
        return original(x) or any(
            parent.__name__ == "DistributedDatasetsFromFunction"
            and parent.__module__.startswith("tensorflow.python.")
            for parent in type(x).__mro__
        )

    return swap(data_adapters, "is_tf_dataset", is_tf_dataset)


def shape():
    from keras.src.trainers import data_adapters

    return signature_mismatch(data_adapters, "is_tf_dataset", ["x"])


WORKAROUND = Workaround(
    "distributed_datasets_from_function",
    "keras#20134",
    'fit() on strategy.distribute_datasets_from_function(...): "Unrecognized data type"',
    "crash",
    install,
    shape,
    fixed_in=(3, 9),
    verified=((3, 8), (3, 8)),
    reproduced="Keras 3.8 with TensorFlow 2.17 and 2.18 (absent from 3.9 on)",
)
