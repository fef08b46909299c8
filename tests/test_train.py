"""The training tool (keras_lars.tools.train), its input pipeline and make_tfrecords.

Programs run as users run them, `keras-lars-train ...` or
`python -m keras_lars.tools.train ...` in child
processes (two at a time where several are needed: tracing a Keras model is
single-threaded); the pipeline's pieces are called in-process.
"""

import collections
import concurrent.futures
import dataclasses
import hashlib
import io
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import time

import h5py
import keras
import numpy as np
import pytest
import tensorflow as tf
from absl import flags
from PIL import Image

import keras_lars
from keras_lars import models
from keras_lars.tools import checkpoints
from keras_lars.tools import input_pipeline
from keras_lars.tools import make_tfrecords
from keras_lars.tools import settings
from keras_lars.tools import storage
from keras_lars.tools import train
from keras_lars.tools.benchmark_allreduce import free_ports
from keras_lars.tools.train import build as train_build
from keras_lars.tools.train import cli as train_cli
from keras_lars.tools.train import config as train_config
from keras_lars.tools.train import model_dir as train_model_dir
from keras_lars.tools.train import runtime as train_runtime
from tests import train_data
from tests.processes import CHILD_TIMEOUT
from tests.processes import finish as processes_finish

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT = CHILD_TIMEOUT


# --- helpers ---------------------------------------------------------------------
def tool_command(*args):
    return [sys.executable, "-m", "keras_lars.tools.train", *args]


# The console script that the package installs next to this interpreter.
TRAIN_SCRIPT = os.path.join(os.path.dirname(sys.executable), "keras-lars-train")


