"""The registry: every workaround in order, and which of them are installed.

`WORKAROUNDS` fixes the order in which `apply()` installs them (and
`unapply()` removes them, newest first) and the rows of `table()`.
"""

import contextlib
import logging
import warnings

from keras_lars._internals import UnsupportedVersionError
from keras_lars._internals import dotted
from keras_lars._internals import package_name
from keras_lars.compat import distinct_collective_keys
from keras_lars.compat import distributed_datasets_from_function
from keras_lars.compat import iterations_after_data
from keras_lars.compat import mean_batch_norm_statistics
from keras_lars.compat import multi_worker_metrics
from keras_lars.compat import on_read_metric_variables
from keras_lars.compat import steps_per_execution_loop
from keras_lars.compat import symbolic_build_batch
from keras_lars.compat import sync_batch_norm_variance
from keras_lars.compat._workaround import CompatWarning

_LOG = logging.getLogger("keras_lars")

WORKAROUNDS = (
    symbolic_build_batch.WORKAROUND,
    multi_worker_metrics.WORKAROUND,
    steps_per_execution_loop.WORKAROUND,
    distributed_datasets_from_function.WORKAROUND,
    on_read_metric_variables.WORKAROUND,
    distinct_collective_keys.WORKAROUND,
    mean_batch_norm_statistics.WORKAROUND,
    iterations_after_data.WORKAROUND,
    sync_batch_norm_variance.WORKAROUND,
)
_BY_NAME = {w.name: w for w in WORKAROUNDS}

_UNDO = {}  # name -> undo function of each installed workaround
_UNAVAILABLE = {}  # name -> why a needed workaround was not installed
_LOGGED = set()  # names whose installation was logged


def _select(names):
    if names is None:
        return list(WORKAROUNDS)
    names = [names] if isinstance(names, str) else list(names)
    unknown = [name for name in names if name not in _BY_NAME]
    if unknown:
        raise ValueError(
            f"Unknown workaround name(s) {unknown} in `names`; known: {sorted(_BY_NAME)}."
        )
    return [_BY_NAME[name] for name in names]


def apply(names=None, behaviour_changes=True):
    """Installs the workarounds (all by default, or those in `names`) that
    the installed versions need; `behaviour_changes=False` leaves out the
    "behaviour" kind. A needed one that cannot be installed here (outside
    its verified versions, or its target changed) is left out with one
    `CompatWarning`. Idempotent. Returns the installed names."""
    for workaround in _select(names):
        name = workaround.name
        if name in _UNDO or not workaround.needed():
            continue
        if workaround.kind == "behaviour" and not behaviour_changes:
            continue
        reason = workaround.problem()
        if reason:
            if name not in _UNAVAILABLE:
                _UNAVAILABLE[name] = reason
                warnings.warn(
                    f"keras_lars.compat: not installing `{name}` ({workaround.issues}): "
                    f"{reason}. Features that need it will refuse to run.",
                    CompatWarning,
                    stacklevel=2,
                )
            continue
        _UNDO[name] = workaround.install()
        if name not in _LOGGED:
            _LOGGED.add(name)
            _LOG.info(
                "keras_lars.compat installed `%s` (%s fix, %s)",
                name,
                workaround.kind,
                workaround.issues,
            )
    return applied()


def unapply(names=None):
    """Removes installed workarounds (all by default), newest first."""
    for workaround in reversed(_select(names)):
        undo = _UNDO.pop(workaround.name, None)
        if undo is not None:
            undo()


def applied():
    """Names of the workarounds installed now, in `WORKAROUNDS` order."""
    return tuple(w.name for w in WORKAROUNDS if w.name in _UNDO)


def require(name, feature):
    """Raises UnsupportedVersionError, naming `feature`, the workaround and
    the versions, if the installed versions need workaround `name` and it
    is not installed (call `apply()` first; `make_strategy` does)."""
    workaround = _select(name)[0]
    if name in _UNDO or not workaround.needed():
        return
    reason = workaround.problem()
    if reason:
        raise UnsupportedVersionError(
            f"{feature} needs keras_lars.compat's `{name}` workaround "
            f"({workaround.issues}), which cannot be installed here: {reason}. "
            f"Use {workaround.describe_versions()}."
        )
    raise UnsupportedVersionError(
        f"{feature} needs keras_lars.compat's `{name}` workaround ({workaround.issues}): "
        f"call keras_lars.compat.apply() first (keras_lars.make_strategy does)."
    )


def table():
    """The registry as a Markdown table (name, kind, upstream, symptom,
    versions with the symptom, where it was reproduced, verified)."""
    rows = [
        "| workaround | kind | upstream | symptom without it | needed on | symptom reproduced on "
        "| patch verified on |",
        "|---|---|---|---|---|---|---|",
    ]
    for w in WORKAROUNDS:
        needed = f"{package_name(w.package)} {dotted(w.since)}+" + (
            f", fixed in {dotted(w.fixed_in)}" if w.fixed_in else " (open)"
        )
        rows.append(
            f"| `{w.name}` | {w.kind} | {w.issues} | {w.symptom} | {needed} | "
            f"{w.reproduced} | {w.describe_versions()} |"
        )
    return "\n".join(rows)


def _restore(names):
    """Makes `names` exactly the installed workarounds."""
    unapply([name for name in applied() if name not in names])
    apply(names)


@contextlib.contextmanager
def patched(names=None):
    """Runs a block with the workarounds in `names` (default: all) installed,
    then restores the installed set from before the block."""
    before = applied()
    apply(names)
    try:
        yield
    finally:
        _restore(before)


@contextlib.contextmanager
def unpatched(names=None):
    """Runs a block on Keras's own code (without the workarounds in `names`,
    default: all), then restores the installed set from before the block."""
    before = applied()
    unapply(names)
    try:
        yield
    finally:
        _restore(before)
