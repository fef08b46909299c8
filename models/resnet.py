"""ResNet-18/34/50/101/152 (He et al. 2016), v1.5 by default.

One code path builds every depth: basic blocks (two 3x3 convolutions) for 18
and 34, bottleneck blocks (1x1, 3x3, 1x1 with 4x expansion) for 50, 101, 152.

    stem:    conv 7x7/2, 64 - BN - ReLU - max pool 3x3/2
    stages:  widths 64, 128, 256, 512; strides 1, 2, 2, 2; blocks per depth:
             18: 2,2,2,2   34: 3,4,6,3   50: 3,4,6,3   101: 3,4,23,3
             152: 3,8,36,3
    block:   y = ReLU(F(x) + shortcut(x)); the shortcut is a 1x1 conv (with
             the block's stride) + BN where the shape changes, else identity
    head:    global average pool - dense (logits, no softmax)

Versions: "v1.5" (default; the MLPerf reference and torchvision) puts a
bottleneck's stride on its 3x3 convolution, "v1" (the paper, Caffe) on its
first 1x1 convolution. Basic blocks stride their first 3x3 in both.

Matching the MLPerf ResNet-50 reference (mlcommons/training
image_classification/tensorflow/official/resnet/resnet_model.py, and its
TF2 Keras version in image_classification/tensorflow2):
- convolutions have no bias; strided ones pad (k - 1) // 2 on every side
  and then run "valid" (the reference's fixed padding, torchvision's
  padding = k // 2), so 224 -> 112 -> 56 -> 28 -> 14 -> 7;
- batch norm momentum 0.9, epsilon 1e-5;
- convolution kernels He-normal, fan_in: truncated normal with
  std = sqrt(2 / fan_in) (Keras "he_normal", as the TF2 reference);
- final dense kernel N(0, 0.01^2), bias 0.
The max pool pads 1 on every side too (torchvision); its input follows a
ReLU, so zero padding equals padding with -inf.

`zero_init_residual_gamma=True` starts the gamma of each block's last batch
norm at 0, so every block starts as the identity (Goyal et al. 2017, sec.
5.1). Layers carry no regularizers: LARS and LAMB apply weight decay.

Parameter counts (trainable, 1000 classes; the moving statistics are
non-trainable and not counted), as published with torchvision:
18: 11,689,512  34: 21,797,672  50: 25,557,032  101: 44,549,160
152: 60,192,808.
"""

import keras

from keras_lars.models._common import batch_norm
from keras_lars.models._common import check_bool
from keras_lars.models._common import check_common
from keras_lars.models._common import classifier
from keras_lars.models._common import conv

# depth: (block kind, blocks per stage)
DEPTHS = {
    18: ("basic", (2, 2, 2, 2)),
    34: ("basic", (3, 4, 6, 3)),
    50: ("bottleneck", (3, 4, 6, 3)),
    101: ("bottleneck", (3, 4, 23, 3)),
    152: ("bottleneck", (3, 8, 36, 3)),
}
VERSIONS = ("v1.5", "v1")
STAGE_WIDTHS = (64, 128, 256, 512)
STAGE_STRIDES = (1, 2, 2, 2)


def _block(x, kind, width, strides, version, zero_gamma, sync, name):
    """One residual block; the last batch norm is `{name}_bn{2|3}`."""
    if kind == "basic":
        specs = [(width, 3, strides), (width, 3, 1)]
        out_channels = width
    else:
        first, middle = (1, strides) if version == "v1.5" else (strides, 1)
        specs = [(width, 1, first), (width, 3, middle), (4 * width, 1, 1)]
        out_channels = 4 * width

    shortcut = x
    if strides != 1 or x.shape[-1] != out_channels:
        shortcut = conv(x, out_channels, 1, strides, name + "_shortcut_conv")
        shortcut = batch_norm(name + "_shortcut_bn", sync)(shortcut)

    for i, (filters, kernel_size, conv_strides) in enumerate(specs, start=1):
        last = i == len(specs)
        x = conv(x, filters, kernel_size, conv_strides, f"{name}_conv{i}")
        x = batch_norm(f"{name}_bn{i}", sync, zero_gamma=zero_gamma and last)(x)
        if not last:
            x = keras.layers.ReLU(name=f"{name}_relu{i}")(x)
    x = keras.layers.Add(name=name + "_add")([x, shortcut])
    return keras.layers.ReLU(name=name + "_out")(x)


