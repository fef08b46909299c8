"""The training tool end to end: the quick start's job in a child process as
users run it, every model family, and the one error line of each bad input
(two in processes, the others through the tool's main in this process).
"""

import io
import json
import os

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from keras_lars import models
from keras_lars.tools import checkpoints
from keras_lars.tools import storage
from keras_lars.tools.train import config as train_config
from tests import train_data
from tests.train_tool import console_script
from tests.train_tool import example
from tests.train_tool import fingerprint
from tests.train_tool import jpeg_bytes
from tests.train_tool import run_main
from tests.train_tool import run_tool
from tests.train_tool import write_records


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """The default run, shortened to 2 epochs of the first 256 digits (2
    steps each, 128 evaluated), finished: (model_dir, process). The wheel
    stage of CI (noxfile.py) runs the default job on all of them. Its two
    tests are newest-only in CI (tests/tiers.py's NEWEST_ONLY_IN_CI): the
    oldest pair does not start it."""
    model_dir = tmp_path_factory.mktemp("default") / "run"
    args = ["--train_epochs=2", "--train_examples=256", "--eval_examples=128"]
    process = run_tool([*args, f"--model_dir={model_dir}"], command=console_script)
    assert process.returncode == 0, process.stderr[-3000:]
    return str(model_dir), process


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    """240 training and 60 validation colour images, 4 classes, labels 1..4."""
    return train_data.imagenet_records(str(tmp_path_factory.mktemp("colours")))


