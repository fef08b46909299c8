"""The one place for workarounds of Keras / TensorFlow bugs (most of them
in distributed training).

Nothing is patched at import. One documented call installs every
workaround that the installed versions need:

    import keras_lars
    keras_lars.compat.apply()          # or: with keras_lars.compat.patched(): ...
    keras_lars.compat.apply(behaviour_changes=False)   # crash fixes only

`keras_lars.make_strategy` calls it for the strategies that need it (on one
device, call it yourself: `iterations_after_data` concerns every strategy).
`apply()` is idempotent; `unapply()` restores Keras's own code, and
`unpatched()` runs a block on Keras's own code (tests use it to show each
bug's symptom).

Each workaround is one module of this package, named after it, holding its
patch (`install`), the check of the internals it replaces (`shape`) and its
`Workaround(...)` entry: the upstream issue, the versions of Keras (or
TensorFlow) that have the symptom (`since` <= version < `fixed_in`) and the
versions its patch was verified on (`verified`). `_registry.WORKAROUNDS`
lists them in order. A workaround is installed only where the symptom is,
on the TensorFlow backend, and only if the installed version is inside
`verified` and its target still has the shape it was written for.
Otherwise it is not installed: `apply()` warns once (`CompatWarning`) and
the keras_lars features that need it refuse with `UnsupportedVersionError`,
via `require()`. Installing is logged once per workaround on the
"keras_lars" logger.

Two kinds: "crash" fixes make something work that fails on Keras's own
code; "behaviour" changes alter numbers Keras computes without failing
(batch-norm statistics and evaluate/predict, metric states, the step
count). `apply(behaviour_changes=False)` (and
`make_strategy(..., behaviour_changes=False)`) installs the crash fixes
only. `table()` renders the registry as Markdown (docs/workarounds.md).

Only Keras and TensorFlow are patched, never keras_lars: clipping after the
all-reduce and the low-precision all-reduce are `LayerwiseOptimizer`'s own.

The versions, for programs that check before they start (the training and
planning tools do): `installed_version()` and `dotted()`;
`distribution_problem()`, why this Keras and jax would not train under
keras.distribution as one device does (None where they do); and
`record_state_shardings()`, what a JAX train step lowered outside fit needs
on the Keras versions of `RECORDED_STATE_SHARDINGS`.
"""

from keras_lars import _internals
from keras_lars._internals import KERAS_VERIFIED
from keras_lars._internals import RECORDED_STATE_SHARDINGS
from keras_lars._internals import UnsupportedVersionError
from keras_lars._internals import distribution_problem
from keras_lars._internals import dotted
from keras_lars._internals import record_state_shardings
from keras_lars.compat._registry import WORKAROUNDS
from keras_lars.compat._registry import applied
from keras_lars.compat._registry import apply
from keras_lars.compat._registry import patched
from keras_lars.compat._registry import require
from keras_lars.compat._registry import table
from keras_lars.compat._registry import unapply
from keras_lars.compat._registry import unpatched
from keras_lars.compat._workaround import CompatWarning
from keras_lars.compat._workaround import Workaround

__all__ = [
    "apply",
    "unapply",
    "applied",
    "require",
    "table",
    "patched",
    "unpatched",
    "WORKAROUNDS",
    "Workaround",
    "CompatWarning",
    "UnsupportedVersionError",
    "KERAS_VERIFIED",
    "installed_version",
    "dotted",
    "distribution_problem",
    "RECORDED_STATE_SHARDINGS",
    "record_state_shardings",
]


def installed_version(package):
    """(major, minor, patch) of the installed "keras", "tensorflow" or "jax"
    (ints; e.g. (3, 15, 1))."""
    return _internals.installed_version(package)  # at each call: what tests replace
