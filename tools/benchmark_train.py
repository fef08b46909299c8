"""Throughput of the training tool, measured in one run:

(a) ResNet-50 training images/s through the tool's own code path
    (train.compiled_model: keras_lars.models.resnet50, LARS with the warmup/poly
    schedule, the tool's loss and metrics) on the tool's synthetic data,
    against a plain `keras.applications.ResNet50(weights=None)` with
    `keras.optimizers.SGD(momentum=0.9)` and `model.fit` on the same
    synthetic batch; the two are timed in alternating rounds, so machine
    noise hits both alike.                          goal: tool / plain >= 1.0
(b) the ImageNet input pipeline's training images/s (decode, random crop,
    resize, flip, normalise, batch) on generated ImageNet-sized JPEG records
    (~500x375, written with make_tfrecords to a temporary folder),
    against the tool's ResNet-50 images/s of (a).     goal: pipeline / model >= 2

    python -m keras_lars.tools.benchmark_train [--size=224 --batch=16 --steps=3 --rounds=3]

Defaults fit a 2-core CPU in a few minutes; on an accelerator raise
--batch and --steps.
"""

import dataclasses
import os
import shutil
import tempfile
import time

import keras
import numpy as np
import tensorflow as tf
from absl import app

import keras_lars
from keras_lars.tools import input_pipeline
from keras_lars.tools import make_tfrecords
from keras_lars.tools import settings
from keras_lars.tools import train
from keras_lars.tools.settings import at_least
from keras_lars.tools.settings import setting

NUM_CLASSES = 1000


@dataclasses.dataclass(frozen=True)
class BenchmarkSettings:
    size: int = setting(224, "Training image side.", check=at_least(32))
    batch: int = setting(16, "Images per step.", check=at_least(1))
    steps: int = setting(3, "Timed steps per round and model.", check=at_least(1))
    rounds: int = setting(3, "Alternating timed rounds.", check=at_least(1))
    records: int = setting(200, "Generated JPEG records for (b).", check=at_least(16))

    def __post_init__(self):
        settings.check(self)


def models_to_compare(image_size, batch_size, steps):
    """{name: (compiled model, dataset)} for (a), on one synthetic batch."""
    config = train.Config(
        model="resnet50",
        dataset="synthetic",
        image_size=image_size,
        num_classes=NUM_CLASSES,
        global_batch_size=batch_size,
    )
    schedule = keras_lars.WarmupPolyDecay(2.0, 5 * steps, 100 * steps)
    data = input_pipeline.synthetic(batch_size, image_size, NUM_CLASSES, seed=0)
    tool = train.compiled_model(config, NUM_CLASSES, schedule)
    plain = keras.applications.ResNet50(
        weights=None, input_shape=(image_size, image_size, 3), classes=NUM_CLASSES
    )
    plain.compile(
        optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return {"tool resnet50 + LARS": (tool, data), "keras ResNet50 + SGD": (plain, data)}


def train_throughput(models, batch_size, steps, rounds):
    """{name: median images/s}, the models timed in alternating rounds."""
    for model, data in models.values():  # trace and warm up
        model.fit(data, steps_per_epoch=2, epochs=1, verbose=0, shuffle=False)
    times = {name: [] for name in models}
    for _ in range(rounds):
        for name, (model, data) in models.items():
            start = time.perf_counter()
            model.fit(data, steps_per_epoch=steps, epochs=1, verbose=0, shuffle=False)
            times[name].append(time.perf_counter() - start)
    return {name: batch_size * steps / float(np.median(t)) for name, t in times.items()}


def write_imagenet_sized_records(directory, count):
    """`count` JPEGs of about 500x375 (smooth colour fields with noise, so
    they compress like photographs) in two class folders, converted to
    ImageNet-format shards; returns the records folder."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for i in range(count):
        folder = os.path.join(directory, "images", f"class_{i % 2}")
        os.makedirs(folder, exist_ok=True)
        height, width = rng.integers(333, 420), rng.integers(450, 520)
        y, x = np.mgrid[0:height, 0:width] / max(height, width)
        phase = rng.uniform(0, 6, size=3)
        field = 127 + 100 * np.sin(4 * x[..., None] + 3 * y[..., None] + phase)
        pixels = np.clip(field + rng.normal(0, 12, field.shape), 0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(os.path.join(folder, f"{i}.jpg"), quality=90)
    records = os.path.join(directory, "records")
    make_tfrecords.convert(os.path.join(directory, "images"), records, "train", num_shards=4)
    make_tfrecords.convert(os.path.join(directory, "images"), records, "validation", num_shards=1)
    return records


def pipeline_throughput(records, image_size, batch_size, batches=30):
    """Training-pipeline images/s over `batches` batches, after one warm-up batch."""
    data = input_pipeline.ImageNetRecords(records, image_size=image_size)
    iterator = iter(data.train(0, batch_size))
    next(iterator)
    start = time.perf_counter()
    for _ in range(batches):
        next(iterator)
    return batch_size * batches / (time.perf_counter() - start)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    options = settings.options_from_flags(BenchmarkSettings)
    size, batch, steps = options.size, options.batch, options.steps
    print(
        f"TF {tf.__version__}, Keras {keras.__version__}, {os.cpu_count()} CPUs; "
        f"{size}x{size} images, batch {batch}, {steps} steps x {options.rounds} rounds"
    )
    rates = train_throughput(models_to_compare(size, batch, steps), batch, steps, options.rounds)
    for name, rate in rates.items():
        print(f"  {name}: {rate:.1f} images/s")
    (tool, tool_rate), (plain, plain_rate) = rates.items()
    ratio = tool_rate / plain_rate
    print(
        f"(a) {tool} / {plain} = {ratio:.3f}  "
        f"(goal >= 1.0: {'ok' if ratio >= 1.0 else 'below goal'})"
    )

    directory = tempfile.mkdtemp(prefix="benchmark_train_")
    try:
        records = write_imagenet_sized_records(directory, options.records)
        input_rate = pipeline_throughput(records, size, batch)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    ratio = input_rate / tool_rate
    print(
        f"  input pipeline: {input_rate:.1f} images/s ({options.records} JPEG records of ~500x375)"
    )
    print(
        f"(b) input pipeline / {tool} = {ratio:.2f}  "
        f"(goal >= 2: {'ok' if ratio >= 2 else 'below goal'})"
    )


def run(argv=None):
    settings.define_flags(BenchmarkSettings)
    app.run(main, argv)


if __name__ == "__main__":
    run()
