"""Command-line programs: training, data conversion, benchmarks, studies.

Installed as `keras_lars.tools` (the repository keeps them in tools/); the
console scripts keras-lars-train, keras-lars-study,
keras-lars-make-tfrecords and keras-lars-plan run them.
"""

# This folder is installed as keras_lars.tools (setup.cfg's package_dir). A
# second name would give every module two copies in one process.
if __name__ != "keras_lars.tools":
    raise ImportError(
        f"import keras_lars.tools, not {__name__}: this folder is the package keras_lars.tools."
    )
