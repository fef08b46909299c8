"""The Keras and TensorFlow internals keras_lars relies on, and their checks.

keras_lars overrides a few private Keras methods (`LayerwiseOptimizer` clips
after the all-reduce) and `keras_lars.compat` patches others. Each such use
is gated: the installed version must lie in the range it was verified on
(the version matrix of noxfile.py), and its target must still have the
signature it was written for. Otherwise the feature that needs it refuses
with `UnsupportedVersionError`, naming the versions.
"""

import importlib.metadata
import inspect

import keras

from keras_lars._environment import _version

# Inclusive (major, minor) ranges the overrides and patches were verified on.
KERAS_VERIFIED = ((3, 8), (3, 15))
"""Inclusive (major, minor) range of the Keras versions keras_lars's overrides
and workarounds were verified on."""
TENSORFLOW_VERIFIED = ((2, 17), (2, 21))
"""Inclusive (major, minor) range of the TensorFlow versions they were verified on."""
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
# From Keras 3.12 (which stopped constraining the state a JAX train_step returns
# to recorded shardings: RECORDED_STATE_SHARDINGS), keras.distribution on JAX
# needs jax 0.6 (TensorFlow 2.17 accepts jax 0.5.3 at most). Measured 2026-12-04,
# TF 2.18.1, 8 simulated CPU devices, the tool's float64 data-parallel first step
# against one device's: Keras 3.12.4 and 3.15.1 with jax 0.5.3 8.2e-3 (relative);
# Keras 3.15.1 with jax 0.6.0 3.1e-6; Keras 3.10.0 and 3.11.3 with jax 0.5.3
# 9.6e-15 each. On Keras 3.15.1 with jax 0.5.3 the model-parallel step also
# left one device's (0.134) and a 2-process run's all-reduce failed.
DISTRIBUTION_JAX_FLOOR = {(3, 12): (0, 6)}  # from this Keras on: at least this jax
# Several processes (jax.distributed) need jax 0.6.2, on any Keras. Measured
# 2026-12-04, TF 2.18.1, the tool's data-parallel float64 run in 2 processes x 4
# simulated CPU devices: with jax 0.5.3 (Keras 3.10.0, 3.11.3, 3.15.1), 0.6.0 and
# 0.6.1 (Keras 3.15.1) the processes' Gloo all-reduces paired messages of different
# steps ("op.preamble.length <= op.nbytes. 73728 vs 128") and one process aborted;
# with 0.6.2, 0.7.2 and 0.8.3 (Keras 3.15.1) the first step was within 3.2e-6 of
# one device's.
PROCESSES_JAX_FLOOR = (0, 6, 2)
_DISTRIBUTION_FAULTS = {
    "model": "keeps the optimizer slots of sharded variables replicated, so model-parallel "
    "training differs from one device (keras PR #21264, fixed in Keras 3.10)",
    "data": "trains the tool's data-parallel steps differently from one device in some runs",
}


# Keras 3.8 to 3.11's JAX train_step constrains the state it returns to the
# shardings fit() records on the model (Trainer._record_training_state_sharding_spec:
# the four lists below, read by _enforce_jax_state_sharding); 3.12 dropped both.
# A train step lowered outside fit (tools/plan/hlo_bytes.py) sets them itself.
# Verified on Keras 3.10.0 and 3.11.3 (3.8 and 3.9 run no keras.distribution in
# the tool).
RECORDED_STATE_SHARDINGS = ((3, 10), (3, 11))
"""Inclusive (major, minor) range of the Keras versions whose JAX train step
reads the state shardings fit records on the model (`record_state_shardings`)."""
STATE_SHARDING_ATTRIBUTES = (
    "_trainable_variable_shardings",
    "_non_trainable_variable_shardings",
    "_optimizer_variable_shardings",
    "_metrics_variable_shardings",
)


class UnsupportedVersionError(RuntimeError):
    """A keras_lars feature needs Keras/TensorFlow internals (or a compat
    workaround) that this install does not have."""


def installed_version(package):
    """(major, minor, patch) of "keras", "tensorflow" or "jax"."""
    if package == "keras":
        return _version(keras.__version__)
    if package == "jax":
        return _version(importlib.metadata.version("jax"))
    import tensorflow as tf

    return _version(tf.__version__)


def dotted(version):
    """The text of a version tuple: "3.10.0" of (3, 10, 0)."""
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


def distribution_problem(parallelism, processes=1):
    """None where this Keras and jax train `parallelism` ("model" or "data")
    under keras.distribution on JAX, in `processes` processes (0: as many as
    JAX detects), as on one device (DISTRIBUTION_SINCE, DISTRIBUTION_JAX_FLOOR,
    PROCESSES_JAX_FLOOR), else why not."""
    version = installed_version("keras")
    if version[:2] < DISTRIBUTION_SINCE:
        return (
            f"Keras {dotted(version)}'s JAX backend {_DISTRIBUTION_FAULTS[parallelism]}: "
            f"use Keras >= {dotted(DISTRIBUTION_SINCE)}"
        )
    jax_version = installed_version("jax")
    for since, floor in DISTRIBUTION_JAX_FLOOR.items():
        if version[:2] >= since and jax_version[:2] < floor:
            return (
                f"Keras {dotted(version)}'s JAX backend with jax {dotted(jax_version)} trains "
                f"{parallelism}-parallel steps differently from one device: use jax >= "
                f"{dotted(floor)} (TensorFlow >= 2.18 accepts it) or Keras < {dotted(since)}"
            )
    if processes != 1 and jax_version < PROCESSES_JAX_FLOOR:
        several = "several" if processes == 0 else processes
        return (
            f"jax {dotted(jax_version)} pairs the all-reduces of {several} processes "
            f"wrongly (one aborts): use jax >= {dotted(PROCESSES_JAX_FLOOR)} "
            "(TensorFlow >= 2.18 accepts it)"
        )
    return None


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


def record_state_shardings(model, shardings):
    """Gives a JAX `model` the shardings (trainable, non-trainable, optimizer,
    metrics: four lists) that its train_step constrains its returned state to,
    where this Keras reads them from the model (RECORDED_STATE_SHARDINGS; fit
    records them, a step lowered outside fit must). Elsewhere nothing is needed,
    or UnsupportedVersionError says why not."""
    trainer = type(model)
    if not hasattr(trainer, "_enforce_jax_state_sharding"):
        return
    reason = problem(
        "keras",
        RECORDED_STATE_SHARDINGS,
        lambda: (
            first_mismatch(
                (trainer, "_record_training_state_sharding_spec", ["self"]),
                (trainer, "_clear_jax_state_sharding", ["self"]),
            )
            or _recorded_attributes_mismatch(trainer)
        ),
    )
    if reason:
        raise UnsupportedVersionError(
            "lowering Keras's JAX train step outside fit needs the state shardings fit "
            f"records, but {reason}: use "
            f"{describe_versions('keras', RECORDED_STATE_SHARDINGS)} or Keras >= 3.12"
        )
    for name, part in zip(STATE_SHARDING_ATTRIBUTES, shardings, strict=True):
        setattr(model, name, list(part))


def _recorded_attributes_mismatch(trainer):
    """None if the attributes fit records are STATE_SHARDING_ATTRIBUTES (those
    Trainer._clear_jax_state_sharding sets to None), else what they are."""
    probe = type("Probe", (), {})()
    trainer._clear_jax_state_sharding(probe)
    if tuple(vars(probe)) != STATE_SHARDING_ATTRIBUTES:
        return f"fit records {', '.join(vars(probe))}"
    return None
