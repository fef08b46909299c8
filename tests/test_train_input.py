"""The training tool's input pipeline (keras_lars.tools.input_pipeline) and
make_tfrecords, called in this process.
"""

import json
import os

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from keras_lars.tools import input_pipeline
from keras_lars.tools import make_tfrecords
from keras_lars.tools import train
from keras_lars.tools.settings import ConfigError
from tests import train_data
from tests.train_tool import example
from tests.train_tool import jpeg_bytes
from tests.train_tool import unnormalize
from tests.train_tool import write_records


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    """240 training and 60 validation colour images, 4 classes, labels 1..4."""
    return train_data.imagenet_records(str(tmp_path_factory.mktemp("colours")))


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


# --- records, labels, sharding ------------------------------------------------------
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


def _resident_gb():
    """This process's resident memory in GB (Linux's /proc, as on CI)."""
    with open("/proc/self/status") as f:
        line = next(line for line in f if line.startswith("VmRSS:"))
    return int(line.split()[1]) / 2**20


def test_a_long_training_stream_of_an_in_memory_set_holds_its_arrays_once():
    # The training stream concatenates one dataset an epoch, each capturing
    # the arrays. Held as constants they were copied into every epoch's
    # graph: here 150 x 17.7 MB = 2.6 GB (Fashion-MNIST at batch 16,384 over
    # 1,200 steps: 19 GB); as host variables they are held once.
    from keras_lars.tools.train.feed import train_stream
    from keras_lars.tools.train.length import run_length

    data = input_pipeline.Digits(image_size=32)  # 1438 x 32 x 32 x 3 float32: 17.7 MB
    config = train.Config(global_batch_size=719, train_epochs=150)
    length = run_length(config, data.info.num_train)
    make = train_stream(data, length, 0, config.global_batch_size)
    before = _resident_gb()
    images, labels = next(iter(make(tf.distribute.InputContext())))
    grown = _resident_gb() - before
    assert grown < 0.5, f"the stream of 150 epochs took {grown:.2f} GB"
    order = input_pipeline.epoch_permutation(1438, config.seed, 0)[:719]
    (train_images, train_labels), _ = input_pipeline.load_digits(32)
    np.testing.assert_array_equal(labels, train_labels[order])
    np.testing.assert_array_equal(images, train_images[order])


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


def test_a_validation_split_is_held_out_of_the_training_images_by_its_seed(tmp_path):
    whole = input_pipeline.Digits(image_size=8)
    (train_images, train_labels), (test_images, test_labels) = [
        [array.numpy() for array in split] for split in whole.arrays
    ]
    held = input_pipeline.Digits(image_size=8, validation_examples=300, validation_seed=5)
    (images, labels), (val_images, val_labels) = [
        [array.numpy() for array in split] for split in held.arrays
    ]
    assert (held.info.num_train, held.info.num_eval, held.test.info.num_eval) == (1138, 300, 359)
    drawn = np.random.default_rng(5).permutation(1438)[:300]
    np.testing.assert_array_equal(val_images, train_images[drawn])
    np.testing.assert_array_equal(val_labels, train_labels[drawn])
    rest = np.setdiff1d(np.arange(1438), drawn)  # the others, in their order
    np.testing.assert_array_equal(images, train_images[rest])
    np.testing.assert_array_equal(labels, train_labels[rest])
    np.testing.assert_array_equal(held.test.arrays[0].numpy(), test_images)
    np.testing.assert_array_equal(held.test.arrays[1].numpy(), test_labels)
    # --train_examples cuts the rest; --eval_examples the test split; another seed, others.
    cut = input_pipeline.Digits(
        image_size=8,
        train_examples=100,
        eval_examples=30,
        validation_examples=300,
        validation_seed=5,
    )
    np.testing.assert_array_equal(cut.arrays[0][1].numpy(), train_labels[rest[:100]])
    np.testing.assert_array_equal(cut.arrays[1][1].numpy(), val_labels)
    assert cut.test.info.num_eval == 30 and whole.test is None
    other = input_pipeline.Digits(image_size=8, validation_examples=300, validation_seed=6)
    assert not np.array_equal(other.arrays[1][0].numpy(), val_images)
    # Bad input: one line naming the flag, nothing written.
    config = train.Config(validation_examples=1438, model_dir=str(tmp_path / "run"))
    with pytest.raises(input_pipeline.DataError) as raised:
        input_pipeline.load(config)
    assert str(raised.value) == (
        "--validation_examples=1438: the digits training split has 1438 examples; hold out "
        "fewer, leaving at least one batch to train on."
    )
    with pytest.raises(ConfigError) as raised:
        train.Config(dataset="synthetic", validation_examples=10)
    assert str(raised.value) == (
        "--validation_examples=10: must be >= 0, and held out of an in-memory data set "
        "(digits, fashion_mnist)."
    )
    config = train.Config(validation_examples=1400, global_batch_size=64)
    with pytest.raises(ConfigError) as raised:
        train.run_length(config, 38)
    assert str(raised.value) == (
        "--validation_examples=1400 leaves 38 training examples, fewer than "
        "--global_batch_size=64: an epoch would have no step."
    )
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
