"""Converts a folder of class folders of images into ImageNet-format TFRecords.

    python -m tools.make_tfrecords --input_dir=photos/train --output_dir=data/photos
    python -m tools.make_tfrecords --input_dir=photos/val --output_dir=data/photos \\
        --split=validation
    python -m tools.train --dataset=imagenet --data_dir=data/photos --model=resnet50 ...

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
folder (nothing is written then).
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import io  # noqa: E402
import json  # noqa: E402
import multiprocessing  # noqa: E402
import random  # noqa: E402
import sys  # noqa: E402

from absl import app  # noqa: E402
from absl import flags  # noqa: E402

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff")
SPLITS = ("train", "validation")
LABELS_FILE = "labels.txt"
INFO_FILE = "dataset.json"
SHUFFLE_SEED = 0

flags.DEFINE_string("input_dir", None, "Folder of class folders of images.")
flags.DEFINE_string("output_dir", None, "Where the shards, labels.txt and dataset.json go.")
flags.DEFINE_enum("split", "train", SPLITS, "Shard file prefix (train-*, validation-*).")
flags.DEFINE_integer("num_shards", 0, "Shards to write; 0: one per 1024 images.")
flags.DEFINE_integer("first_label", 1, "Label of the first class (1: labels 1..N; 0: 0..N-1).")
flags.DEFINE_integer("jpeg_quality", 95, "Quality of re-encoded JPEGs.")
flags.DEFINE_integer("workers", 0, "Processes writing shards; 0: one per CPU.")


class ConversionError(Exception):
    """Bad input; the message names the file or folder."""


def list_examples(input_dir, labels=None):
    """([(path, class index, class name)], class names) of `input_dir`.

    `labels`: an existing class list (from labels.txt) that the folders must
    belong to; None numbers the sorted folder names.
    """
    if not os.path.isdir(input_dir):
        raise ConversionError(f"--input_dir={input_dir} is not a folder.")
    folders = sorted(entry.name for entry in os.scandir(input_dir) if entry.is_dir())
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
            name for name in os.listdir(path)
            if name.lower().endswith(IMAGE_EXTENSIONS)
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

    with open(path, "rb") as f:
        data = f.read()
    try:
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

    return tf.train.Example(features=tf.train.Features(feature={
        "image/encoded": feature(data),
        "image/class/label": feature(label),
        "image/class/synset": feature(synset.encode()),
        "image/height": feature(height),
        "image/width": feature(width),
        "image/format": feature(b"JPEG"),
        "image/filename": feature(os.path.basename(path).encode()),
    })).SerializeToString()


def _write_shard(job):
    """Writes one shard under a temporary name (destination + ".partial")."""
    import tensorflow as tf

    examples, destination, first_label, quality = job
    partial = destination + ".partial"
    with tf.io.TFRecordWriter(partial) as writer:
        for path, index, synset in examples:
            writer.write(jpeg_example(path, first_label + index, synset, quality))


def convert(input_dir, output_dir, split="train", num_shards=0, first_label=1,
            jpeg_quality=95, workers=1):
    """Writes the shards of `split`; returns the number of examples."""
    os.makedirs(output_dir, exist_ok=True)
    labels_path = os.path.join(output_dir, LABELS_FILE)
    labels = None
    if os.path.exists(labels_path):
        with open(labels_path) as f:
            labels = [line.rstrip("\n") for line in f if line.strip()]
    examples, classes = list_examples(input_dir, labels)
    random.Random(SHUFFLE_SEED).shuffle(examples)
    num_shards = num_shards or -(-len(examples) // 1024)
    if not 1 <= num_shards <= len(examples):
        raise ConversionError(
            f"--num_shards={num_shards} must be between 1 and the {len(examples)} images."
        )
    jobs = [
        (examples[i::num_shards],
         os.path.join(output_dir, f"{split}-{i:05d}-of-{num_shards:05d}"),
         first_label, jpeg_quality)
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
            if os.path.exists(destination + ".partial"):
                os.remove(destination + ".partial")
        raise
    # All shards good: publish them, then drop shards of an earlier conversion.
    for _, destination, _, _ in jobs:
        os.replace(destination + ".partial", destination)
    new = {os.path.basename(destination) for _, destination, _, _ in jobs}
    for name in os.listdir(output_dir):
        if name.startswith(split + "-") and "-of-" in name and name not in new:
            os.remove(os.path.join(output_dir, name))
    if labels is None:
        with open(labels_path, "w") as f:
            f.write("".join(name + "\n" for name in classes))
    info_path = os.path.join(output_dir, INFO_FILE)
    info = {}
    if os.path.exists(info_path):
        with open(info_path) as f:
            info = json.load(f)
    info.update({split: len(examples), "num_classes": len(classes),
                 "first_label": first_label})
    with open(info_path + ".partial", "w") as f:
        json.dump(info, f, indent=1)
    os.replace(info_path + ".partial", info_path)
    return len(examples)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    f = flags.FLAGS
    for name in ("input_dir", "output_dir"):
        if not f[name].value:
            sys.exit(f"error: --{name} is required.")
    if f.first_label not in (0, 1):
        sys.exit(f"error: --first_label={f.first_label} must be 0 or 1.")
    if not 1 <= f.jpeg_quality <= 100:
        sys.exit(f"error: --jpeg_quality={f.jpeg_quality} must be in 1..100.")
    try:
        count = convert(f.input_dir, f.output_dir, f.split, f.num_shards, f.first_label,
                        f.jpeg_quality, f.workers or os.cpu_count() or 1)
    except ConversionError as error:
        sys.exit(f"error: {error}")
    print(f"wrote {count} examples to {f.output_dir}/{f.split}-*; train with "
          f"--dataset=imagenet --data_dir={f.output_dir} --label_offset={f.first_label}")


if __name__ == "__main__":
    app.run(main)