# --- the program, end to end --------------------------------------------------------
def test_default_run_writes_checkpoints_logs_and_summary(finished_run):
    model_dir, process = finished_run
    final = [line for line in process.stdout.splitlines() if line.startswith("final:")]
    assert len(final) == 1 and "val_accuracy=" in final[0] and "model=resnet20" in final[0]
    assert process.stdout.splitlines()[0] == (
        "training resnet20 with lars on digits (8 px), batch 128, 4 steps (2 epochs x 2), "
        f"model_dir {model_dir}, backend tensorflow"
    )
    assert "Epoch 2/2" in process.stdout
    with open(os.path.join(model_dir, "summary.json")) as f:
        summary = json.load(f)
    assert summary["epochs"] == 2 and summary["steps"] == 2 * (256 // 128)
    assert [h["epoch"] for h in summary["history"]] == [1, 2]
    assert summary["final"]["steps"] == summary["steps"]
    assert 0.0 <= summary["final"]["val_accuracy"] <= 1.0
    assert summary["final"]["learning_rate"] == pytest.approx(1e-4)  # end of the decay
    assert summary["layout"] == {"workers": 1, "replicas": 1}
    assert checkpoints.epochs_saved(os.path.join(model_dir, "checkpoints")) == [1, 2]
    events = [
        n
        for _, _, names in os.walk(os.path.join(model_dir, "logs"))
        for n in names
        if n.startswith("events.out.tfevents")
    ]
    assert events


def test_each_model_family_trains_on_generated_tfrecords(records, tmp_path, capfd):
    # ResNet-20 (the CIFAR family, learning the colours), ResNet-18, 34 and
    # 50 and both AlexNets through the tool; ResNet-32 to 110 are ResNet-20's
    # blocks in more repeats, ResNet-101 and 152 ResNet-50's, through the same
    # lookup (models.BUILDERS[--model], whose names are train_config.MODELS):
    # test_models builds and counts them on every pair.
    assert train_config.MODELS == tuple(models.BUILDERS)
    common = [
        "--dataset=imagenet",
        f"--data_dir={records}",
        "--image_size=16",
        "--global_batch_size=8",
        "--warmup_epochs=0",
    ]
    runs = {  # the deep ResNets eagerly: tracing them takes longer than 2 steps
        "resnet20": [
            "--train_epochs=3",
            "--global_batch_size=16",
            "--warmup_epochs=1",
            "--trust_ratio_log_every=10",
            "--label_smoothing=0.1",
        ],
        "resnet18": ["--train_steps=2"],
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
    # In this process (the tool's main, its flags parsed by absl): the
    # console script's own run is the quick start's (finished_run).
    for model, args in runs.items():
        status = run_main(*common, f"--model={model}", f"--model_dir={tmp_path / model}", *args)
        assert status == 0, (model, capfd.readouterr().err[-3000:])
    for model in runs:
        with open(tmp_path / model / "summary.json") as f:
            summary = json.load(f)
        assert summary["config"]["model"] == model
        assert np.isfinite(summary["final"]["loss"])
        assert np.isfinite(summary["final"].get("val_loss", 0.0))
        expected_steps = 45 if model == "resnet20" else 2
        assert summary["final"]["steps"] == summary["steps"] == expected_steps
    with open(tmp_path / "resnet20" / "summary.json") as f:
        assert json.load(f)["final"]["val_accuracy"] >= 0.9  # the colour is learnt
    trust_logs = tmp_path / "resnet20" / "logs" / "trust_ratios"
    assert any(n.startswith("events.out.tfevents") for n in os.listdir(trust_logs))


# --- bad input: one error line ------------------------------------------------------
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
        "optimizer": (
            ["--optimizer=adagrad"],
            "--optimizer=adagrad",
            "lars|lamb|sgd|nesterov|adam",
        ),
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


def _one_error_line(status, stderr, args, culprit, detail):
    assert status == 1, (args, status)
    assert "Traceback" not in stderr, (args, stderr[-3000:])
    lines = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, (args, stderr[-3000:])
    assert culprit in lines[0] and detail in lines[0], (args, lines[0])


def _with_model_dir(args, model_dir):
    return args if any(a.startswith("--model_dir") for a in args) else [*args, model_dir]


# The bad inputs that test_bad_input_is_one_line_naming_the_flag_or_file gives to
# the tool's processes, the console script: absl's flag parser's, before
# TensorFlow loads, and the TPU cluster's start, after (in this process it
# would leave TensorFlow's context to the TPU's). The in-process test below
# runs every other one through the tool's main, without a process start each.
BAD_INPUTS_IN_PROCESSES = ("model", "tpu")


def test_bad_input_is_one_line_naming_the_flag_or_file(finished_run, tmp_path):
    model_dir, _ = finished_run
    before = fingerprint(model_dir)
    cases = _bad_inputs(tmp_path, model_dir)
    cases = [cases[name] for name in BAD_INPUTS_IN_PROCESSES]
    processes = [
        run_tool(_with_model_dir(args, f"--model_dir={model_dir}"), command=console_script)
        for args, _, _ in cases
    ]
    for (args, culprit, detail), process in zip(cases, processes):
        _one_error_line(process.returncode, process.stderr, args, culprit, detail)
    assert fingerprint(model_dir) == before  # nothing in the model dir lost or changed


def test_each_bad_input_is_an_error_naming_the_flag_or_file(tmp_path, capfd):
    """Every other bad input of _bad_inputs, through the tool's main in this
    process (its flags parsed by absl): exit status 1 and one error line
    naming the culprit, no traceback, nothing of a finished run changed (a
    short run of the simple CNN: finished_run is newest-only in CI)."""
    model_dir = tmp_path / "finished"
    train_data.short_run(model_dir, model="simple_cnn")
    before = fingerprint(model_dir)
    cases = _bad_inputs(tmp_path, model_dir)
    for name, (args, culprit, detail) in cases.items():
        if name in BAD_INPUTS_IN_PROCESSES:
            continue
        if name != "into_another_run":
            args = _with_model_dir(args, f"--model_dir={tmp_path / 'runs' / name}")
        capfd.readouterr()
        status = run_main(*args)
        _one_error_line(status, capfd.readouterr().err, args, culprit, detail)
    assert fingerprint(model_dir) == before


def test_an_error_line_is_what_failed_not_tensorflows_headers():
    def gather(x):
        return tf.gather(x, [5])

    for run in (tf.function(gather), gather):  # a graph execution error, an eager op's
        with pytest.raises(tf.errors.InvalidArgumentError) as raised:
            run(tf.constant([1.0]))
        assert raised.value.message.startswith(("Graph execution error:", "{{function_node"))
        assert storage.first_line(raised.value).startswith("indices[0] = 5 is not in [0, 1)")
