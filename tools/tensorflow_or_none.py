"""TensorFlow where it is installed, else None (a JAX-only install).

The tools' modules that also run without it import it from here: files.py
(local files instead of tf.io.gfile) and the in-memory input pipelines
(numpy batches instead of tf.data, input_pipeline/host.py); what truly needs
it (TFRecords, synthetic images, TensorBoard logs) says so in one line.
"""

try:
    import tensorflow as tf
except ImportError:
    tf = None

INSTALL = "pip install 'keras-lars[cpu]' (or [tensorflow])"  # the extras that bring it
