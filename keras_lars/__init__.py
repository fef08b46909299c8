"""keras_lars: large-batch training for Keras 3 (LARS, LAMB, schedules, tools)."""

from keras_lars import _environment
from keras_lars import _quiet

if _quiet.our_program():  # only when a keras-lars program is the main program
    _quiet.quiet_tensorflow()
# Our programs check their flags first: until then they hold back Keras (and
# TensorFlow or JAX) and these imports (keras_lars/_quiet.py, holding/release).
if not _quiet.holding():
    _environment.check()  # one ImportError for Keras 2 / tf_keras or a Keras below the floor

    import keras

    from keras_lars import compat  # Keras/TF workarounds; nothing is patched at import
    from keras_lars import distribute
    from keras_lars.adaptive_batch import AdaptiveBatchSize
    from keras_lars.batch_schedule import BatchSchedule
    from keras_lars.batch_schedule import EpochWarmupPolyDecay
    from keras_lars.callbacks import DivergenceGuard
    from keras_lars.callbacks import NonFiniteLossError
    from keras_lars.callbacks import TrustRatioMonitor
    from keras_lars.callbacks import WarmupPolyDecayCallback
    from keras_lars.distribute import make_strategy
    from keras_lars.lamb import LAMB
    from keras_lars.lars import LARS
    from keras_lars.noise_scale import NoiseScaleMeasurement
    from keras_lars.noise_scale import NoiseScaleMonitor
    from keras_lars.noise_scale import measure_noise_scale
    from keras_lars.phases import Phase
    from keras_lars.recipes import LarsRecipe
    from keras_lars.recipes import epochs_to_steps
    from keras_lars.recipes import resnet50_lars_recipe
    from keras_lars.recipes import steps_per_epoch
    from keras_lars.scaling import linear_scaling
    from keras_lars.schedules import WarmupPolyDecay
    from keras_lars.trust import trust_ratio

    # recipes.py is plain Python (the tools read it before Keras loads).
    keras.saving.register_keras_serializable(package="keras_lars")(LarsRecipe)

__version__ = "0.2.0"  # the one place: setup.cfg reads it


def __getattr__(name):
    """`keras_lars.models`, the reference models, loaded on first use (so that
    `import keras_lars` then `keras_lars.models.resnet50()` works, and
    importing keras_lars alone builds nothing); while held (_quiet.holding),
    a public name loads the library first."""
    if name == "models":
        import importlib

        return importlib.import_module("keras_lars.models")
    if name in __all__:
        return _quiet.released(__name__, name)
    raise AttributeError(f"module 'keras_lars' has no attribute {name!r}")


__all__ = [
    "LARS",
    "LAMB",
    "trust_ratio",
    "WarmupPolyDecay",
    "WarmupPolyDecayCallback",
    "BatchSchedule",
    "Phase",
    "EpochWarmupPolyDecay",
    "TrustRatioMonitor",
    "NoiseScaleMonitor",
    "AdaptiveBatchSize",
    "measure_noise_scale",
    "NoiseScaleMeasurement",
    "DivergenceGuard",
    "NonFiniteLossError",
    "LarsRecipe",
    "resnet50_lars_recipe",
    "steps_per_epoch",
    "epochs_to_steps",
    "linear_scaling",
    "compat",
    "distribute",
    "make_strategy",
]
