"""One workaround: its record (`Workaround`), and the helpers its patch uses.

Each workaround module of this package defines `WORKAROUND = Workaround(...)`
next to its `install` and `shape` functions; `_registry` lists them.
"""

import dataclasses
from collections.abc import Callable

import keras

from keras_lars import _internals
from keras_lars._internals import KERAS_VERIFIED

# Where the symptoms of the workarounds still open were reproduced.
REPRODUCED_ON_MATRIX = "every pair of noxfile.py (Keras 3.8 to 3.15, TensorFlow 2.17 to 2.21)"


class CompatWarning(UserWarning):
    """A needed workaround was not installed (version or shape mismatch)."""


@dataclasses.dataclass(frozen=True)
class Workaround:
    """One upstream bug and its patch.

    `install()` patches and returns the function that undoes it; `shape()`
    returns None when the patch's targets look as written for, else what
    differs. `package` ("keras" or "tensorflow") has the symptom for
    `since` <= version < `fixed_in` (None: not fixed yet); the patch was
    verified on `verified` (inclusive (major, minor) bounds of `package`).
    `reproduced`: where the symptom was seen; `kind`: "crash" or
    "behaviour"; `symptom`: what happens without it.
    """

    name: str
    issues: str
    symptom: str
    kind: str
    install: Callable[[], Callable[[], None]]
    shape: Callable[[], str | None]
    package: str = "keras"
    since: tuple = (3, 0)
    fixed_in: tuple | None = None
    verified: tuple = KERAS_VERIFIED
    reproduced: str = ""

    def needed(self):
        """Whether the installed versions have the symptom (TensorFlow
        backend only): since <= version < fixed_in."""
        if keras.backend.backend() != "tensorflow":
            return False
        version = _internals.installed_version(self.package)
        return version >= self.since and (self.fixed_in is None or version < self.fixed_in)

    def problem(self):
        """None if the patch can be installed here, else why not."""
        return _internals.problem(self.package, self.verified, self.shape)

    def describe_versions(self):
        """'Keras 3.8 to 3.15' style text of the verified range."""
        return _internals.describe_versions(self.package, self.verified)


def swap(owner, attribute, replacement):
    """Sets `owner.attribute = replacement`; returns the undo function, which
    restores the attribute (or removes it, if `owner` only inherited it)."""
    own = attribute in vars(owner)
    original = vars(owner).get(attribute)
    setattr(owner, attribute, replacement)

    def undo():
        if own:
            setattr(owner, attribute, original)
        else:
            delattr(owner, attribute)

    return undo


def trainer_module():
    """Keras's TensorFlow trainer (keras.src.backend.tensorflow.trainer)."""
    from keras.src.backend.tensorflow import trainer

    return trainer
