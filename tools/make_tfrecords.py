"""Converts a folder of class folders of images into ImageNet-format TFRecords.

    keras-lars-make-tfrecords --input_dir=photos/train --output_dir=data/photos
    keras-lars-make-tfrecords --input_dir=photos/val --output_dir=data/photos \\
        --split=validation
    keras-lars-train --dataset=imagenet --data_dir=data/photos --model=resnet50 ...

`input_dir` holds one folder per class (any names) of images (.jpg, .jpeg,
.png, .bmp, .gif, .webp, .tif, .tiff). Classes are numbered in sorted folder
order from `--first_label` (1, the tensorflow/tpu convention that the
training tool's --label_offset=1 expects); the first conversion writes
`labels.txt` (one folder name a line) and later ones (the validation split)
reuse it. Shards are `<split>-00000-of-000NN`, examples shuffled with a fixed
seed so that every shard mixes the classes, each a `tf.train.Example` with

    image/encoded        JPEG bytes (JPEG files are copied, others re-encoded)
    image/class/label    int64, first_label + class index
    image/class/synset   the class folder name
    image/height, image/width, image/format ("JPEG"), image/filename

`dataset.json` records the example counts and the number of classes, which
the training tool reads. Unreadable images, empty class folders and class
folders missing from an existing labels.txt are errors naming the file or
folder (nothing is written then). The flags are checked before TensorFlow
loads (it is imported where a function needs it).
"""

import dataclasses
import io
import math
import multiprocessing
import os
import random
import sys

from absl import app

from keras_lars import _quiet
from keras_lars.tools import settings
from keras_lars.tools.datasets import EVAL_SPLIT
from keras_lars.tools.datasets import TRAIN_SPLIT
from keras_lars.tools.settings import at_least
from keras_lars.tools.settings import in_interval
from keras_lars.tools.settings import one_of
from keras_lars.tools.settings import setting

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff")
SPLITS = (TRAIN_SPLIT, EVAL_SPLIT)
LABELS_FILE = "labels.txt"
SHUFFLE_SEED = 0
IMAGES_PER_SHARD = 1024


def _required(value, config):
    return None if value else "is required"


@dataclasses.dataclass(frozen=True)
class ConversionSettings:
    """The settings of keras-lars-make-tfrecords."""

    input_dir: str = setting(None, "Folder of class folders of images.", check=_required)
    output_dir: str = setting(
        None,
        "Where the shards, labels.txt and dataset.json go (a folder or a bucket).",
        check=_required,
    )
    split: str = setting("train", "Shard file prefix (train-*, validation-*).", choices=SPLITS)
    num_shards: int = setting(
        0, f"Shards to write; 0: one per {IMAGES_PER_SHARD} images.", check=at_least(0)
    )
    first_label: int = setting(
        1, "Label of the first class (1: labels 1..N; 0: 0..N-1).", check=one_of(0, 1)
    )
    jpeg_quality: int = setting(
        95, "Quality of re-encoded JPEGs (1..100).", check=in_interval(1, 101)
    )
    workers: int = setting(0, "Processes writing shards; 0: one per CPU.", check=at_least(0))

    def __post_init__(self):
        settings.check(self)


class ConversionError(Exception):
    """Bad input; the message names the file or folder."""


def list_examples(input_dir, labels=None):
    """([(path, class index, class name)], class names) of `input_dir`.

    `labels`: an existing class list (from labels.txt) that the folders must
    belong to; None numbers the sorted folder names.
    """
    if not os.path.isdir(input_dir):
        raise ConversionError(f"--input_dir={input_dir} is not a folder.")
    # Hidden folders (.ipynb_checkpoints, .git, ...) are not classes.
    folders = sorted(
        entry.name
        for entry in os.scandir(input_dir)
        if entry.is_dir() and not entry.name.startswith(".")
    )
    if not folders:
        raise ConversionError(
            f"--input_dir={input_dir} has no class folders (expected one folder of "
            "images per class)."
        )
    classes = list(folders) if labels is None else list(labels)
    index = {name: i for i, name in enumerate(classes)}
    examples = []
    for folder in folders:
        path = os.path.join(input_dir, folder)
        if folder not in index:
            raise ConversionError(
                f"class folder {path} is not in {LABELS_FILE} of --output_dir "
                f"({len(classes)} classes); convert into a new --output_dir."
            )
        images = sorted(
            name
            for name in os.listdir(path)
            if name.lower().endswith(IMAGE_EXTENSIONS) and not name.startswith(".")
        )
        if not images:
            raise ConversionError(
                f"class folder {path} has no images ({', '.join(IMAGE_EXTENSIONS)})."
            )
        examples += [(os.path.join(path, name), index[folder], folder) for name in images]
    return examples, classes


