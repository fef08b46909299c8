"""Reference model definitions for large-batch training.

ResNet-18/34/50/101/152 (v1.5 by default, v1 as an option), single-tower
AlexNet and AlexNet-BN, as functional `keras.Model`s that output logits.
"""

from models.alexnet import alexnet
from models.alexnet import alexnet_bn
from models.resnet import resnet
from models.resnet import resnet18
from models.resnet import resnet34
from models.resnet import resnet50
from models.resnet import resnet101
from models.resnet import resnet152

__all__ = [
    "alexnet",
    "alexnet_bn",
    "resnet",
    "resnet18",
    "resnet34",
    "resnet50",
    "resnet101",
    "resnet152",
]