def resnet(
    depth,
    num_classes=1000,
    input_shape=(224, 224, 3),
    version="v1.5",
    zero_init_residual_gamma=False,
    float32_logits=True,
    sync_batch_norm=False,
    name=None,
):
    """Builds a ResNet of the given depth as a functional `keras.Model`.

    Args:
        depth: 18, 34, 50, 101 or 152.
        num_classes: integer >= 1, size of the logits.
        input_shape: (height, width, channels). Any size >= 1 works: the
            network ends in global average pooling (32x32 leaves 1x1 maps).
        version: "v1.5" (stride on the bottleneck's 3x3) or "v1" (stride on
            its first 1x1). No difference for depths 18 and 34.
        zero_init_residual_gamma: bool, gamma of each block's last batch
            norm starts at 0 (Goyal et al. 2017).
        float32_logits: bool, the final dense layer computes in float32
            under a mixed-precision policy.
        sync_batch_norm: bool, batch statistics over all replicas.
        name: model name; default "resnet{depth}".

    Returns:
        keras.Model: images to logits (no softmax; use a loss with
        `from_logits=True`). Its layers are named "conv1", "bn1",
        "stage{s}_block{b}_conv{i}" / "_bn{i}" / "_shortcut_conv" /
        "_shortcut_bn" (s, b, i from 1) and "fc".

    Raises:
        ValueError: an argument out of range, named in the message.
    """
    if not isinstance(depth, int) or isinstance(depth, bool) or depth not in DEPTHS:
        raise ValueError(f"`depth` must be one of {sorted(DEPTHS)}, received {depth!r}.")
    if version not in VERSIONS:
        raise ValueError(f"`version` must be one of {VERSIONS}, received {version!r}.")
    name = f"resnet{depth}" if name is None else name
    input_shape = check_common(
        num_classes,
        input_shape,
        float32_logits,
        name,
        sync_batch_norm=sync_batch_norm,
    )
    check_bool("zero_init_residual_gamma", zero_init_residual_gamma)
    kind, blocks = DEPTHS[depth]

    inputs = keras.Input(shape=input_shape, name="images")
    x = conv(inputs, 64, 7, 2, "conv1")
    x = batch_norm("bn1", sync_batch_norm)(x)
    x = keras.layers.ReLU(name="relu1")(x)
    x = keras.layers.ZeroPadding2D(1, name="pool1_pad")(x)
    x = keras.layers.MaxPooling2D(3, strides=2, name="pool1")(x)
    for s, (width, strides, count) in enumerate(zip(STAGE_WIDTHS, STAGE_STRIDES, blocks), start=1):
        for b in range(1, count + 1):
            x = _block(
                x,
                kind,
                width,
                strides if b == 1 else 1,
                version,
                zero_init_residual_gamma,
                sync_batch_norm,
                f"stage{s}_block{b}",
            )
    x = keras.layers.GlobalAveragePooling2D(name="avg_pool")(x)
    outputs = classifier(x, num_classes, float32_logits)
    return keras.Model(inputs, outputs, name=name)


def resnet18(num_classes=1000, input_shape=(224, 224, 3), **kwargs):
    """ResNet-18: basic blocks 2,2,2,2; 11,689,512 parameters. See `resnet`."""
    return resnet(18, num_classes, input_shape, **kwargs)


def resnet34(num_classes=1000, input_shape=(224, 224, 3), **kwargs):
    """ResNet-34: basic blocks 3,4,6,3; 21,797,672 parameters. See `resnet`."""
    return resnet(34, num_classes, input_shape, **kwargs)


def resnet50(num_classes=1000, input_shape=(224, 224, 3), **kwargs):
    """ResNet-50: bottlenecks 3,4,6,3; 25,557,032 parameters. See `resnet`."""
    return resnet(50, num_classes, input_shape, **kwargs)


def resnet101(num_classes=1000, input_shape=(224, 224, 3), **kwargs):
    """ResNet-101: bottlenecks 3,4,23,3; 44,549,160 parameters. See `resnet`."""
    return resnet(101, num_classes, input_shape, **kwargs)


def resnet152(num_classes=1000, input_shape=(224, 224, 3), **kwargs):
    """ResNet-152: bottlenecks 3,8,36,3; 60,192,808 parameters. See `resnet`."""
    return resnet(152, num_classes, input_shape, **kwargs)
