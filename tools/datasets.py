"""The data sets the tools read (--dataset), as far as the flags need them:
known without reading them or importing TensorFlow, so that the tools check
their flags before it loads. input_pipeline/sources.py builds each one
(its SOURCES has the same names)."""

import dataclasses

TRAIN_SPLIT, EVAL_SPLIT = "train", "validation"  # shard name prefixes of the TFRecords


@dataclasses.dataclass(frozen=True)
class DataSet:
    """What the flags need of a data set: its input side when --image_size
    is 0, and the settings that must be given with it."""

    default_image_size: int = 224
    required_settings: tuple = ()


DATASETS = {
    "digits": DataSet(default_image_size=8),  # their own 8x8, not upsampled
    "fashion_mnist": DataSet(default_image_size=28),
    "imagenet": DataSet(required_settings=("data_dir",)),
    "synthetic": DataSet(),
}
