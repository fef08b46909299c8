"""The training tool's TensorFlow-free roads, for a JAX-only install, in this
process with TensorFlow taken away where they look for it: the in-memory
data as numpy batches (input_pipeline/host.py) equal to the tf.data ones,
the local files of tools/files.py, and the one line of what needs TensorFlow.
The tool's run without TensorFlow: tests/test_train_jax.py."""

import numpy as np
import pytest
import tensorflow as tf

from keras_lars.tools import files
from keras_lars.tools import input_pipeline
from keras_lars.tools import storage
from keras_lars.tools.input_pipeline import arrays
from keras_lars.tools.input_pipeline import sources
from keras_lars.tools.input_pipeline.host import Batches
from keras_lars.tools.train.config import Config


@pytest.fixture
def without_tensorflow(monkeypatch):
    """The input pipelines and the model dir's files as on a JAX-only install."""
    for module in (arrays, sources):
        monkeypatch.setattr(module, "tf", None)
    monkeypatch.setattr(storage, "gfile", files.LocalFiles)


def _batches(batches):
    return [tuple(np.asarray(part) for part in batch) for batch in batches]


def test_numpy_batches_are_the_tf_data_ones(monkeypatch):
    context = tf.distribute.InputContext(2, 1, 2)  # pipeline 1 of 2: every other example
    made = input_pipeline.Digits(image_size=8, train_examples=200, eval_examples=75)
    train = _batches(made.train(3, 32, context, skip_batches=1).as_numpy_iterator())
    evaluation = _batches(made.eval(32, context).as_numpy_iterator())
    for module in (arrays, sources):
        monkeypatch.setattr(module, "tf", None)
    host = input_pipeline.Digits(image_size=8, train_examples=200, eval_examples=75)
    host_train, host_evaluation = host.train(3, 32, context, skip_batches=1), host.eval(32, context)
    assert isinstance(host_train, Batches) and isinstance(host_evaluation, Batches)
    # batches of 16: 100 of the 200, one skipped; 37 of the 75, padded
    assert len(train) == 5 and len(evaluation) == 3
    for expected, got in ((train, host_train), (evaluation, host_evaluation)):
        got = _batches(got)
        assert len(got) == len(expected)
        for want, have in zip(expected, got):
            assert [a.dtype for a in want] == [a.dtype for a in have]
            for a, b in zip(want, have):
                np.testing.assert_array_equal(a, b)
    assert evaluation[-1][2].tolist() == [1.0] * 5 + [0.0] * 11
    stream = host_train.take(2).concatenate(host_train.take(1))
    assert [y.tolist() for _, y in stream] == [y.tolist() for _, y in _batches(host_train)[:2]] + [
        _batches(host_train)[0][1].tolist()
    ]


def test_grey_images_are_converted_as_tf_data_converts_them(monkeypatch):
    grey = np.random.default_rng(0).integers(0, 256, (3, 28, 28), dtype=np.uint8)
    expected = arrays.grey_to_rgb(tf.constant(grey), 16).numpy()
    monkeypatch.setattr(arrays, "tf", None)  # resized by Keras's backend
    got = arrays.grey_to_rgb(grey, 16)
    assert got.shape == (3, 16, 16, 3) and got.dtype == np.float32
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_what_needs_tensorflow_says_which_extra_brings_it(without_tensorflow, tmp_path):
    with pytest.raises(input_pipeline.DataError) as refused:
        input_pipeline.load(Config(dataset="synthetic"))
    assert str(refused.value) == (
        "--dataset=synthetic is read through TensorFlow (tf.data), which is not installed: "
        "pip install 'keras-lars[cpu]' (or [tensorflow]); digits and fashion_mnist train "
        "without it."
    )
    with pytest.raises(storage.StorageError) as bucket:
        storage.write_json("gs://bucket/run/config.json", {})
    assert str(bucket.value) == (
        "cannot write gs://bucket/run/config.json: gs://bucket/run: a path with a scheme is "
        "read through TensorFlow's file systems, and TensorFlow is not installed: pip install "
        "'keras-lars[cpu]' (or [tensorflow])"
    )


def test_local_files_write_atomically_and_lock(without_tensorflow, tmp_path):
    path = str(tmp_path / "run" / "state.json")
    storage.write_json(path, {"a": 1})
    storage.write_json(path, {"a": 2})  # replaces it
    assert storage.read_json(path) == {"a": 2}
    assert sorted(files.LocalFiles.listdir(str(tmp_path / "run"))) == ["state.json"]
    with pytest.raises(FileExistsError):
        files.LocalFiles.rename(path, path)
    with storage.exclusive(str(tmp_path / "run")):
        with pytest.raises(storage.StorageError, match="is in use by pid"):
            with storage.exclusive(str(tmp_path / "run")):
                pass
    assert not files.LocalFiles.exists(str(tmp_path / "run" / storage.LOCK_FILE))
