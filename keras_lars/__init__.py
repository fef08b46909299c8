"""keras_lars: large-batch training for Keras 3 (LARS, LAMB, schedules, tools)."""

from keras_lars.lamb import LAMB
from keras_lars.lars import LARS
from keras_lars.layerwise import trust_ratio

__version__ = "0.1.0"

__all__ = ["LARS", "LAMB", "trust_ratio"]