def run_tool(args, timeout=TIMEOUT, command=tool_command, **options):
    """The tool run to its end (options: more of subprocess.run's arguments)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run(
        command(*args),
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        **options,
    )


def start_tool(args, **streams):
    """The tool started in the background (streams: Popen's stdout/stderr/text)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.Popen(tool_command(*args), cwd=ROOT, env=env, **streams)


def run_tools(arg_lists, parallel=2):
    """Runs the tool once per argument list, `parallel` at a time."""
    with concurrent.futures.ThreadPoolExecutor(parallel) as pool:
        return list(pool.map(run_tool, arg_lists))


def fingerprint(directory):
    """{relative path: sha256} of every file under `directory`."""
    found = {}
    for parent, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(parent, name)
            with open(path, "rb") as f:
                found[os.path.relpath(path, directory)] = hashlib.sha256(f.read()).hexdigest()
    return found


def h5_arrays(path):
    arrays = {}
    with h5py.File(path, "r") as f:
        f.visititems(
            lambda name, item: (
                arrays.__setitem__(name, item[()]) if isinstance(item, h5py.Dataset) else None
            )
        )
    return arrays


def assert_same_weights(expected_path, actual_path, at_least):
    """Both weights files hold the same arrays (more than `at_least`), bit for bit."""
    expected, actual = h5_arrays(expected_path), h5_arrays(actual_path)
    assert expected.keys() == actual.keys() and len(expected) > at_least
    for name in expected:
        np.testing.assert_array_equal(expected[name], actual[name], err_msg=name)


def jpeg_bytes(pixels, quality=95):
    out = io.BytesIO()
    Image.fromarray(np.asarray(pixels, np.uint8)).save(out, format="JPEG", quality=quality)
    return out.getvalue()


def example(jpeg, label, key="image/encoded"):
    return tf.train.Example(
        features=tf.train.Features(
            feature={
                key: tf.train.Feature(bytes_list=tf.train.BytesList(value=[jpeg])),
                "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
            }
        )
    ).SerializeToString()


def write_records(path, records):
    with tf.io.TFRecordWriter(str(path)) as writer:
        for record in records:
            writer.write(record)


def unnormalize(images):
    return np.asarray(images) * input_pipeline.STDDEV_RGB + input_pipeline.MEAN_RGB


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    """240 training and 60 validation colour images, 4 classes, labels 1..4."""
    return train_data.imagenet_records(str(tmp_path_factory.mktemp("colours")))


def _limit_file_size(limit_bytes):
    """run_tool's command for the tool whose files may not grow past
    `limit_bytes` (EFBIG, like a full disk) instead of it being killed by
    SIGXFSZ: a Python that sets both and execs the tool (no preexec_fn,
    which is unsafe with threads)."""
    setup = (
        "import os, resource, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
        f"resource.setrlimit(resource.RLIMIT_FSIZE, ({limit_bytes}, {limit_bytes})); "
        "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
    )
    return lambda *args: [sys.executable, "-c", setup, *tool_command(*args)[1:]]


def _console_script(*args):
    return [TRAIN_SCRIPT, *args]


# The tests' single runs of the tool: name: (arguments, run_tool's options).
LAUNCHES = {
    # The first 256 digits: 2 steps an epoch at the default batch of 128.
    "divergence_rollback": (
        [
            "--model=alexnet",
            "--train_examples=256",
            "--train_epochs=2",
            "--warmup_epochs=1",
            "--base_learning_rate=1e6",
            "--divergence_rollbacks=2",
            "--divergence_rate_factor=1e-6",
            "--noeval",
        ],
        {},
    ),
    "divergence_after_the_last_rollback": (
        [
            "--image_size=16",
            "--train_epochs=1",
            "--warmup_epochs=0",
            "--base_learning_rate=1e6",
            "--divergence_rollbacks=1",
            "--noeval",
        ],
        {},
    ),
    # 11 steps of 16 an epoch, one execution each.
    "images_per_second": (
        [
            "--model=alexnet",
            "--global_batch_size=16",
            "--train_examples=176",
            "--eval_examples=64",
            "--train_epochs=2",
            "--warmup_epochs=1",
            "--steps_per_execution=11",
            "--base_learning_rate=1",
            "--log_every_seconds=0.000001",
        ],
        {},
    ),
    "divergence": (
        [
            "--image_size=16",
            "--train_epochs=2",
            "--warmup_epochs=0",
            "--base_learning_rate=1e6",
        ],
        {},
    ),
    # Real writes failing mid-file (RLIMIT_FSIZE); AlexNet's weights are ~100
    # MB, and its first checkpoint comes after its one step.
    "checkpoint_write_fails": (
        ["--model=alexnet", "--train_steps=1", "--warmup_epochs=0", "--noeval"],
        dict(command=_limit_file_size(2**21)),
    ),
    "help": (["--help"], dict(command=_console_script)),
}


@pytest.fixture(scope="module")
def launches(tmp_path_factory):
    """Every run of LAUNCHES, two at a time (starting one, and tracing a Keras
    model, takes one core), each in a model dir of its own:
    {name: (model_dir, process)}. A test reads its own."""
    root = tmp_path_factory.mktemp("launches")

    def launch(name):
        args, options = LAUNCHES[name]
        model_dir = root / name / "run"
        if name == "help":
            return model_dir, run_tool(args, **options)
        return model_dir, run_tool([*args, f"--model_dir={model_dir}"], **options)

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        return dict(zip(LAUNCHES, pool.map(launch, LAUNCHES)))


@pytest.fixture(scope="module")
def short_run(tmp_path_factory):
    """train_data.short_run (2 steps, 2 epochs) in this process: (model_dir, config)."""
    model_dir = tmp_path_factory.mktemp("short") / "run"
    config, summary = train_data.short_run(model_dir)
    assert summary["steps"] == 2, summary
    return model_dir, config


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """The default run, shortened to 2 epochs of the first 256 digits (2
    steps each, 128 evaluated), finished: (model_dir, process). The wheel
    stage of CI (noxfile.py) runs the default job on all of them.
    Not one of LAUNCHES: its two tests are newest-only in CI
    (tests/conftest.py's NEWEST_ONLY_IN_CI), and the others' fixture must
    not start it on the oldest pair."""
    model_dir = tmp_path_factory.mktemp("default") / "run"
    args = ["--train_epochs=2", "--train_examples=256", "--eval_examples=128"]
    process = run_tool([*args, f"--model_dir={model_dir}"], command=_console_script)
    assert process.returncode == 0, process.stderr[-3000:]
    return str(model_dir), process


# --- the augmentation's geometry ----------------------------------------------------
def test_train_crop_windows_cover_8_to_100_percent_with_aspect_3_4_to_4_3():
    height, width = 375, 500
    areas, aspects = [], []
    for i in range(300):
        y, x, h, w = input_pipeline.sample_crop_window(
            tf.constant([height, width, 3]), tf.constant([7, i], tf.int64)
        ).numpy()
        assert 0 <= y and 0 <= x and h >= 1 and w >= 1
        assert y + h <= height and x + w <= width
        areas.append(h * w / (height * width))
        aspects.append(w / h)
        # The sampler rounds the crop's sides to pixels: allow one pixel.
        assert (w - 1) / (h + 1) <= 4 / 3 and (w + 1) / (h - 1 if h > 1 else 1) >= 3 / 4
        assert (h + 1) * (w + 1) >= 0.08 * height * width
    assert min(areas) < 0.2 and max(areas) > 0.8  # the whole range is used
    assert min(aspects) < 0.85 and max(aspects) > 1.2


def test_eval_crop_window_is_the_central_224_of_256_square():
    for height, width in ((256, 384), (375, 500), (500, 333), (256, 256)):
        side = int(0.875 * min(height, width))
        expected = [(height - side + 1) // 2, (width - side + 1) // 2, side, side]
        window = input_pipeline.central_crop_window(tf.constant([height, width, 3]))
        assert window.numpy().tolist() == expected
    assert input_pipeline.central_crop_window(tf.constant([256, 384, 3])).numpy().tolist() == [
        16,
        80,
        224,
        224,
    ]


def test_eval_preprocessing_keeps_exactly_the_central_crop():
    # A 256x384 image, red outside its central 224 square (rows 16..239,
    # columns 80..303); inside, 16-pixel bands along the square's edges (top
    # blue, bottom yellow, left cyan, right magenta) around green. Band
    # edges fall on JPEG's 16-pixel blocks, so colours do not bleed.
    colours = {
        "red": (255, 0, 0),
        "green": (0, 255, 0),
        "blue": (0, 0, 255),
        "yellow": (255, 255, 0),
        "cyan": (0, 255, 255),
        "magenta": (255, 0, 255),
    }
    pixels = np.zeros((256, 384, 3), np.uint8)
    pixels[...] = colours["red"]
    pixels[16:240, 80:304] = colours["green"]
    pixels[16:32, 80:304] = colours["blue"]
    pixels[224:240, 80:304] = colours["yellow"]
    pixels[32:224, 80:96] = colours["cyan"]
    pixels[32:224, 288:304] = colours["magenta"]
    image = unnormalize(input_pipeline.preprocess_for_eval(tf.constant(jpeg_bytes(pixels)), 224))
    assert image.shape == (224, 224, 3)
    regions = {
        "blue": image[1:15, 1:-1],
        "yellow": image[209:223, 1:-1],
        "cyan": image[17:207, 1:15],
        "magenta": image[17:207, 209:223],
        "green": image[17:207, 17:207],
    }
    for colour, region in regions.items():
        assert np.abs(region - colours[colour]).mean() < 12, colour
    red = np.all(np.abs(image - colours["red"]) < 60, axis=-1)
    assert not red.any()


def test_train_preprocessing_is_the_resized_window_flipped_half_the_time():
    # Left half black, right half white: a flip is visible in the output.
    pixels = np.zeros((240, 320, 3), np.uint8)
    pixels[:, 160:] = 255
    jpeg = tf.constant(jpeg_bytes(pixels))
    decoded = tf.io.decode_jpeg(jpeg, channels=3)
    flipped_count = straight_count = 0
    for i in range(60):
        seed = tf.constant([3, i], tf.int64)
        out = unnormalize(input_pipeline.preprocess_for_train(jpeg, 32, seed))
        crop_seed, _ = tf.unstack(tf.random.experimental.stateless_split(seed, num=2))
        y, x, h, w = input_pipeline.sample_crop_window(tf.shape(decoded), crop_seed).numpy()
        window = tf.image.resize(decoded[y : y + h, x : x + w], [32, 32]).numpy()
        straight = np.abs(out - window).mean()
        flipped = np.abs(out - window[:, ::-1]).mean()
        assert min(straight, flipped) < 3  # the window, resized (maybe flipped)
        if max(straight, flipped) > 20:  # the window is not left-right symmetric
            flipped_count += flipped < straight
            straight_count += straight < flipped
    assert flipped_count >= 5 and straight_count >= 5


# --- records, labels, sharding --------------------------------------------------------
def test_label_offset_maps_1_based_labels_to_0_based(tmp_path):
    jpeg = jpeg_bytes(np.full((16, 16, 3), 128))
    path = tmp_path / "train-00000-of-00001"
    write_records(path, [example(jpeg, label) for label in (1, 2, 3, 4)])
    dataset = tf.data.TFRecordDataset(str(path)).map(
        lambda r: input_pipeline.parse_record(r, 1, 4)[1]
    )
    assert list(dataset.as_numpy_iterator()) == [0, 1, 2, 3]
    dataset = tf.data.TFRecordDataset(str(path)).map(
        lambda r: input_pipeline.parse_record(r, 0, 5)[1]
    )
    assert list(dataset.as_numpy_iterator()) == [1, 2, 3, 4]
    # Label 4 with offset 0 and 4 classes is out of range: named with the file.
    input_pipeline.validate_files([str(path)], 1, 4)
    write_records(path, [example(jpeg, 4)])
    with pytest.raises(input_pipeline.DataError, match="train-00000-of-00001.*--label_offset"):
        input_pipeline.validate_files([str(path)], 0, 4)


def test_each_worker_reads_its_own_files_and_evaluates_its_share(records):
    data = input_pipeline.ImageNetRecords(records, image_size=16)
    contexts = [tf.distribute.InputContext(2, i, 2) for i in (0, 1)]
    shards = [input_pipeline.shard_files(data.info.train_files, c) for c in contexts]
    assert set(shards[0]).isdisjoint(shards[1])
    assert sorted(shards[0] + shards[1]) == sorted(data.info.train_files)

    def weighted_images(dataset):
        found = []
        for images, _, weights in dataset.as_numpy_iterator():
            found += [image.tobytes() for image, w in zip(images, weights) if w > 0]
        return found

    whole = weighted_images(data.eval(8))
    parts = [weighted_images(data.eval(8, c)) for c in contexts]
    assert len(whole) == data.info.num_eval == 60
    assert sorted(parts[0] + parts[1]) == sorted(whole)
    assert set(parts[0]).isdisjoint(parts[1])
    # Both workers run the same number of full evaluation steps.
    counts = [sum(1 for _ in data.eval(8, c)) for c in contexts]
    assert counts[0] == counts[1]


def test_training_batches_are_a_pure_function_of_seed_and_epoch(records):
    data = input_pipeline.ImageNetRecords(records, image_size=16, seed=5)

    def first_batches(epoch, data=data):
        return [x for x, _ in data.train(epoch, 8).take(3).as_numpy_iterator()]

    again = first_batches(1)
    for a, b in zip(first_batches(1), again):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(first_batches(2)[0], again[0])
    other_seed = input_pipeline.ImageNetRecords(records, image_size=16, seed=6)
    assert not np.array_equal(first_batches(1, other_seed)[0], again[0])
    digits = input_pipeline.Digits()
    a = [y for _, y in digits.train(3, 64).as_numpy_iterator()]
    b = [y for _, y in digits.train(3, 64).as_numpy_iterator()]
    np.testing.assert_array_equal(np.concatenate(a), np.concatenate(b))


def test_digits_split_is_fixed_whatever_the_seed():
    (x_train, y_train), (x_test, y_test) = input_pipeline.load_digits(32)
    assert len(y_train) == 1438 and len(y_test) == 359  # 1797, a fifth held out
    assert x_train.shape == (1438, 32, 32, 3)
    assert sorted(set(y_test.tolist())) == list(range(10))
    other = input_pipeline.Digits(image_size=32, seed=9)
    (_, _), (x_other, y_other) = other.arrays
    np.testing.assert_array_equal(x_other.numpy(), x_test)
    np.testing.assert_array_equal(y_other.numpy(), y_test)


# --- make_tfrecords -----------------------------------------------------------------
def test_train_and_eval_examples_keep_the_first_of_each_split_of_an_in_memory_set(tmp_path):
    whole = input_pipeline.Digits(image_size=8)
    part = input_pipeline.Digits(image_size=8, train_examples=100, eval_examples=30)
    assert (part.info.num_train, part.info.num_eval) == (100, 30)
    for kept, complete, count in zip(part.arrays, whole.arrays, (100, 30)):
        for array, full in zip(kept, complete):
            np.testing.assert_array_equal(array, full[:count])
    config = train.Config(train_examples=1439, model_dir=str(tmp_path / "run"))
    with pytest.raises(input_pipeline.DataError) as raised:
        input_pipeline.load(config)  # was: all 1438 used without a word
    assert str(raised.value) == (
        "--train_examples=1439: the digits training split has 1438 examples; give at most that."
    )
    with pytest.raises(input_pipeline.DataError, match="^--eval_examples=360: the digits test "):
        input_pipeline.Digits(image_size=8, eval_examples=360)
    assert not (tmp_path / "run").exists()


def test_make_tfrecords_writes_imagenet_format_shards(tmp_path):
    source = train_data.colour_folders(str(tmp_path / "photos"), per_class=5)
    out = str(tmp_path / "records")
    assert make_tfrecords.convert(source, out, "train", num_shards=3) == 20
    names = sorted(os.listdir(out))
    assert [n for n in names if n.startswith("train-")] == [
        f"train-0000{i}-of-00003" for i in range(3)
    ]
    with open(os.path.join(out, "labels.txt")) as f:
        assert f.read().split() == ["class_0", "class_1", "class_2", "class_3"]
    with open(os.path.join(out, "dataset.json")) as f:
        assert json.load(f) == {"train": 20, "num_classes": 4, "first_label": 1}
    seen = 0
    for path in sorted(tf.io.gfile.glob(os.path.join(out, "train-*"))):
        for record in tf.data.TFRecordDataset(path):
            features = tf.train.Example.FromString(record.numpy()).features.feature
            jpeg = features["image/encoded"].bytes_list.value[0]
            assert jpeg[:2] == b"\xff\xd8"  # PNGs re-encoded as JPEG
            synset = features["image/class/synset"].bytes_list.value[0].decode()
            label = features["image/class/label"].int64_list.value[0]
            assert label == 1 + int(synset.split("_")[1])
            name = features["image/filename"].bytes_list.value[0].decode()
            path = os.path.join(source, synset, name)
            if name.endswith(".jpg"):  # JPEGs are copied byte for byte
                with open(path, "rb") as f:
                    assert f.read() == jpeg
            original = np.asarray(Image.open(path).convert("RGB"), np.float64)
            decoded = tf.io.decode_jpeg(jpeg).numpy()
            assert decoded.shape == original.shape
            np.testing.assert_allclose(
                decoded.mean(axis=(0, 1)), original.mean(axis=(0, 1)), atol=3
            )
            seen += 1
    assert seen == 20
    # The validation split reuses labels.txt and adds its count.
    make_tfrecords.convert(source, out, "validation", num_shards=1)
    with open(os.path.join(out, "dataset.json")) as f:
        assert json.load(f)["validation"] == 20


def test_make_tfrecords_errors_name_the_file_or_folder(tmp_path):
    source = train_data.colour_folders(str(tmp_path / "photos"), per_class=2)
    with open(os.path.join(source, "class_1", "broken.jpg"), "wb") as f:
        f.write(b"not an image")
    out = str(tmp_path / "records")
    with pytest.raises(make_tfrecords.ConversionError, match="class_1/broken.jpg"):
        make_tfrecords.convert(source, out, "train", num_shards=2)
    assert not [n for n in os.listdir(out) if n.startswith("train-")]  # nothing half-written
    os.remove(os.path.join(source, "class_1", "broken.jpg"))
    make_tfrecords.convert(source, out, "train", num_shards=2)
    os.makedirs(os.path.join(source, "zebra"))
    Image.new("RGB", (8, 8)).save(os.path.join(source, "zebra", "z.png"))
    with pytest.raises(make_tfrecords.ConversionError, match="zebra.*labels.txt"):
        make_tfrecords.convert(source, out, "validation")
    os.makedirs(tmp_path / "empty" / "class_a")
    with pytest.raises(make_tfrecords.ConversionError, match="class_a has no images"):
        make_tfrecords.convert(str(tmp_path / "empty"), str(tmp_path / "r2"))
    with pytest.raises(make_tfrecords.ConversionError, match="no class folders"):
        make_tfrecords.convert(str(tmp_path / "empty" / "class_a"), str(tmp_path / "r3"))
    # Hidden folders are not classes; one data set keeps one label convention.
    os.makedirs(os.path.join(source, ".ipynb_checkpoints"))
    os.remove(os.path.join(source, "zebra", "z.png"))
    os.rmdir(os.path.join(source, "zebra"))
    assert make_tfrecords.list_examples(source)[1] == [f"class_{k}" for k in range(4)]
    with pytest.raises(make_tfrecords.ConversionError, match="--first_label=0: .*--first_label=1"):
        make_tfrecords.convert(source, out, "validation", first_label=0)
    (tmp_path / "a_file").write_text("not a folder")
    with pytest.raises(make_tfrecords.ConversionError, match="a_file.*cannot be created"):
        make_tfrecords.convert(source, str(tmp_path / "a_file" / "out"))


# --- flags and config -----------------------------------------------------------------
def parse(*argv):
    """Config from a command line, through absl's parser and the tool's flags."""
    flag_values = flags.FlagValues()
    settings.define_flags(train.Config, flag_values)
    flag_values(["train", *argv])
    return train.config_from_flags(*settings.from_flags(train.Config, flag_values))


def test_the_default_command_line_is_the_digits_run():
    config = parse()
    assert (config.model, config.optimizer, config.dataset) == ("resnet18", "lars", "digits")
    assert config.image_size == 32 and config.model_dir == os.path.join("runs", "digits")
    assert config.global_batch_size == 128
    assert config.peak_learning_rate == pytest.approx(10.0 * 128 / 256)  # linear scaling
    assert config.strategy == "default" and config.precision == "float32"
    plan = train.run_length(config, 1438)
    assert plan.steps_per_epoch == 1438 // 128 and plan.epochs == config.train_epochs
    assert plan.warmup_steps == round(config.warmup_epochs * (1438 // 128))
    assert parse("--dataset=imagenet", "--data_dir=/d").image_size == 224


def test_mlperf_recipe_sets_the_published_hyperparameters_and_flags_win():
    # MLPerf v0.7 ResNet-50 LARS, batch 32768: peak 29, 18 warmup epochs of 64,
    # momentum 0.929, weight decay 1e-4, label smoothing 0.1.
    config = parse("--recipe=mlperf", "--global_batch_size=32768", "--dataset=synthetic")
    assert (config.peak_learning_rate, config.warmup_epochs, config.train_epochs) == (29.0, 18, 64)
    assert (config.momentum, config.weight_decay, config.label_smoothing) == (0.929, 1e-4, 0.1)
    config = parse(
        "--recipe=mlperf",
        "--global_batch_size=4096",
        "--train_epochs=3",
        "--warmup_epochs=1",
        "--dataset=synthetic",
    )
    assert (config.peak_learning_rate, config.train_epochs, config.warmup_epochs) == (10.0, 3, 1)
    config = parse("--recipe=mlperf", "--global_batch_size=4096", "--base_learning_rate=1")
    assert config.peak_learning_rate == pytest.approx(16.0)
    with pytest.raises(train.ConfigError, match="--recipe=mlperf.*--optimizer=lamb"):
        parse("--recipe=mlperf", "--optimizer=lamb")


def test_plan_counts_steps_and_rejects_bad_lengths():
    config = train.Config(global_batch_size=10, train_steps=25, warmup_epochs=0.5)
    plan = train.run_length(config, 104)  # 10 steps per epoch
    assert (plan.steps_per_epoch, plan.total_steps, plan.epochs) == (10, 25, 3)
    assert [plan.steps_in(e) for e in range(3)] == [10, 10, 5]
    assert plan.warmup_steps == 5
    with pytest.raises(train.ConfigError, match="--steps_per_execution=2"):
        train.run_length(
            train.Config(global_batch_size=10, train_steps=25, steps_per_execution=2), 104
        )
    with pytest.raises(train.ConfigError, match="--warmup_epochs=3"):
        train.run_length(train.Config(global_batch_size=10, train_epochs=2, warmup_epochs=3), 104)
    with pytest.raises(train.ConfigError, match="--global_batch_size=200"):
        train.run_length(train.Config(global_batch_size=200), 104)
    for bad, flag in (
        (dict(momentum=1.0), "--momentum"),
        (dict(base_learning_rate=0.0), "--base_learning_rate"),
        (dict(end_learning_rate=-1.0), "--end_learning_rate"),
        (dict(trust_coefficient=0.0), "--trust_coefficient"),
        (dict(label_smoothing=1.0), "--label_smoothing"),
        (dict(dataset="imagenet"), "--data_dir"),
        (dict(model="alexnet", sync_batch_norm=True), "--sync_batch_norm"),
        (dict(optimizer="sgd", trust_ratio_log_every=5), "--trust_ratio_log_every"),
    ):
        with pytest.raises(train.ConfigError, match=flag):
            train.Config(**bad)


def test_sgd_is_momentum_sgd_with_coupled_weight_decay():
    # One step from w with gradient g: v = lr * (g + wd * w), w' = w - v, for
    # every variable of rank > 1, whatever its norm (no trust ratio).
    config = train.Config(optimizer="sgd", weight_decay=0.1)
    optimizer = train.create_optimizer(config, 0.5)
    w = keras.Variable(np.array([[3.0, 4.0]], np.float32))
    g = np.array([[1.0, -2.0]], np.float32)
    optimizer.apply([g], [w])
    np.testing.assert_allclose(
        w.numpy(), [[3.0, 4.0]] - 0.5 * (g + 0.1 * np.array([[3.0, 4.0]])), rtol=1e-6
    )


def test_global_batch_must_divide_between_replicas(monkeypatch, tmp_path):
    monkeypatch.setattr(
        train_runtime,
        "make_strategy",
        lambda config: keras_lars.make_strategy("mirrored", devices=["/cpu:0", "/cpu:1"]),
    )
    before = os.listdir(tmp_path)
    with pytest.raises(train.ConfigError, match="--global_batch_size=7.*2 replicas"):
        train_data.short_run(tmp_path / "r", global_batch_size=7)  # refused before a step
    assert os.listdir(tmp_path) == before


class WeightSum(keras.metrics.Metric):
    """Sum of the sample weights seen: the number of real examples."""

    def __init__(self, name="examples"):
        super().__init__(name=name)
        self.total = self.add_variable(
            shape=(), initializer="zeros", name="total", aggregation="sum"
        )

    def update_state(self, y_true, y_pred, sample_weight=None):
        weights = keras.ops.ones_like(y_true) if sample_weight is None else sample_weight
        self.total.assign_add(keras.ops.sum(keras.ops.cast(weights, "float32")))

    def result(self):
        return self.total


def test_two_replicas_train_and_evaluate_padded_batches(monkeypatch, records, tmp_path):
    monkeypatch.setattr(
        train_runtime,
        "make_strategy",
        lambda config: keras_lars.make_strategy("mirrored", devices=["/cpu:0", "/cpu:1"]),
    )
    metrics = train.metrics
    monkeypatch.setattr(train_build, "metrics", lambda n: metrics(n) + [WeightSum()])
    config = train.Config(
        model="alexnet_bn",
        dataset="imagenet",
        data_dir=records,
        image_size=32,
        global_batch_size=16,
        train_epochs=1,
        warmup_epochs=0.5,
        base_learning_rate=0.5,
        lr_scaling="none",
        steps_per_execution=5,
        sync_batch_norm=True,
        model_dir=str(tmp_path / "run"),
    )
    summary = train.train_and_evaluate(config)
    assert summary["steps"] == 15 and summary["final"]["steps"] == 15
    assert summary["final"]["val_examples"] == 60  # each validation image once
    # The padded, weighted evaluation of two replicas counts each of the 60
    # validation images once: it equals a plain evaluation of the weights.
    model = train.create_model(config, 4)
    model.load_weights(str(tmp_path / "run" / "checkpoints" / "ckpt-0001.weights.h5"))
    data = input_pipeline.ImageNetRecords(records, image_size=32)
    images, labels = [], []
    for x, y in data.eval(16).map(lambda x, y, w: (x, y)).unbatch().take(60):
        images.append(x.numpy())
        labels.append(int(y))
    predicted = model.predict(np.stack(images), verbose=0).argmax(-1)
    assert summary["final"]["val_accuracy"] == pytest.approx(np.mean(predicted == labels))


# --- the program, end to end --------------------------------------------------------
def test_a_run_in_this_process_checkpoints_each_epoch_and_ends_with_a_summary(short_run):
    model_dir, config = short_run
    summary = json.loads((model_dir / "summary.json").read_text())
    assert (summary["epochs"], summary["steps"], summary["final"]["steps"]) == (2, 2, 2)
    assert [h["epoch"] for h in summary["history"]] == [1, 2]
    assert np.isfinite(summary["final"]["loss"]) and 0 <= summary["final"]["val_accuracy"] <= 1
    assert summary["final"]["learning_rate"] == pytest.approx(config.end_learning_rate)
    assert checkpoints.epochs_saved(str(model_dir / "checkpoints")) == [1, 2]
    saved = json.loads((model_dir / "config.json").read_text())
    assert saved["image_size"] == config.image_size == 8
    assert not (model_dir / "run.lock").exists()  # released


def test_default_run_writes_checkpoints_logs_and_summary(finished_run):
    model_dir, process = finished_run
    final = [line for line in process.stdout.splitlines() if line.startswith("final:")]
    assert len(final) == 1 and "val_accuracy=" in final[0] and "model=resnet18" in final[0]
    assert "Epoch 2/2" in process.stdout
    with open(os.path.join(model_dir, "summary.json")) as f:
        summary = json.load(f)
    assert summary["epochs"] == 2 and summary["steps"] == 2 * (256 // 128)
    assert [h["epoch"] for h in summary["history"]] == [1, 2]
    assert summary["final"]["steps"] == summary["steps"]
    assert 0.0 <= summary["final"]["val_accuracy"] <= 1.0
    assert summary["final"]["learning_rate"] == pytest.approx(1e-4)  # end of the decay
    assert checkpoints.epochs_saved(os.path.join(model_dir, "checkpoints")) == [1, 2]
    events = [
        n
        for _, _, names in os.walk(os.path.join(model_dir, "logs"))
        for n in names
        if n.startswith("events.out.tfevents")
    ]
    assert events


def test_each_model_family_trains_on_generated_tfrecords(records, tmp_path):
    # ResNet-18, 34 and 50 and both AlexNets through the tool; ResNet-101 and
    # 152 are ResNet-50's bottleneck blocks in more repeats, through the same
    # lookup (train_config.MODELS is models.BUILDERS): test_models builds and
    # counts them on every pair. Two tool starts fewer.
    assert train_config.MODELS is models.BUILDERS
    common = [
        "--dataset=imagenet",
        f"--data_dir={records}",
        "--image_size=32",
        "--global_batch_size=8",
        "--warmup_epochs=0",
    ]
    runs = {  # the deep ResNets eagerly: tracing them takes longer than 2 steps
        "resnet18": [
            "--train_epochs=3",
            "--global_batch_size=16",
            "--warmup_epochs=1",
            "--trust_ratio_log_every=10",
            "--label_smoothing=0.1",
        ],
        "alexnet": ["--train_steps=2"],
        "alexnet_bn": ["--train_steps=2", "--optimizer=lamb", "--base_learning_rate=0.01"],
        # Momentum SGD at LARS's default rate (10 per 256) diverges: the
        # divergence guard stops it. 0.1 per 256 is SGD's usual rate.
        "resnet34": [
            "--train_steps=2",
            "--run_eagerly",
            "--optimizer=nesterov",
            "--base_learning_rate=0.1",
            "--eval_examples=8",  # one eager evaluation step
        ],
        "resnet50": [
            "--train_steps=2",
            "--run_eagerly",
            "--optimizer=sgd",
            "--base_learning_rate=0.1",
            "--eval_examples=8",
        ],
    }
    order = ["resnet18", "resnet50", "alexnet_bn", "resnet34", "alexnet"]
    processes = run_tools(
        [common + [f"--model={m}", f"--model_dir={tmp_path / m}"] + runs[m] for m in order]
    )
    for model, process in zip(order, processes):
        assert process.returncode == 0, (model, process.stderr[-3000:])
        with open(tmp_path / model / "summary.json") as f:
            summary = json.load(f)
        assert summary["config"]["model"] == model
        assert np.isfinite(summary["final"]["loss"])
        assert np.isfinite(summary["final"].get("val_loss", 0.0))
        expected_steps = 45 if model == "resnet18" else 2
        assert summary["final"]["steps"] == summary["steps"] == expected_steps
    with open(tmp_path / "resnet18" / "summary.json") as f:
        assert json.load(f)["final"]["val_accuracy"] >= 0.9  # the colour is learnt
    trust_logs = tmp_path / "resnet18" / "logs" / "trust_ratios"
    assert any(n.startswith("events.out.tfevents") for n in os.listdir(trust_logs))


# AlexNet-BN has dropout: a resumed run must also draw the same masks. The
# first 768 digits: 12 steps of 64 an epoch, 2 evaluation steps (was all 1438
# and 360: 22 and 6, for the same claims).
RESUMED = [
    "--model=alexnet_bn",
    "--train_examples=768",
    "--eval_examples=128",
    "--train_epochs=2",
    "--warmup_epochs=1",
    "--global_batch_size=64",
    "--base_learning_rate=4",
]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The RESUMED run through, started in the background for the kill and
    the SIGTERM tests to compare with: (model_dir, wait), wait() its exit
    status and output. Checkpoints every few steps change no number: it
    stands for runs with --checkpoint_every_steps too."""
    model_dir = tmp_path_factory.mktemp("uninterrupted") / "run"
    log = model_dir.parent / "output.txt"
    with open(log, "w") as output:
        process = start_tool(
            [*RESUMED, f"--model_dir={model_dir}"], stdout=output, stderr=subprocess.STDOUT
        )

    def wait():
        return process.wait(TIMEOUT), log.read_text()[-3000:]

    yield model_dir, wait
    if process.poll() is None:
        process.kill()
        process.wait()


def test_rerun_after_kill_resumes_and_ends_as_an_uninterrupted_run(uninterrupted, tmp_path):
    whole, wait = uninterrupted
    killed = tmp_path / "killed"
    victim = start_tool(
        [*RESUMED, f"--model_dir={killed}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    first = killed / "checkpoints" / "ckpt-0001.json"  # written last: the commit
    deadline = time.time() + TIMEOUT
    while not first.exists() and victim.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    assert first.exists() and not (killed / "summary.json").exists()
    saved = checkpoints.epochs_saved(str(killed / "checkpoints"))
    assert saved[-1] < 2  # killed before the end
    resumed = run_tool(RESUMED + [f"--model_dir={killed}"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming {killed} after epoch {saved[-1]}" in resumed.stdout
    status, output = wait()
    assert status == 0, output

    summaries = []
    for directory in (whole, killed):
        with open(directory / "summary.json") as f:
            summaries.append(json.load(f))
    metric_keys = ("loss", "accuracy", "val_loss", "val_accuracy", "learning_rate", "steps")
    assert summaries[0]["final"] == summaries[1]["final"]
    for a, b in zip(summaries[0]["history"], summaries[1]["history"]):
        assert {k: a[k] for k in metric_keys} == {k: b[k] for k in metric_keys}
    name = "ckpt-0002.weights.h5"
    assert_same_weights(whole / "checkpoints" / name, killed / "checkpoints" / name, 20)


def _bad_inputs(tmp_path, finished_model_dir):
    """{name: (arguments, culprit, detail)}: a bad flag, record file or model
    dir each, and what its one error line must name."""
    empty = tmp_path / "empty"
    empty.mkdir()
    jpeg = jpeg_bytes(np.full((24, 24, 3), 90))
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / "train-00000-of-00001").write_bytes(b"\x00not a tfrecord at all" * 10)
    write_records(garbage / "validation-00000-of-00001", [example(jpeg, 1)])
    other = tmp_path / "other_format"
    other.mkdir()
    write_records(other / "train-00000-of-00001", [example(jpeg, 1, key="image/raw")])
    write_records(other / "validation-00000-of-00001", [example(jpeg, 1)])
    (tmp_path / "a_file").write_text("a file where the model dir's parent should be")
    middle = tmp_path / "bad_middle"  # first records fine, record 5 not a JPEG
    middle.mkdir()
    write_records(
        middle / "train-00000-of-00001",
        [example(jpeg, 1 + i % 2) if i != 5 else example(b"\xff\xd8 broken", 1) for i in range(12)],
    )
    write_records(middle / "validation-00000-of-00001", [example(jpeg, 1)])
    png = tmp_path / "png_inside"  # decode_jpeg reads PNG; training's decoder does not
    png.mkdir()
    out = io.BytesIO()
    Image.fromarray(np.full((24, 24, 3), 90, np.uint8)).save(out, format="PNG")
    write_records(png / "train-00000-of-00001", [example(out.getvalue(), 1)])
    write_records(png / "validation-00000-of-00001", [example(jpeg, 1)])
    folder = tmp_path / "folder_shard"
    folder.mkdir()
    write_records(folder / "train-00000-of-00002", [example(jpeg, 1)])
    (folder / "train-00001-of-00002").mkdir()
    write_records(folder / "validation-00000-of-00001", [example(jpeg, 1)])
    imagenet = [
        "--dataset=imagenet",
        "--image_size=16",
        "--global_batch_size=4",
        "--warmup_epochs=0",
        "--num_classes=2",
        "--model=alexnet",
        "--train_examples=12",
        "--eval_examples=1",
        "--train_steps=3",
    ]
    finished = f"--model_dir={finished_model_dir}"
    return {
        "model": (["--model=vgg16"], "--model=vgg16", "resnet18|resnet34"),
        "optimizer": (["--optimizer=adam"], "--optimizer=adam", "lars|lamb|sgd|nesterov"),
        "strategy": (
            ["--strategy=horovod"],
            "--strategy=horovod",
            "default|mirrored|multi_worker|tpu",
        ),
        "empty": (imagenet + [f"--data_dir={empty}"], f"--data_dir={empty}", "train-*"),
        "garbage": (
            imagenet + [f"--data_dir={garbage}"],
            "garbage/train-00000-of-00001",
            "TFRecord",
        ),
        "other_format": (
            imagenet + [f"--data_dir={other}"],
            "other_format/train-00000-of-00001",
            "ImageNet-format",
        ),
        "bad_middle": (  # it trains: a model dir of its own
            imagenet + [f"--data_dir={middle}", f"--model_dir={tmp_path / 'm'}"],
            "bad_middle/train-00000-of-00001: record 5",
            "JPEG",
        ),
        "png_inside": (
            imagenet + [f"--data_dir={png}"],
            "png_inside/train-00000-of-00001",
            "not a readable JPEG",
        ),
        "folder_shard": (
            imagenet + [f"--data_dir={folder}"],
            "folder_shard/train-00001-of-00002",
            "directory",
        ),
        "warmup_inf": (["--warmup_epochs=inf"], "--warmup_epochs=inf", "finite"),
        "rate_nan": (["--base_learning_rate=nan"], "--base_learning_rate=nan", "finite"),
        "seed": (["--seed=-1"], "--seed=-1", "between 0 and"),
        "image_size": (["--image_size=100000"], "--image_size=100000", "between 8 and 4096"),
        "tpu": (["--strategy=tpu", "--tpu=local"], "--strategy=tpu --tpu=local", "cannot start"),
        "rate_0": (["--base_learning_rate=0"], "--base_learning_rate=0", "> 0"),
        "rate_negative": (
            ["--base_learning_rate=-2", "--optimizer=sgd"],
            "--base_learning_rate=-2",
            "> 0",
        ),
        "warmup_longer": (
            ["--warmup_epochs=20", "--train_epochs=3"],
            "--warmup_epochs=20",
            "longer",
        ),
        "into_another_run": (["--model=alexnet", finished], "--model", "other settings"),
        "model_dir_in_a_file": (
            [f"--model_dir={tmp_path / 'a_file' / 'run'}"],
            "cannot write",
            "a_file/run",
        ),
        "steps_per_execution": (
            ["--train_steps=3", "--steps_per_execution=2", "--train_epochs=1"],
            "--steps_per_execution=2",
            "divide",
        ),
    }


# The bad inputs that test_bad_input_is_one_line_naming_the_flag_or_file gives to
# the tool's processes: one for each way an error reaches its command line
# (absl's flag parser, a setting's check, TensorFlow's record reader before and
# during training, the TPU cluster's start, the model dir's checkpoint, the
# disk). The in-process test below checks every other one's message: the same
# exceptions and messages, without the ~15 s start of a process each.
BAD_INPUTS_IN_PROCESSES = (
    "model",
    "warmup_inf",
    "garbage",
    "bad_middle",
    "tpu",
    "into_another_run",
    "model_dir_in_a_file",
)


def test_bad_input_is_one_line_naming_the_flag_or_file(finished_run, tmp_path):
    model_dir, _ = finished_run
    before = fingerprint(model_dir)
    cases = _bad_inputs(tmp_path, model_dir)
    cases = [cases[name] for name in BAD_INPUTS_IN_PROCESSES]
    processes = run_tools(
        [
            args
            + (
                []
                if any(a.startswith("--model_dir") for a in args)
                else [f"--model_dir={model_dir}"]
            )
            for args, _, _ in cases
        ]
    )
    for (args, culprit, detail), process in zip(cases, processes):
        assert process.returncode == 1, (args, process.returncode)
        assert "Traceback" not in process.stderr, (args, process.stderr[-3000:])
        lines = [
            line
            for line in process.stderr.splitlines()
            if line.startswith(("error:", "FATAL Flags parsing error:"))
        ]
        assert len(lines) == 1, (args, process.stderr[-3000:])
        assert culprit in lines[0] and detail in lines[0], (args, lines[0])
    assert fingerprint(model_dir) == before  # nothing in the model dir lost or changed


def test_each_bad_input_is_an_error_naming_the_flag_or_file(tmp_path):
    """Every bad input of _bad_inputs but those that need a process (the TPU
    cluster's start) or a finished run, in this process: parsed by absl with
    the tool's flags, then trained; the error must name the culprit."""
    cases = _bad_inputs(tmp_path, tmp_path / "no_run")
    for name, (args, culprit, detail) in cases.items():
        if name in ("tpu", "into_another_run"):
            continue
        if not any(a.startswith("--model_dir") for a in args):
            args = [*args, f"--model_dir={tmp_path / 'runs' / name}"]
        try:
            train.train_and_evaluate(parse(*args))
        except (flags.Error, *train_cli.KNOWN_ERRORS) as error:
            message = str(error)
        else:
            raise AssertionError(f"{name}: {args} trained without an error")
        assert culprit in message and detail in message, (name, message)
        assert "\n" not in message.strip(), (name, message)


def test_help_lists_every_setting(launches):
    _, process = launches["help"]
    assert process.returncode == 1  # absl's --help
    for field in settings.fields(train.Config):
        assert f"--{field.name}:" in process.stdout or f"--[no]{field.name}:" in process.stdout, (
            field.name
        )


# --- long runs: divergence, bad checkpoints, disks, locks -------------------------------
def test_divergence_stops_with_one_error_line_and_checkpoints_nothing(launches):
    model_dir, process = launches["divergence"]
    assert process.returncode == 1
    errors = [line for line in process.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in process.stderr
    assert re.fullmatch(
        r"error: (loss|val_loss|variable \S+) became non-finite at step \d+ \(epoch 1\); "
        r"last good checkpoint: none \(no checkpoint yet\)",
        errors[0],
    ), errors[0]
    assert checkpoints.epochs_saved(str(model_dir / "checkpoints")) == []
    # config.json comes with the first checkpoint: a failed start locks nothing.
    assert not (model_dir / "config.json").exists() and not (model_dir / "summary.json").exists()
    assert not (model_dir / "run.lock").exists()


def test_divergence_rollback_lowers_the_rate_and_a_resume_keeps_it(launches, tmp_path):
    model_dir, process = launches["divergence_rollback"]
    args = [*LAUNCHES["divergence_rollback"][0], f"--model_dir={model_dir}"]
    assert process.returncode == 0, process.stderr[-3000:]
    warnings = [line for line in process.stderr.splitlines() if "rolling back" in line]
    assert len(warnings) == 1 and re.fullmatch(
        r"warning: (loss|variable \S+) became non-finite at step \d+ \(epoch 1\); rolling back "
        r"to the start with the peak learning rate x1e-06 \(rollback 1 of 2\)",
        warnings[0],
    ), warnings
    summary = json.loads((model_dir / "summary.json").read_text())
    assert all(math.isfinite(h["loss"]) for h in summary["history"])
    # lr = 1e6 * 1e-6 * 128 / 256 at the end of warmup, in the checkpoint's state too.
    assert summary["history"][0]["learning_rate"] == pytest.approx(0.5)
    directory = model_dir / "checkpoints"
    state = json.loads((directory / "ckpt-0002.json").read_text())
    assert (state["rate_factor"], state["rollbacks"]) == (1e-6, 1)

    # A resume from epoch 1 keeps the lowered rate: the same last epoch.
    first_run = tmp_path / "first.weights.h5"
    os.replace(directory / "ckpt-0002.weights.h5", first_run)
    (directory / "ckpt-0002.json").unlink()
    resumed = run_tool(args)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "rolling back" not in resumed.stderr
    assert_same_weights(first_run, directory / "ckpt-0002.weights.h5", 10)


def test_divergence_after_the_last_rollback_is_an_error(launches):
    _, process = launches["divergence_after_the_last_rollback"]
    assert process.returncode == 1, process.stderr[-3000:]
    assert "(rollback 1 of 1)" in process.stderr
    last = process.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and "last good checkpoint: none" in last


def test_a_failed_checkpoint_write_is_one_line_and_leaves_no_file(launches):
    # Real writes failing mid-file (RLIMIT_FSIZE): h5py's error, before a
    # traceback, left a state file without weights.
    model_dir, process = launches["checkpoint_write_fails"]
    assert process.returncode == 1, process.stderr[-3000:]
    assert "Traceback" not in process.stderr
    weights = model_dir / "checkpoints" / "ckpt-0001.weights.h5"
    last = process.stderr.strip().splitlines()[-1]
    assert last == f"error: cannot write {weights}: File too large"
    assert os.listdir(model_dir / "checkpoints") == []  # no state, no partial-* file
    assert not (model_dir / "config.json").exists()  # the directory is not locked to this run


def _copy_of(run, tmp_path):
    import shutil

    model_dir, _ = run
    copy = tmp_path / "copy"
    shutil.copytree(model_dir, copy)
    return copy


def _model_of(model_dir):
    config = train.Config(
        **{
            k: v
            for k, v in json.loads((model_dir / "config.json").read_text()).items()
            if k != "data"
        }
    )
    schedule = keras_lars.WarmupPolyDecay(1.0, 0, 10)
    return train.compiled_model(config, 10, schedule)


def test_an_unusable_latest_checkpoint_falls_back_to_the_previous_one(short_run, tmp_path, capfd):
    model_dir = _copy_of(short_run, tmp_path)
    directory = str(model_dir / "checkpoints")
    latest = model_dir / "checkpoints" / "ckpt-0002.weights.h5"
    latest.write_bytes(latest.read_bytes()[:1000])  # truncated by a full disk
    model = _model_of(model_dir)
    state = checkpoints.restore(model, directory)
    assert state["epochs_done"] == 1
    assert "ckpt-0002 is unusable" in capfd.readouterr().err
    expected = h5_arrays(model_dir / "checkpoints" / "ckpt-0001.weights.h5")
    model.save_weights(str(tmp_path / "loaded.weights.h5"))
    loaded = h5_arrays(tmp_path / "loaded.weights.h5")
    for name, value in expected.items():
        np.testing.assert_array_equal(loaded[name], value, err_msg=name)
    # Non-finite weights and an unreadable state are unusable too; none left: one error.
    with h5py.File(model_dir / "checkpoints" / "ckpt-0001.weights.h5", "r+") as f:
        name = next(
            n
            for n, a in h5_arrays(model_dir / "checkpoints" / "ckpt-0001.weights.h5").items()
            if a.dtype.kind == "f" and a.size
        )
        f[name][...] = np.nan
    assert "non-finite values" in checkpoints.problem(directory, 1)
    (model_dir / "checkpoints" / "ckpt-0002.json").write_text("{ torn")
    with pytest.raises(checkpoints.CheckpointError, match="no usable checkpoint in .*ckpt-0002"):
        checkpoints.restore(_model_of(model_dir), directory)


def test_an_unfinished_save_is_passed_over_and_the_next_save_replaces_it(
    short_run, tmp_path, capfd
):
    # A kill between a save's weights and its state (the CI failure of
    # 2026-12-01: SIGKILL as the first weights file appeared).
    model_dir = _copy_of(short_run, tmp_path)
    directory = str(model_dir / "checkpoints")
    (model_dir / "checkpoints" / "ckpt-0002.json").unlink()
    assert (checkpoints.saved(directory), checkpoints.unfinished(directory)) == ([(1, 0)], [(2, 0)])
    model = _model_of(model_dir)
    assert checkpoints.restore(model, directory)["epochs_done"] == 1
    err = capfd.readouterr().err
    assert err == (
        f"note: {directory}/ckpt-0002.weights.h5 has no state file (its save did not finish); "
        "passed over\n"
    )
    # None committed: a fresh start, not an error.
    (model_dir / "checkpoints" / "ckpt-0001.json").unlink()
    assert checkpoints.restore(_model_of(model_dir), directory) is None
    assert capfd.readouterr().err.count("passed over") == 2
    # The next save replaces the unfinished one at its position and removes
    # what is older than the previous complete checkpoint.
    for epoch in (1, 2, 3):
        checkpoints.save(model, directory, epoch, {"epochs_done": epoch})
    assert sorted(os.listdir(directory)) == [
        f"ckpt-000{e}.{kind}" for e in (2, 3) for kind in ("json", "weights.h5")
    ]
    assert checkpoints.problem(directory, 2) is None


def test_a_checkpoint_that_does_not_fit_the_disk_is_refused_before_writing(
    short_run, tmp_path, monkeypatch
):
    model_dir = _copy_of(short_run, tmp_path)
    model = _model_of(model_dir)
    model.optimizer.build(model.trainable_variables)
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(storage.shutil, "disk_usage", lambda path: usage(10**9, 10**9, 10**5))
    target = tmp_path / "full"
    with pytest.raises(storage.StorageError, match="cannot write .*full: a checkpoint needs"):
        checkpoints.save(model, str(target), 3, {"epochs_done": 3, "history": []})
    assert not target.exists() or os.listdir(target) == []


def test_an_error_line_is_what_failed_not_tensorflows_headers():
    def gather(x):
        return tf.gather(x, [5])

    for run in (tf.function(gather), gather):  # a graph execution error, an eager op's
        with pytest.raises(tf.errors.InvalidArgumentError) as raised:
            run(tf.constant([1.0]))
        assert raised.value.message.startswith(("Graph execution error:", "{{function_node"))
        assert storage.first_line(raised.value).startswith("indices[0] = 5 is not in [0, 1)")


def test_a_lost_worker_is_one_line_naming_the_checkpoint_to_resume_from(tmp_path):
    directory = tmp_path / "checkpoints"
    directory.mkdir()
    for name in ("ckpt-0000-000004", "ckpt-0000-000008"):
        for suffix in (".json", ".weights.h5"):
            (directory / (name + suffix)).write_text("")
    (directory / "other.txt").write_text("")
    (directory / "ckpt-0000-000012.weights.h5").write_text("")  # unfinished: no state
    lost = tf.errors.UnavailableError(None, None, "Collective ops is aborted by: reset by peer")
    try:  # as a checkpoint's write fails: a StorageError raised while handling it
        try:
            raise lost
        except tf.errors.OpError:
            raise storage.StorageError("cannot write x: reset by peer") from None
    except storage.StorageError as error:
        wrapped = error
    values = {"strategy": "multi_worker", "model_dir": str(tmp_path)}
    expected = (
        "a step across the run's workers failed, most likely because another one stopped "
        "(Collective ops is aborted by: reset by peer); run every one again with the same "
        f"command: the run resumes from its last checkpoint, {directory / 'ckpt-0000-000008'}"
    )
    assert train.lost_peer(lost, values) == expected
    assert train.lost_peer(wrapped, values) == expected
    assert train.lost_peer(lost, {**values, "model_dir": str(tmp_path / "new")}).endswith(
        "the run resumes from the start"
    )
    assert train.lost_peer(lost, {**values, "strategy": "default"}) is None
    assert train.lost_peer(ValueError("no"), values) is None


def test_a_second_run_on_one_model_dir_is_refused_and_stale_locks_are_replaced(tmp_path, capsys):
    with storage.exclusive(str(tmp_path)):
        lock = json.loads((tmp_path / "run.lock").read_text())
        assert lock["pid"] == os.getpid()
        with pytest.raises(storage.StorageError, match=f"in use by pid {os.getpid()} on host"):
            with storage.exclusive(str(tmp_path)):
                pass
    assert not (tmp_path / "run.lock").exists()
    gone = _a_pid_not_running()
    (tmp_path / "run.lock").write_text(
        json.dumps({"pid": gone, "host": socket.gethostname(), "since": "earlier"})
    )
    with storage.exclusive(str(tmp_path)):
        assert json.loads((tmp_path / "run.lock").read_text())["pid"] == os.getpid()
    assert f"removing the stale lock of pid {gone} (no longer running)" in capsys.readouterr().out


def _a_pid_not_running():
    """A process id that no process holds, a stale lock's owner, found
    without starting a process: the highest free one below 2**22 (Linux's
    largest pid_max; new processes take the lowest ids after the last one)."""
    pid = 2**22
    while pid > 1:
        pid -= 1
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except PermissionError:
            pass
    raise AssertionError("every process id is in use")


def test_leftovers_are_removed_and_other_data_is_refused(short_run, tmp_path):
    model_dir = _copy_of(short_run, tmp_path)
    leftover = model_dir / "checkpoints" / "partial-ckpt-0003.weights.h5"
    leftover.write_bytes(b"half a file")
    config = dataclasses.replace(short_run[1], model_dir=str(model_dir))  # the run's settings
    info = input_pipeline.DatasetInfo("digits", 128, 64, 10)  # SHORT_RUN's examples
    assert train_model_dir.prepare(config, info)["data"] == {
        "num_classes": 10,
        "num_train": 128,
        "num_eval": 64,
    }
    assert not leftover.exists()
    other = input_pipeline.DatasetInfo("digits", 128, 64, 12)
    with pytest.raises(train.ConfigError, match="other settings .*data: .*num_classes.: 10"):
        train_model_dir.prepare(config, other)


def test_records_without_dataset_json_are_counted_and_noeval_needs_no_validation(
    records, tmp_path, capsys
):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(records, copy)
    os.remove(copy / "dataset.json")
    data = input_pipeline.ImageNetRecords(str(copy), image_size=16)
    assert (data.info.num_train, data.info.num_eval, data.info.num_classes) == (240, 60, 4)
    assert "counting the records" in capsys.readouterr().out
    for path in copy.glob("validation-*"):
        os.remove(path)
    with pytest.raises(input_pipeline.DataError, match="validation-"):
        input_pipeline.ImageNetRecords(str(copy), image_size=16, num_classes=4, train_examples=240)
    data = input_pipeline.ImageNetRecords(str(copy), eval=False, image_size=16)
    assert data.info.num_eval == 0 and data.info.eval_files == ()


def test_images_per_second_with_one_execution_per_epoch(launches):
    model_dir, process = launches["images_per_second"]
    assert process.returncode == 0, process.stderr[-3000:]
    history = json.loads((model_dir / "summary.json").read_text())["history"]
    assert "images_per_second" not in history[0]  # the first epoch traces
    assert history[1]["images_per_second"] > 0
    # Off a terminal, progress lines within the epochs (here after every execution).
    assert "epoch 1/2: step 11/11, loss " in process.stdout
    assert "epoch 2/2: step 11/11, loss " in process.stdout


def test_sigterm_saves_within_the_epoch_and_the_rerun_ends_as_an_uninterrupted_run(
    uninterrupted, tmp_path
):
    # AlexNet-BN has dropout: the resumed epoch must go on with the same masks
    # (restored generator state) and the same batches (skipped, not redrawn).
    args = [*RESUMED, "--checkpoint_every_steps=4"]
    whole, wait = uninterrupted
    stopped = tmp_path / "stopped"
    victim = start_tool(
        [*args, f"--model_dir={stopped}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )

    def inside_first_epoch():  # a step checkpoint of epoch 1 exists (the newest two are kept)
        return any(e == 0 and s >= 4 for e, s in checkpoints.saved(str(stopped / "checkpoints")))

    deadline = time.time() + TIMEOUT
    while not inside_first_epoch() and victim.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    victim.send_signal(signal.SIGTERM)
    _, stderr = victim.communicate(timeout=TIMEOUT)
    assert victim.returncode == train.EXIT_PREEMPTED, stderr[-3000:]
    assert "SIGTERM received" in stderr and "preempted: stopped by SIGTERM" in stderr
    epoch, step = checkpoints.saved(str(stopped / "checkpoints"))[-1]
    assert epoch == 0 and 4 < step < 12  # inside the first epoch (12 steps)
    assert not (stopped / "summary.json").exists()
    resumed = run_tool(args + [f"--model_dir={stopped}"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    inside = f", step {step} of epoch {epoch + 1}" if step else ""
    assert f"resuming {stopped} after epoch {epoch}{inside}" in resumed.stdout
    status, output = wait()
    assert status == 0, output

    summaries = [json.loads((d / "summary.json").read_text()) for d in (whole, stopped)]
    # Validation metrics, rates and step counts equal; the training metrics of
    # the interrupted epoch cover only its steps after the resume.
    keys = ("val_loss", "val_accuracy", "learning_rate", "steps")
    for a, b in zip(summaries[0]["history"], summaries[1]["history"]):
        assert {k: a[k] for k in keys} == {k: b[k] for k in keys}
    name = "ckpt-0002.weights.h5"
    assert_same_weights(whole / "checkpoints" / name, stopped / "checkpoints" / name, 20)


# --- multi-worker: waiting for the cluster, preemption ------------------------------
def _cluster_env(ports, index):
    cluster = {"worker": [f"localhost:{port}" for port in ports]}
    return dict(
        os.environ,
        TF_CPP_MIN_LOG_LEVEL="2",
        CUDA_VISIBLE_DEVICES="",
        TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}}),
    )


def _start_worker(args, ports, index):
    return subprocess.Popen(
        tool_command("--strategy=multi_worker", *args),
        cwd=ROOT,
        env=_cluster_env(ports, index),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _start_cluster(args):
    ports = free_ports(2)
    return [_start_worker(args, ports, index) for index in range(2)]


def _finish(processes):
    """(return codes, stderr texts); kills what is left on a timeout."""
    ended = processes_finish(processes, TIMEOUT)
    return [code for code, _, _ in ended], [err for _, _, err in ended]


@pytest.mark.subprocess
def test_a_worker_whose_peer_never_starts_says_so_and_times_out(tmp_path):
    worker = _start_worker(
        [f"--model_dir={tmp_path / 'run'}", "--worker_start_timeout_minutes=0.05"],
        free_ports(2),
        0,
    )
    codes, errors = _finish([worker])
    assert codes == [1], errors[0][-3000:]
    last = errors[0].strip().splitlines()[-1]
    assert last.startswith("error: --worker_start_timeout_minutes=0.05: 1 of the 1 other tasks")
    assert "worker 1 (localhost:" in last and "did not start within 3 s" in last
    assert not (tmp_path / "run").exists()  # nothing was written


@pytest.mark.subprocess
def test_sigterm_stops_a_worker_waiting_for_its_peer(tmp_path):
    ports = free_ports(2)
    worker = _start_worker([f"--model_dir={tmp_path / 'run'}"], ports, 0)
    deadline = time.time() + TIMEOUT
    while time.time() < deadline and worker.poll() is None:  # listening on its own port
        try:
            socket.create_connection(("localhost", ports[0]), timeout=1).close()
            break
        except OSError:
            time.sleep(0.2)
    worker.send_signal(signal.SIGTERM)
    codes, errors = _finish([worker])
    assert codes == [train.EXIT_PREEMPTED], errors[0][-3000:]
    assert "SIGTERM received: stopping the wait for the other workers" in errors[0]
    assert "preempted: stopped by SIGTERM while waiting for 1 of the 1 other tasks" in errors[0]


@pytest.mark.multiworker
@pytest.mark.subprocess
def test_a_sigterm_then_a_killed_worker_and_the_reruns_end_as_the_uninterrupted_run(tmp_path):
    # TensorFlow's PreemptionCheckpointHandler: both workers save at the same
    # step and exit 75. The rerun loses a worker to SIGKILL; the chief exits
    # 75 with one line. The same two commands then end with the weights of an
    # uninterrupted two-worker run. The second worker starts 5 s late. 6
    # steps an epoch (the first 768 digits; was 11 of all 1438): each
    # all-reduces AlexNet's 20M gradients.
    args = [
        "--model=alexnet",
        "--train_examples=768",
        "--train_epochs=3",
        "--warmup_epochs=1",
        "--global_batch_size=128",
        "--base_learning_rate=4",
        "--noeval",
    ]
    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    uninterrupted = _start_cluster(args + [f"--model_dir={whole}"])
    ports = free_ports(2)
    victims = [_start_worker(args + [f"--model_dir={stopped}"], ports, 0)]
    time.sleep(5)
    victims.append(_start_worker(args + [f"--model_dir={stopped}"], ports, 1))
    deadline = time.time() + TIMEOUT
    while (
        not checkpoints.saved(str(stopped / "checkpoints"))
        and all(v.poll() is None for v in victims)
        and time.time() < deadline
    ):
        time.sleep(0.05)
    victims[1].send_signal(signal.SIGTERM)  # the chief (0) is told by the cluster
    codes, errors = _finish(victims)
    assert codes == [train.EXIT_PREEMPTED] * 2, "\n".join(e[-3000:] for e in errors)
    for error in errors:
        assert "a process of the cluster received SIGTERM" in error, "\n".join(
            e[-3000:] for e in errors
        )
    saved = checkpoints.saved(str(stopped / "checkpoints"))[-1]
    assert (1, 0) < saved < (3, 0)  # after the first epoch, before the end
    assert "waiting for" not in "".join(errors)  # a 5 s start gap is no news
    # The rerun loses worker 1 to a SIGKILL after the epoch-2 checkpoint: the
    # chief's next collective fails, and it exits 75 with one line naming it.
    workers = _start_cluster(args + [f"--model_dir={stopped}"])
    while (
        (2, 0) not in checkpoints.saved(str(stopped / "checkpoints"))
        and all(w.poll() is None for w in workers)
        and time.time() < deadline
    ):
        time.sleep(0.05)
    workers[1].send_signal(signal.SIGKILL)
    codes, errors = _finish(workers)
    assert codes == [train.EXIT_PREEMPTED, -signal.SIGKILL], errors[0][-3000:]
    lines = [line for line in errors[0].splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and lines[0].startswith(
        "error: a step across the run's workers failed, most likely because another one stopped ("
    ), errors[0][-3000:]
    assert re.search(r"the run resumes from its last checkpoint, \S+ckpt-0002$", lines[0])
    codes, errors = _finish(_start_cluster(args + [f"--model_dir={stopped}"]))
    assert codes == [0, 0], "\n".join(e[-3000:] for e in errors)
    codes, errors = _finish(uninterrupted)
    assert codes == [0, 0], "\n".join(e[-3000:] for e in errors)
    name = "ckpt-0003.weights.h5"
    assert_same_weights(whole / "checkpoints" / name, stopped / "checkpoints" / name, 10)


# Two workers, 2 LARS steps of ResNet-18 on 64 digits at 8x8, a checkpoint after each.
FIRST_STEPS = [
    "--image_size=8",
    "--global_batch_size=64",
    "--train_steps=2",
    "--warmup_epochs=0.05",
    "--checkpoint_every_steps=1",
    "--noeval",
    "--log_every_seconds=0",
]
BFLOAT16_ROUNDOFF = 2.0**-8  # bfloat16 keeps 8 significant bits


@pytest.mark.multiworker
@pytest.mark.subprocess
def test_bfloat16_all_reduce_on_two_workers_rounds_only_the_summed_gradients(tmp_path):
    """Jia et al. 2018: half the bytes on the wire. A float32 and a bfloat16
    cluster run the same forward and backward pass in their first step; only
    the all-reduced sum differs, by bfloat16's rounding of each worker's
    gradient and of the sum. So after that step every trained variable is off
    by a few roundoffs of a step (measured: at most 4.5e-3 of the next step's
    size, 2026-12-03), and batch norm's moving statistics, which the forward
    pass sets, are equal. (Before 2026-12-03 this test trained both clusters 6
    epochs: 0.964 validation accuracy with bfloat16, 0.983 with float32.)"""
    clusters = {
        dtype: _start_cluster(
            [*FIRST_STEPS, f"--allreduce_dtype={dtype}", f"--model_dir={tmp_path / dtype}"]
        )
        for dtype in ("float32", "bfloat16")
    }
    for dtype, processes in clusters.items():
        codes, errors = _finish(processes)
        assert codes == [0, 0], "\n".join(e[-3000:] for e in errors)
        summary = json.loads((tmp_path / dtype / "summary.json").read_text())
        assert summary["config"]["allreduce_dtype"] == dtype and summary["steps"] == 2
        assert np.isfinite(summary["final"]["loss"])

    def weights(dtype, name):
        return h5_arrays(tmp_path / dtype / "checkpoints" / f"{name}.weights.h5")

    first, second = weights("float32", "ckpt-0000-000001"), weights("float32", "ckpt-0001")
    rounded = weights("bfloat16", "ckpt-0000-000001")
    trained, statistics = 0, 0
    for name, value in first.items():
        if not name.startswith("layers/"):
            continue
        off = float(np.abs(rounded[name] - value).max())
        if "batch_normalization" in name and name.endswith(("vars/2", "vars/3")):
            assert off == 0, name  # moving mean and variance
            statistics += 1
            continue
        step = float(np.abs(second[name] - value).max())
        assert 0 < off <= 4 * BFLOAT16_ROUNDOFF * step, (name, off / step)
        trained += 1
    assert (trained, statistics) == (62, 40)  # ResNet-18's trained variables, 20 batch norms
