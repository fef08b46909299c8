"""--dataset=fashion_mnist: the IDX reader on small generated files, its refusals,
the source's batches, and the training tool and the study on it."""

import gzip
import json
import os
import struct
import subprocess
import sys

import numpy as np
import pytest
from absl import flags

from keras_lars.tools import batch_study
from keras_lars.tools import input_pipeline
from keras_lars.tools import train
from keras_lars.tools.input_pipeline import DataError
from keras_lars.tools.input_pipeline import idx
from tests.train_tool import run_main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MEAN = np.array([0.485, 0.456, 0.406]) * 255
STDDEV = np.array([0.229, 0.224, 0.225]) * 255
TRAIN, TEST = 40, 20
FILES = {
    "train_images": "train-images-idx3-ubyte.gz",
    "train_labels": "train-labels-idx1-ubyte.gz",
    "test_images": "t10k-images-idx3-ubyte.gz",
    "test_labels": "t10k-labels-idx1-ubyte.gz",
}


def idx_bytes(array, magic=None):
    """IDX bytes of a uint8 array, written from the format: 0, 0, 0x08, the
    number of dimensions, the sizes (big-endian uint32), the values."""
    header = bytes([0, 0, 0x08, array.ndim]) if magic is None else struct.pack(">I", magic)
    return header + struct.pack(f">{array.ndim}I", *array.shape) + array.tobytes()


def write(folder, name, data, compress=True):
    with open(os.path.join(folder, FILES.get(name, name)), "wb") as f:
        f.write(gzip.compress(data) if compress else data)


def make_arrays(seed=0):
    """{name: array} of a small Fashion-MNIST: 28x28 uint8 images, labels 0..9."""
    rng = np.random.default_rng(seed)
    return {
        "train_images": rng.integers(0, 256, (TRAIN, 28, 28), dtype=np.uint8),
        "train_labels": (np.arange(TRAIN) % 10).astype(np.uint8),
        "test_images": rng.integers(0, 256, (TEST, 28, 28), dtype=np.uint8),
        "test_labels": rng.integers(0, 10, TEST, dtype=np.uint8),
    }


@pytest.fixture
def arrays():
    return make_arrays()


@pytest.fixture
def data_dir(tmp_path, arrays):
    folder = tmp_path / "fashion"
    folder.mkdir()
    for name, array in arrays.items():
        write(folder, name, idx_bytes(array))
    return str(folder)


def _one_line(error):
    message = str(error.value)
    assert "\n" not in message
    return message


# --- the reader -----------------------------------------------------------------------
def test_the_reader_returns_exactly_the_arrays_written(data_dir, arrays):
    (train_images, train_labels), (test_images, test_labels) = input_pipeline.load_fashion_mnist(
        data_dir
    )
    np.testing.assert_array_equal(train_images, arrays["train_images"])
    np.testing.assert_array_equal(test_images, arrays["test_images"])
    np.testing.assert_array_equal(train_labels, arrays["train_labels"])
    np.testing.assert_array_equal(test_labels, arrays["test_labels"])
    assert train_images.dtype == np.uint8 and train_labels.dtype == np.int32


def test_parse_idx_reads_the_header_big_endian():
    data = bytes.fromhex("00000803 00000002 00000003 00000004") + bytes(range(24))
    array = input_pipeline.parse_idx(data, input_pipeline.IMAGES_MAGIC, "x")
    assert array.shape == (2, 3, 4) and array[1, 2, 3] == 23 and array[0, 1, 0] == 4
    labels = input_pipeline.parse_idx(bytes.fromhex("00000801 00000003 070809"), 0x801, "y")
    assert labels.tolist() == [7, 8, 9]


