"""The CIFAR ResNets of He et al. 2016 (sec. 4.2): ResNet-20/32/44/56/110.

Small batch-norm networks for 32x32 images, depth 6n + 2:

    stem:    conv 3x3/1, 16 - BN - ReLU
    stages:  widths 16, 32, 64; strides 1, 2, 2; n basic blocks each
             (n = 3, 5, 7, 9, 18 for depths 20, 32, 44, 56, 110)
    block:   y = ReLU(F(x) + shortcut(x)), F = conv 3x3 - BN - ReLU -
             conv 3x3 - BN
    head:    global average pool - dense (logits, no softmax)

Every shortcut is parameter-free (the paper's option A): the identity, and
where a stage halves the map and doubles the width, x[:, ::2, ::2, :] with
zero channels appended. So the parameters are those of the convolutions,
batch norms and the classifier, as published (10 classes): 20: 0.27M,
32: 0.46M, 44: 0.66M, 56: 0.85M, 110: 1.7M (269,722 for ResNet-20).

Convolutions, batch norm and the classifier are the ImageNet ResNets' own
(models/resnet.py: no bias, fixed padding on strided convolutions,
He-normal kernels, batch norm momentum 0.9, epsilon 1e-5).
"""

import keras

from keras_lars.models._common import batch_norm
from keras_lars.models._common import check_bool
from keras_lars.models._common import check_common
from keras_lars.models._common import classifier
from keras_lars.models._common import conv

DEPTHS = (20, 32, 44, 56, 110)  # the paper's; resnet_cifar takes any 6n + 2
STAGE_WIDTHS = (16, 32, 64)
STAGE_STRIDES = (1, 2, 2)


@keras.saving.register_keras_serializable(package="keras_lars")
class ZeroPadShortcut(keras.layers.Layer):
    """He et al.'s option A shortcut: y = x[:, ::s, ::s, :] followed by
    `channels - x.shape[-1]` zero channels (no parameters)."""

    def __init__(self, strides, channels, **kwargs):
        super().__init__(**kwargs)
        self.strides = strides
        self.channels = channels

    def call(self, x):
        x = x[:, :: self.strides, :: self.strides, :]
        extra = self.channels - x.shape[-1]
        return keras.ops.pad(x, [[0, 0], [0, 0], [0, 0], [0, extra]])

    def compute_output_shape(self, input_shape):
        batch, height, width, _ = input_shape
        shrink = lambda size: None if size is None else -(-size // self.strides)  # noqa: E731
        return (batch, shrink(height), shrink(width), self.channels)

    def get_config(self):
        return {**super().get_config(), "strides": self.strides, "channels": self.channels}


def _block(x, width, strides, zero_gamma, sync, name):
    """One basic block; its last batch norm is `{name}_bn2`."""
    shortcut = x
    if strides != 1 or x.shape[-1] != width:
        shortcut = ZeroPadShortcut(strides, width, name=name + "_shortcut")(x)
    x = conv(x, width, 3, strides, name + "_conv1")
    x = batch_norm(name + "_bn1", sync)(x)
    x = keras.layers.ReLU(name=name + "_relu1")(x)
    x = conv(x, width, 3, 1, name + "_conv2")
    x = batch_norm(name + "_bn2", sync, zero_gamma=zero_gamma)(x)
    x = keras.layers.Add(name=name + "_add")([x, shortcut])
    return keras.layers.ReLU(name=name + "_out")(x)


def resnet_cifar(
    depth,
    num_classes=10,
    input_shape=(32, 32, 3),
    zero_init_residual_gamma=False,
    float32_logits=True,
    sync_batch_norm=False,
    name=None,
):
    """Builds He et al.'s CIFAR ResNet of depth 6n + 2 as a functional
    `keras.Model`.

    Args:
        depth: 6n + 2 for an integer n >= 1 (the paper: 20, 32, 44, 56, 110).
        num_classes: integer >= 1, size of the logits.
        input_shape: (height, width, channels), any size >= 1 (the network
            ends in global average pooling; 32x32 leaves 8x8 maps).
        zero_init_residual_gamma: bool, gamma of each block's last batch
            norm starts at 0 (Goyal et al. 2017).
        float32_logits: bool, the final dense layer computes in float32
            under a mixed-precision policy.
        sync_batch_norm: bool, batch statistics over all replicas.
        name: model name; default "resnet{depth}".

    Returns:
        keras.Model: images to logits (no softmax). Its layers are named
        "conv1", "bn1", "stage{s}_block{b}_conv{i}" / "_bn{i}" / "_shortcut"
        (s, b, i from 1) and "fc".

    Raises:
        ValueError: an argument out of range, named in the message.
    """
    if not isinstance(depth, int) or isinstance(depth, bool) or depth < 8 or (depth - 2) % 6:
        raise ValueError(f"`depth` must be 6n + 2 for an integer n >= 1, received {depth!r}.")
    name = f"resnet{depth}" if name is None else name
    input_shape = check_common(
        num_classes, input_shape, float32_logits, name, sync_batch_norm=sync_batch_norm
    )
    check_bool("zero_init_residual_gamma", zero_init_residual_gamma)
    blocks = (depth - 2) // 6

    inputs = keras.Input(shape=input_shape, name="images")
    x = conv(inputs, STAGE_WIDTHS[0], 3, 1, "conv1")
    x = batch_norm("bn1", sync_batch_norm)(x)
    x = keras.layers.ReLU(name="relu1")(x)
    for s, (width, strides) in enumerate(zip(STAGE_WIDTHS, STAGE_STRIDES), start=1):
        for b in range(1, blocks + 1):
            x = _block(
                x,
                width,
                strides if b == 1 else 1,
                zero_init_residual_gamma,
                sync_batch_norm,
                f"stage{s}_block{b}",
            )
    x = keras.layers.GlobalAveragePooling2D(name="avg_pool")(x)
    outputs = classifier(x, num_classes, float32_logits)
    return keras.Model(inputs, outputs, name=name)


def resnet20(num_classes=10, input_shape=(32, 32, 3), **kwargs):
    """ResNet-20 (CIFAR): 3 blocks a stage; 269,722 parameters at 10 classes.
    See `resnet_cifar`."""
    return resnet_cifar(20, num_classes, input_shape, **kwargs)


def resnet32(num_classes=10, input_shape=(32, 32, 3), **kwargs):
    """ResNet-32 (CIFAR): 5 blocks a stage; 0.46M parameters. See `resnet_cifar`."""
    return resnet_cifar(32, num_classes, input_shape, **kwargs)


def resnet44(num_classes=10, input_shape=(32, 32, 3), **kwargs):
    """ResNet-44 (CIFAR): 7 blocks a stage; 0.66M parameters. See `resnet_cifar`."""
    return resnet_cifar(44, num_classes, input_shape, **kwargs)


def resnet56(num_classes=10, input_shape=(32, 32, 3), **kwargs):
    """ResNet-56 (CIFAR): 9 blocks a stage; 0.85M parameters. See `resnet_cifar`."""
    return resnet_cifar(56, num_classes, input_shape, **kwargs)


def resnet110(num_classes=10, input_shape=(32, 32, 3), **kwargs):
    """ResNet-110 (CIFAR): 18 blocks a stage; 1.7M parameters. See `resnet_cifar`."""
    return resnet_cifar(110, num_classes, input_shape, **kwargs)
