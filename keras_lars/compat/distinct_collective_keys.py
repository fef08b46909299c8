"""tensorflow#62790: several MirroredStrategy objects in one process.

Every MirroredStrategy numbers its collective groups from
1 + MirroredStrategy._collective_key_base, which is 0, so a second strategy
in the same process reuses the first one's group and instance keys: as soon
as it trains another model, its all-reduces fail with "Shape mismatch in
the collective instance 100" (TensorFlow's own tests raise that base before
each strategy for this reason). The patch gives the k-th MirroredStrategy
built while it is installed (k = 1, 2, ... over the process, never reused)
a key range of its own:

    base_k = base + _KEY_RANGE * k

MultiWorkerMirrored strategies are left alone (their workers must agree on
the keys).
"""

import itertools

from keras_lars._internals import TENSORFLOW_VERIFIED
from keras_lars._internals import signature_mismatch
from keras_lars.compat._workaround import REPRODUCED_ON_MATRIX
from keras_lars.compat._workaround import Workaround
from keras_lars.compat._workaround import swap

_KEY_RANGE = 100_000  # collective group keys reserved for each MirroredStrategy
_KEY_RANGES = itertools.count(1)  # shared by every install: keys are never reused


def install():
    from tensorflow.python.distribute import mirrored_strategy

    extended = mirrored_strategy.MirroredExtended
    original = extended._make_collective_ops_with_fallbacks

    def _make_collective_ops_with_fallbacks(self):
        self._collective_key_base += _KEY_RANGE * next(_KEY_RANGES)
        return original(self)

    return swap(
        extended, "_make_collective_ops_with_fallbacks", _make_collective_ops_with_fallbacks
    )


def shape():
    from tensorflow.python.distribute import mirrored_strategy

    if not isinstance(
        getattr(mirrored_strategy.MirroredStrategy, "_collective_key_base", None), int
    ):
        return "MirroredStrategy._collective_key_base is not an integer"
    return signature_mismatch(
        mirrored_strategy.MirroredExtended, "_make_collective_ops_with_fallbacks", ["self"]
    )


WORKAROUND = Workaround(
    "distinct_collective_keys",
    "tensorflow#62790",
    "a second MirroredStrategy in one process training another model: "
    '"Shape mismatch in the collective instance 100"',
    "crash",
    install,
    shape,
    package="tensorflow",
    since=(2, 0),
    verified=TENSORFLOW_VERIFIED,
    reproduced=REPRODUCED_ON_MATRIX,
)