@pytest.mark.parametrize(
    "name, data, compress, culprit",
    [
        (
            "train_images",
            idx_bytes(np.zeros((TRAIN, 28, 28), np.uint8), magic=0x801),
            True,
            r"train-images-idx3-ubyte.gz: magic number 0x00000801, expected 0x00000803",
        ),
        (
            "test_labels",
            idx_bytes(np.zeros(TEST, np.uint8), magic=0x803),
            True,
            r"t10k-labels-idx1-ubyte.gz: magic number 0x00000803, expected 0x00000801",
        ),
        (
            "train_images",
            idx_bytes(np.zeros((TRAIN, 28, 28), np.uint8))[:-5],
            True,
            r"train-images-idx3-ubyte.gz: truncated \(31371 bytes; a 40x28x28 header needs 31376\)",
        ),
        (
            "train_images",
            idx_bytes(np.zeros((TRAIN, 28, 28), np.uint8)) + b"\0",
            True,
            r"train-images-idx3-ubyte.gz: longer than its header says",
        ),
        (
            "test_images",
            bytes.fromhex("00000803 0000"),
            True,
            r"t10k-images.*truncated in its header",
        ),
        ("test_images", b"\x00\x00", True, r"t10k-images-idx3-ubyte.gz: 2 bytes, too short"),
        (
            "train_labels",
            idx_bytes(np.zeros(TRAIN - 1, np.uint8)),
            True,
            r"train-labels-idx1-ubyte.gz: 39 labels for the 40 images of .*train-images",
        ),
        (
            "test_labels",
            idx_bytes(np.array([0] * (TEST - 1) + [10], np.uint8)),
            True,
            r"t10k-labels-idx1-ubyte.gz: label 10 at index 19 is not a class 0..9",
        ),
        (
            "train_images",
            idx_bytes(np.zeros((TRAIN, 28, 28), np.uint8)),
            False,
            r"train-images-idx3-ubyte.gz: not a readable gzip file",
        ),
        (
            "test_images",
            gzip.compress(idx_bytes(np.zeros((TEST, 28, 28), np.uint8)), mtime=0)[:-30],
            False,
            r"t10k-images-idx3-ubyte.gz: not a readable gzip file",
        ),
    ],
    # Short, fixed ids: a file's bytes by their length (the culprit tells the cases apart).
    ids=lambda value: f"{len(value)}_bytes" if isinstance(value, bytes) else None,
)
def test_a_bad_file_is_refused_naming_the_file_and_the_problem(
    data_dir, name, data, compress, culprit
):
    write(data_dir, name, data, compress)
    with pytest.raises(DataError, match=culprit) as error:
        input_pipeline.load_fashion_mnist(data_dir)
    _one_line(error)


def test_empty_files_are_refused(tmp_path):
    for name in FILES:
        shape = (0, 28, 28) if name.endswith("images") else (0,)
        write(tmp_path, name, idx_bytes(np.zeros(shape, np.uint8)))
    with pytest.raises(DataError, match="train-images-idx3-ubyte.gz: holds no image"):
        input_pipeline.load_fashion_mnist(str(tmp_path))


def test_a_missing_folder_or_file_says_how_to_get_it(tmp_path, data_dir, monkeypatch):
    how = r"apt-get install dataset-fashion-mnist, or give --data_dir with the four files"
    missing = str(tmp_path / "nowhere")
    with pytest.raises(DataError, match=f"no folder {missing}: {how}") as error:
        input_pipeline.load_fashion_mnist(missing)
    _one_line(error)
    os.remove(os.path.join(data_dir, FILES["test_labels"]))
    with pytest.raises(DataError, match=f"t10k-labels-idx1-ubyte.gz is missing: {how}"):
        input_pipeline.load_fashion_mnist(data_dir)
    assert input_pipeline.FASHION_MNIST_DIR == "/usr/share/datasets/fashion-mnist"  # Debian's
    monkeypatch.setattr(idx, "FASHION_MNIST_DIR", missing)  # the default, not installed
    with pytest.raises(DataError, match=f"--dataset=fashion_mnist: no folder {missing}: {how}"):
        input_pipeline.load_fashion_mnist()


# --- the source -------------------------------------------------------------------------
def expected_batch(images):
    """Normalised RGB images from uint8 grey ones, written with numpy."""
    return (np.repeat(images[..., None].astype(np.float64), 3, axis=-1) - MEAN) / STDDEV


def test_training_batches_follow_the_epoch_permutation(data_dir, arrays):
    source = input_pipeline.FashionMNIST(data_dir, image_size=28, seed=3)
    assert source.info == input_pipeline.DatasetInfo("fashion_mnist", TRAIN, TEST, 10)
    batches = list(source.train(epoch=2, global_batch_size=8).as_numpy_iterator())
    assert len(batches) == TRAIN // 8
    order = input_pipeline.epoch_permutation(TRAIN, 3, 2)
    images = np.concatenate([x for x, _ in batches])
    labels = np.concatenate([y for _, y in batches])
    assert images.dtype == np.float32 and images.shape == (TRAIN, 28, 28, 3)
    np.testing.assert_array_equal(labels, arrays["train_labels"][order])
    np.testing.assert_allclose(images, expected_batch(arrays["train_images"][order]), atol=1e-6)
    resumed = list(source.train(epoch=2, global_batch_size=8, skip_batches=3).as_numpy_iterator())
    np.testing.assert_array_equal(resumed[0][1], batches[3][1])


