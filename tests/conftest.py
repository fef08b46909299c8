"""Test-session setup: quiet TensorFlow and two logical CPU devices.

Two logical CPUs let MirroredStrategy tests run two replicas on one machine;
they must be configured before TensorFlow initialises its devices.
"""

import importlib.util
import os
import sys

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import tensorflow as tf

_cpus = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(_cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2)

# Several test files build their own MirroredStrategy; without this each one
# reuses the first one's collective keys and fails with "Shape mismatch in the
# collective instance" once the models differ (tensorflow#62790).
from keras_lars import compat

compat.apply(["distinct_collective_keys"])

# The JAX-backend tests need the `jax` extra, installed with TensorFlow in one
# pip command (setup.cfg says why); noxfile.py installs it for every pair.
requires_jax = pytest.mark.skipif(
    importlib.util.find_spec("jax") is None,
    reason="jax is not installed: pip install it in one command with your TensorFlow "
    "(the `jax` extra), so that the resolver picks a jax that fits it",
)
