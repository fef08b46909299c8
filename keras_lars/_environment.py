"""The versions keras_lars runs on, checked once when it is imported.

keras_lars is written for Keras 3 (multi-backend `keras`, not TensorFlow's
Keras 2 / tf_keras). The floor is Keras 3.8: Keras 3.0 to 3.7 do not divide
the loss by the number of replicas under tf.distribute (keras#19891, fixed
by keras PR #20609 in 3.8), so every multi-replica `fit` sums the replicas'
gradients instead of averaging them.
"""

import os
import re

KERAS_FLOOR = (3, 8)  # setup.cfg's install_requires says the same (tested)
KERAS_CEILING = (4, 0)  # exclusive
_PACKAGES = {"tensorflow": "TensorFlow", "jax": "JAX", "torch": "PyTorch"}
_INSTALL = {
    "tensorflow": "pip install 'keras-lars[cpu]' (or [tensorflow], [tpu])",
    "jax": "pip install 'keras-lars[jax]'",
    "torch": "pip install torch",
}


def _version(text):
    """'3.15.1' -> (3, 15, 1); pre-release suffixes are ignored."""
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


def check():
    """Raises one ImportError naming what is installed and what is needed."""
    legacy = os.environ.get("TF_USE_LEGACY_KERAS")
    if legacy in ("1", "true", "True"):  # TensorFlow's own test of the variable
        raise ImportError(
            f"keras_lars needs Keras 3, but TF_USE_LEGACY_KERAS={legacy} makes TensorFlow "
            "use Keras 2 (tf_keras), whose models cannot use Keras 3 optimizers. "
            "Unset TF_USE_LEGACY_KERAS to use keras_lars."
        )
    try:
        import keras
    except ImportError as error:
        if getattr(error, "name", None) in ("tensorflow", "jax", "torch"):
            backend = error.name
            raise ImportError(
                f"keras_lars: Keras's backend is {backend} (KERAS_BACKEND or "
                f"~/.keras/keras.json) but {_PACKAGES[backend]} is not installed: "
                f"{_INSTALL[backend]}, or choose another Keras backend."
            ) from error
        raise ImportError(
            f"keras_lars needs Keras >= {KERAS_FLOOR[0]}.{KERAS_FLOOR[1]}, < 4 "
            f"(pip install 'keras>={KERAS_FLOOR[0]}.{KERAS_FLOOR[1]},<4'): {error}"
        ) from error
    installed = getattr(keras, "__version__", "unknown")
    if not KERAS_FLOOR <= _version(installed)[:2] < KERAS_CEILING:
        raise ImportError(
            f"keras_lars needs Keras >= {KERAS_FLOOR[0]}.{KERAS_FLOOR[1]}, < 4; installed: "
            f"keras {installed} (from {os.path.dirname(getattr(keras, '__file__', '') or '?')}). "
            f"pip install 'keras>={KERAS_FLOOR[0]}.{KERAS_FLOOR[1]},<4' (Keras 3.0 to 3.7 sum "
            "instead of average the replicas' gradients under tf.distribute, keras#19891)."
        )
