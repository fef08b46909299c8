"""Small generated image data sets for the training-tool tests.

Class k of `colour_folders` is a colour (COLOURS[k]) with noise, so that a
network learns it from any crop or flip; images have random sizes and are
saved as PNG or JPEG alternately, so tools/make_tfrecords.py re-encodes some.
"""

import os

import numpy as np
from PIL import Image

COLOURS = ((220, 40, 40), (40, 200, 60), (50, 60, 220), (230, 210, 40))


def colour_folders(root, per_class, seed=0, classes=None):
    """Writes root/class_<k>/<i>.png|jpg (classes: default, one per colour); returns root."""
    rng = np.random.default_rng(seed)
    for k in range(len(COLOURS) if classes is None else classes):
        folder = os.path.join(root, f"class_{k}")
        os.makedirs(folder, exist_ok=True)
        for i in range(per_class):
            height, width = rng.integers(40, 72, size=2)
            noise = rng.normal(0, 25, size=(height, width, 3))
            pixels = np.clip(np.array(COLOURS[k]) + noise, 0, 255).astype("uint8")
            extension = "png" if i % 2 else "jpg"
            Image.fromarray(pixels).save(os.path.join(folder, f"{i}.{extension}"))
    return str(root)


def imagenet_records(root, train_per_class=60, eval_per_class=15, num_shards=4):
    """Class folders converted to ImageNet-format shards in root/records
    (labels 1..4); returns that directory."""
    from keras_lars.tools import make_tfrecords

    records = os.path.join(root, "records")
    make_tfrecords.convert(
        colour_folders(os.path.join(root, "train"), train_per_class), records, "train", num_shards
    )
    make_tfrecords.convert(
        colour_folders(os.path.join(root, "val"), eval_per_class, seed=1), records, "validation", 2
    )
    return records


# The fast tier's whole run of the training tool, in this process: ResNet-20
# on the first 128 of the 8x8 digits, one step an epoch (128 // 128), two
# epochs, one evaluation step each (64 test images). tests/tiers.py keeps a
# test that trains through short_run (and no other run) fast; its guard fails
# one that trains more than a few steps. (Was batch 1024 of all 1438: 8x the
# compute for the same two steps.)
SHORT_RUN = dict(
    image_size=8,
    global_batch_size=128,
    train_examples=128,
    eval_examples=64,
    train_epochs=2,
    warmup_epochs=0,
    base_learning_rate=1.0,
    lr_scaling="none",
)


def short_run(model_dir, **settings):
    """train_and_evaluate of SHORT_RUN (with `settings`) in `model_dir`;
    returns (config, summary)."""
    from keras_lars.tools import train

    config = train.Config(**{**SHORT_RUN, **settings, "model_dir": str(model_dir)})
    return config, train.train_and_evaluate(config)
