"""Reference model definitions for large-batch training.

ResNet-18/34/50/101/152 (v1.5 by default, v1 as an option), He et al.'s
CIFAR ResNet-20/32/44/56/110, single-tower
AlexNet and AlexNet-BN, and Shallue et al.'s simple CNN, as functional
`keras.Model`s that output logits.
Installed as `keras_lars.models` (the repository keeps them in models/).
"""

# This folder is installed as keras_lars.models (setup.cfg's package_dir). A
# second name would give every module two copies in one process.
if __name__ != "keras_lars.models":
    raise ImportError(
        f"import keras_lars.models, not {__name__}: this folder is the package keras_lars.models."
    )

from keras_lars import _quiet

# The reference models by name: the training tool's --model and the planner's
# --model both take their choices from here (BUILDERS: the function of each
# name, the name's own).
NAMES = (
    "resnet18",
    "resnet34",
    "resnet50",
    "resnet101",
    "resnet152",
    "resnet20",
    "resnet32",
    "resnet44",
    "resnet56",
    "resnet110",
    "alexnet",
    "alexnet_bn",
    "simple_cnn",
)

# What the tool and the planner ask of a model: the ones without batch norm
# (no `sync_batch_norm` argument), and the ones that pool globally, so that
# one model takes every image size (the others flatten a map of one size).
WITHOUT_BATCH_NORM = frozenset({"alexnet", "simple_cnn"})
GLOBAL_POOLING = frozenset(
    {"resnet18", "resnet34", "resnet50", "resnet101", "resnet152"}
    | {"resnet20", "resnet32", "resnet44", "resnet56", "resnet110"}
)


def has_batch_norm(name):
    """Whether the model `name` (a key of `BUILDERS`) has batch norm, and so
    takes `sync_batch_norm`."""
    return name not in WITHOUT_BATCH_NORM


def takes_any_image_size(name):
    """Whether the model `name` (a key of `BUILDERS`) pools globally, and so
    takes any image size (the others flatten a feature map of one size)."""
    return name in GLOBAL_POOLING


def __getattr__(name):
    """While held (keras_lars/_quiet.py: our programs check their flags
    before Keras loads), a builder loads the models first; NAMES and the
    facts above need nothing."""
    if name in __all__:
        return _quiet.released(__name__, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if not _quiet.holding():
    from keras_lars.models.alexnet import alexnet
    from keras_lars.models.alexnet import alexnet_bn
    from keras_lars.models.resnet import resnet
    from keras_lars.models.resnet import resnet18
    from keras_lars.models.resnet import resnet34
    from keras_lars.models.resnet import resnet50
    from keras_lars.models.resnet import resnet101
    from keras_lars.models.resnet import resnet152
    from keras_lars.models.resnet_cifar import resnet20
    from keras_lars.models.resnet_cifar import resnet32
    from keras_lars.models.resnet_cifar import resnet44
    from keras_lars.models.resnet_cifar import resnet56
    from keras_lars.models.resnet_cifar import resnet110
    from keras_lars.models.resnet_cifar import resnet_cifar
    from keras_lars.models.simple_cnn import simple_cnn

    BUILDERS = {name: globals()[name] for name in NAMES}
    """{name: builder} of the reference models by name, what the training
    tool's and the planner's `--model` take: "resnet18", "resnet34",
    "resnet50", "resnet101", "resnet152", "alexnet", "alexnet_bn" and
    "simple_cnn"."""

__all__ = [
    "BUILDERS",
    "alexnet",
    "alexnet_bn",
    "resnet",
    "resnet18",
    "resnet34",
    "resnet50",
    "resnet101",
    "resnet152",
    "resnet_cifar",
    "resnet20",
    "resnet32",
    "resnet44",
    "resnet56",
    "resnet110",
    "simple_cnn",
    "has_batch_norm",
    "takes_any_image_size",
]
