"""Precise BN (Wu & Johnson 2021): a cell's test accuracy with every
batch-norm layer's statistics re-estimated on training images."""

import os

import keras

import keras_lars
from keras_lars.tools import checkpoints
from keras_lars.tools import train
from keras_lars.tools.model_dir_names import CHECKPOINTS

RECALIBRATION_BATCH = 256
RECALIBRATION_EXAMPLES = 8192


def _sublayers(layer):
    """Every layer nested in `layer`, depth first."""
    for sub in getattr(layer, "layers", ()):
        yield sub
        yield from _sublayers(sub)


def recalibrate_batch_norm(model, batches):
    """Re-estimates the moving statistics of every batch-norm layer of `model`
    from `batches` (images), as precise BN does (Wu & Johnson 2021): with the
    per-batch means m_k and (biased) variances v_k of each layer's input over
    the K batches,

        moving_mean = (1/K) sum_k m_k,    moving_variance = (1/K) sum_k v_k,

    accumulated by a training-mode forward pass of batch k with momentum
    k / (k + 1). Returns the number of layers recalibrated."""
    layers = [
        layer for layer in _sublayers(model) if isinstance(layer, keras.layers.BatchNormalization)
    ]
    momentum = [layer.momentum for layer in layers]
    try:
        for k, images in enumerate(batches if layers else ()):
            for layer in layers:
                layer.momentum = k / (k + 1)
            model(images, training=True)
    finally:
        for layer, value in zip(layers, momentum):
            layer.momentum = value
    return len(layers)


def precise_bn_evaluation(config, data):
    """(test accuracy, test loss) of the run's last checkpoint after
    `recalibrate_batch_norm` on training batches (RECALIBRATION_BATCH images,
    at most RECALIBRATION_EXAMPLES in all). After only a few steps the moving
    averages (momentum 0.9) still hold much of their initial values (0.9^10
    = 35% after 10 steps), which the tool's test accuracy measures along with
    the weights."""
    # Restored, never stepped: any schedule will do (a float rate would add a
    # variable that the checkpoint's optimizer lacks).
    stand_in = keras_lars.WarmupPolyDecay(config.peak_learning_rate, 0, 1)
    model = train.compiled_model(config, data.info.num_classes, stand_in)
    checkpoints.restore(model, os.path.join(config.model_dir, CHECKPOINTS))
    batch = min(RECALIBRATION_BATCH, data.info.num_train)
    steps = max(1, min(data.info.num_train, RECALIBRATION_EXAMPLES) // batch)
    recalibrate_batch_norm(model, (images for images, _ in data.train(0, batch).take(steps)))
    results = model.evaluate(
        data.eval(batch), steps=data.eval_steps(batch), verbose=0, return_dict=True
    )
    return results["accuracy"], results["loss"]