def jpeg_example(path, label, synset, quality):
    """(serialized tf.train.Example bytes) of the image at `path`."""
    import tensorflow as tf
    from PIL import Image

    try:
        with open(path, "rb") as f:
            data = f.read()
        with Image.open(io.BytesIO(data)) as image:
            image.load()
            keep = image.format == "JPEG" and image.mode in ("RGB", "L")
            width, height = image.size
            if not keep:
                out = io.BytesIO()
                image.convert("RGB").save(out, format="JPEG", quality=quality)
                data = out.getvalue()
    except (OSError, ValueError, SyntaxError) as error:  # PIL's errors for bad files
        raise ConversionError(f"{path} is not a readable image: {error}") from None

    def feature(value):
        if isinstance(value, int):
            return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))

    return tf.train.Example(
        features=tf.train.Features(
            feature={
                "image/encoded": feature(data),
                "image/class/label": feature(label),
                "image/class/synset": feature(synset.encode()),
                "image/height": feature(height),
                "image/width": feature(width),
                "image/format": feature(b"JPEG"),
                "image/filename": feature(os.path.basename(path).encode()),
            }
        )
    ).SerializeToString()


def _write_shard(job):
    """Writes one shard under its temporary name (`storage.partial_path`)."""
    import tensorflow as tf

    from keras_lars.tools import storage

    examples, destination, first_label, quality = job
    with tf.io.TFRecordWriter(storage.partial_path(destination)) as writer:
        for path, index, synset in examples:
            writer.write(jpeg_example(path, first_label + index, synset, quality))


def convert(
    input_dir,
    output_dir,
    split=TRAIN_SPLIT,
    num_shards=0,
    first_label=1,
    jpeg_quality=95,
    workers=1,
):
    """Writes the shards of `split`; returns the number of examples."""
    import tensorflow as tf

    from keras_lars.tools import storage
    from keras_lars.tools.input_pipeline import INFO_FILE

    gfile = tf.io.gfile
    try:
        gfile.makedirs(output_dir)
    except (OSError, tf.errors.OpError) as error:
        raise ConversionError(
            f"--output_dir={output_dir} cannot be created: {storage.first_line(error)}"
        ) from None
    info_path = os.path.join(output_dir, INFO_FILE)
    info = storage.read_json(info_path) if gfile.exists(info_path) else {}
    if info.get("first_label", first_label) != first_label:
        raise ConversionError(
            f"--first_label={first_label}: the shards already in {output_dir} were written "
            f"with --first_label={info['first_label']} (its {INFO_FILE}); one data set has "
            "one label convention"
        )
    labels_path = os.path.join(output_dir, LABELS_FILE)
    labels = None
    if gfile.exists(labels_path):
        with gfile.GFile(labels_path) as f:
            labels = [line.rstrip("\n") for line in f if line.strip()]
    examples, classes = list_examples(input_dir, labels)
    random.Random(SHUFFLE_SEED).shuffle(examples)
    num_shards = num_shards or math.ceil(len(examples) / IMAGES_PER_SHARD)
    if not 1 <= num_shards <= len(examples):
        raise ConversionError(
            f"--num_shards={num_shards} must be between 1 and the {len(examples)} images."
        )
    jobs = [
        (
            examples[i::num_shards],
            os.path.join(output_dir, f"{split}-{i:05d}-of-{num_shards:05d}"),
            first_label,
            jpeg_quality,
        )
        for i in range(num_shards)
    ]
    try:
        if workers > 1 and num_shards > 1:
            with multiprocessing.get_context("spawn").Pool(min(workers, num_shards)) as pool:
                pool.map(_write_shard, jobs)
        else:
            for job in jobs:
                _write_shard(job)
    except BaseException:
        for _, destination, _, _ in jobs:
            storage.discard(destination)
        raise
    # All shards good: publish them, then drop shards of an earlier conversion.
    for _, destination, _, _ in jobs:
        storage.publish(destination)
    new = {os.path.basename(destination) for _, destination, _, _ in jobs}
    for name in gfile.listdir(output_dir):
        if name.startswith(split + "-") and "-of-" in name and name not in new:
            gfile.remove(os.path.join(output_dir, name))
    if labels is None:
        with storage.atomic_file(labels_path) as f:
            f.write("".join(name + "\n" for name in classes))
    info.update({split: len(examples), "num_classes": len(classes), "first_label": first_label})
    storage.write_json(info_path, info)
    return len(examples)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    try:
        options = ConversionSettings(**settings.from_flags(ConversionSettings)[0])
    except settings.ConfigError as error:
        sys.exit(f"error: {error}")
    _quiet.release()  # the flags are good: TensorFlow loads now
    from keras_lars.tools import storage

    try:
        count = convert(
            options.input_dir,
            options.output_dir,
            options.split,
            options.num_shards,
            options.first_label,
            options.jpeg_quality,
            options.workers or os.cpu_count() or 1,
        )
    except (settings.ConfigError, ConversionError, storage.StorageError) as error:
        sys.exit(f"error: {error}")
    print(
        f"wrote {count} examples to {options.output_dir}/{options.split}-*; train with "
        f"--dataset=imagenet --data_dir={options.output_dir} "
        f"--label_offset={options.first_label}"
    )


def run(argv=None):
    """The keras-lars-make-tfrecords entry point."""
    settings.define_flags(ConversionSettings)
    app.run(main, argv, flags_parser=settings.parse_flags)


if __name__ == "__main__":
    run()
