"""The Keras and TensorFlow internals keras_lars relies on, and their checks.

keras_lars overrides a few private Keras methods (`LayerwiseOptimizer` clips
after the all-reduce) and `keras_lars.compat` patches others. Each such use
is gated: the installed version must lie in the range it was verified on
(the version matrix of noxfile.py), and its target must still have the
signature it was written for. Otherwise the feature that needs it refuses
with `UnsupportedVersionError`, naming the versions.
"""

import inspect

import keras

from keras_lars._environment import _version

# Inclusive (major, minor) ranges the overrides and patches were verified on.
KERAS_VERIFIED = ((3, 8), (3, 15))
TENSORFLOW_VERIFIED = ((2, 17), (2, 21))
# Keras's JAX backend trains under keras.distribution as on one device from
# 3.10 on. Before (measured 2026-12-01 on 8 simulated CPU devices):
# - an optimizer slot of a sharded variable stays replicated (keras PR #21264
#   gives it the variable's layout, in 3.10), and a (batch, model) mesh leaves
#   one device's path: on 2x4, after 8 steps, Keras 3.8 and 3.9 with jax 0.5.3
#   and 0.6.0: SGD 0.52, Adam 1.28, LARS 0.68 (relative);
# - the training tool's data-parallel first step over 8 devices left one
#   device's in 2 of 3 runs by 0.134 (Keras 3.8.0, jax 0.5.3); Keras 3.10.0
#   with the same jax and TensorFlow: 3 of 3 within 8e-6.
DISTRIBUTION_SINCE = (3, 10)
_DISTRIBUTION_FAULTS = {
    "model": "keeps the optimizer slots of sharded variables replicated, so model-parallel "
    "training differs from one device (keras PR #21264, fixed in Keras 3.10)",
    "data": "trains the tool's data-parallel steps differently from one device in some runs",
}


class UnsupportedVersionError(RuntimeError):
    """A keras_lars feature needs Keras/TensorFlow internals (or a compat
    workaround) that this install does not have."""


def installed_version(package):
    """(major, minor, patch) of "keras" or "tensorflow"."""
    if package == "keras":
        return _version(keras.__version__)
    import tensorflow as tf

    return _version(tf.__version__)


def dotted(version):
    return ".".join(str(part) for part in version)


def package_name(package):
    return "Keras" if package == "keras" else "TensorFlow"


def describe_versions(package, verified):
    """'Keras 3.8 to 3.15' style text of an inclusive range."""
    low, high = verified
    return f"{package_name(package)} {dotted(low)} to {dotted(high)}"


def signature_mismatch(owner, attribute, parameters):
    """None if `owner.attribute` is a function taking exactly `parameters`
    (names, in order; None: any), else a sentence saying what differs."""
    target = getattr(owner, attribute, None)
    label = f"{getattr(owner, '__name__', owner)}.{attribute}"
    if target is None:
        return f"{label} does not exist"
    if parameters is None:
        return None if callable(target) else f"{label} is not a function"
    try:
        found = list(inspect.signature(target).parameters)
    except (TypeError, ValueError):
        return f"{label} is not a function"
    if found != list(parameters):
        return f"{label} takes ({', '.join(found)}), expected ({', '.join(parameters)})"
    return None


def first_mismatch(*checks):
    """The first non-None of several (owner, attribute, parameters) checks."""
    for owner, attribute, parameters in checks:
        mismatch = signature_mismatch(owner, attribute, parameters)
        if mismatch:
            return mismatch
    return None


def problem(package, verified, shape):
    """None if the installed `package` lies in `verified` and `shape()`
    (None, or what differs) finds its targets as written for; else why not."""
    version = installed_version(package)
    low, high = verified
    if not low <= version[:2] <= high:
        return (
            f"{package_name(package)} {dotted(version)} is outside the "
            f"versions it was verified on ({dotted(low)} to {dotted(high)})"
        )
    mismatch = shape()
    if mismatch:
        return f"its target changed in {package_name(package)} {dotted(version)}: {mismatch}"
    return None


def sharded(variable):
    """Whether `variable` (on JAX) is split over devices, not replicated."""
    spec = getattr(getattr(getattr(variable, "value", None), "sharding", None), "spec", ())
    return any(axis is not None for axis in spec)


def distribution_problem(parallelism):
    """None where this Keras trains `parallelism` ("model" or "data") under
    keras.distribution on JAX as on one device (DISTRIBUTION_SINCE), else why not."""
    version = installed_version("keras")
    if version[:2] >= DISTRIBUTION_SINCE:
        return None
    since = dotted(DISTRIBUTION_SINCE)
    return (
        f"Keras {dotted(version)}'s JAX backend {_DISTRIBUTION_FAULTS[parallelism]}: "
        f"use Keras >= {since}"
    )


def replicas_in_sync():
    """The number of replicas of the current tf.distribute context (1 on
    other backends, or outside any strategy)."""
    if keras.backend.backend() != "tensorflow":
        return 1
    import tensorflow as tf

    context = tf.distribute.get_replica_context()
    if context is not None:
        return context.num_replicas_in_sync
    return tf.distribute.get_strategy().num_replicas_in_sync


def in_one_of_several_replicas():
    """Whether this code runs inside one replica of several (a replica
    context whose gradients the optimizer all-reduces)."""
    if keras.backend.backend() != "tensorflow":
        return False
    import tensorflow as tf

    return tf.distribute.get_replica_context() is not None and replicas_in_sync() > 1