def test_evaluation_covers_each_test_image_once_and_resizes(data_dir, arrays):
    source = input_pipeline.FashionMNIST(data_dir, image_size=28)
    batches = list(source.eval(8).as_numpy_iterator())
    assert len(batches) == source.eval_steps(8) == 3  # 20 images, 4 blanks
    images, labels, weights = (np.concatenate(parts) for parts in zip(*batches))
    assert weights.tolist() == [1.0] * TEST + [0.0] * 4
    np.testing.assert_array_equal(labels[:TEST], arrays["test_labels"])
    np.testing.assert_allclose(images[:TEST], expected_batch(arrays["test_images"]), atol=1e-6)
    larger = input_pipeline.FashionMNIST(data_dir, image_size=32)
    (x, _, _), *_ = larger.eval(8).as_numpy_iterator()
    (y, _), *_ = larger.train(0, 8).as_numpy_iterator()
    assert x.shape == y.shape == (8, 32, 32, 3)


def test_the_config_defaults_to_28_pixels_and_loads_the_source(data_dir):
    config = train.Config(dataset="fashion_mnist", data_dir=data_dir)
    assert config.image_size == 28 and config.model_dir == os.path.join("runs", "fashion_mnist")
    source = input_pipeline.load(config)
    assert isinstance(source, input_pipeline.FashionMNIST) and source.info.num_train == TRAIN


def test_the_study_takes_the_dataset_at_28_pixels(data_dir):
    flag_values = flags.FlagValues()
    batch_study.define_flags(flag_values)
    flag_values(["study", "--dataset=fashion_mnist", f"--data_dir={data_dir}"])
    study = batch_study.study_from_flags(flag_values)
    assert (study.shared.dataset, study.shared.data_dir) == ("fashion_mnist", data_dir)
    assert study.shared.image_size == 28
    digits = flags.FlagValues()
    batch_study.define_flags(digits)
    digits(["study"])
    assert batch_study.study_from_flags(digits).shared.image_size == batch_study.DIGITS_IMAGE_SIZE


# --- the tool, end to end -------------------------------------------------------------
def run_tool(*args):
    return subprocess.run(
        [sys.executable, "-m", "keras_lars.tools.train", *args],
        cwd=ROOT,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_tool_trains_an_epoch_on_the_files(data_dir, tmp_path):
    # In this process (the tool's flags and main, without a process's start);
    # the next test starts the tool. The simple CNN: the model of the
    # Fashion-MNIST study.
    model_dir = tmp_path / "run"
    status = run_main(
        "--dataset=fashion_mnist",
        f"--data_dir={data_dir}",
        "--model=simple_cnn",
        "--image_size=8",
        "--global_batch_size=8",
        "--train_epochs=1",
        "--warmup_epochs=0",
        f"--model_dir={model_dir}",
    )
    assert status == 0
    summary = json.loads((model_dir / "summary.json").read_text())
    assert (summary["epochs"], summary["steps"]) == (1, TRAIN // 8)
    assert 0 <= summary["final"]["val_accuracy"] <= 1 and np.isfinite(summary["final"]["loss"])
    saved = json.loads((model_dir / "config.json").read_text())
    assert (saved["dataset"], saved["data_dir"], saved["image_size"]) == (
        "fashion_mnist",
        data_dir,
        8,
    )


def test_the_tool_refuses_a_bad_file_in_one_line(data_dir, tmp_path):
    write(data_dir, "train_labels", idx_bytes(np.zeros(TRAIN + 1, np.uint8)))
    process = run_tool(
        "--dataset=fashion_mnist", f"--data_dir={data_dir}", f"--model_dir={tmp_path / 'run'}"
    )
    assert process.returncode == 1
    lines = process.stderr.strip().splitlines()
    assert lines[-1].startswith("error: ") and "41 labels for the 40 images" in lines[-1], lines
    assert not (tmp_path / "run" / "checkpoints").exists()
