"""Damaged input that ended in a traceback, a hang or a wrong culprit
(those not about the cluster start): each ends in one line naming
the culprit, nothing lost."""

import json
import os
import time

import pytest

from keras_lars.tools import layout_file
from keras_lars.tools import storage

SHAPES = {"fc6/kernel": (256, 4096), "fc6/bias": (4096,), "fc8/kernel": (4096, 10)}
MESH = {"batch": 4, "model": 2}


def _layout_problem(tmp_path, plan):
    path = tmp_path / "plan.json"
    path.write_text(plan if isinstance(plan, str) else json.dumps(plan))
    with pytest.raises(ValueError) as raised:
        layout_file.read(str(path), SHAPES, devices=8)
    return str(raised.value)


# --- --layout files -----------------------------------------------------------------------
@pytest.mark.parametrize(
    "plan, problem",
    [
        (
            {"mesh": {"batch": True, "model": 8}, "layouts": {}},
            "\"mesh\" sizes must be positive integers, not {'batch': True, 'model': 8}",
        ),
        (
            {"mesh": MESH, "layouts": 5},
            '"layouts" must be an object {"variable path regex": [axis or null, ...]}, not 5',
        ),
        (
            {"mesh": MESH, "layouts": None},
            '"layouts" must be an object {"variable path regex": [axis or null, ...]}, not None',
        ),
        (
            {"mesh": MESH, "layouts": "abc"},
            '"layouts" must be an object {"variable path regex": [axis or null, ...]}, not \'abc\'',
        ),
        (
            {"mesh": MESH, "layouts": [["fc6/kernel", ["model", None]]]},
            '"layouts" must be an object {"variable path regex": [axis or null, ...]}, '
            "not [['fc6/kernel', ['model', None]]]",
        ),
        (
            {"mesh": MESH, "layouts": {"fc6/kernel": ["model", "model"]}},
            "\"fc6/kernel\": ['model', 'model'] names \"model\" twice (a mesh axis lays out "
            "one dimension)",
        ),
        (
            {"mesh": MESH, "layouts": {"(fc6)/\\1": ["model", None]}},
            '"(fc6)/\\1": backreferences are not supported',
        ),
    ],
    ids=["bool_size", "int", "null", "string", "list", "axis_twice", "backreference"],
)
def test_a_layout_file_of_wrong_types_is_one_line(tmp_path, plan, problem):
    assert _layout_problem(tmp_path, plan) == problem


@pytest.mark.parametrize(
    "pattern",
    ["([a-z0-9_/]+)+!", "(a|a)*!", "(?:fc[0-9]*)*x", ".*.*.*.*!"],
    ids=["nested", "alternatives", "group", "stacked"],
)
def test_a_layout_regex_that_backtracks_is_refused_before_it_is_matched(tmp_path, pattern):
    started = time.monotonic()
    problem = _layout_problem(tmp_path, {"mesh": MESH, "layouts": {pattern: ["model", None]}})
    assert problem == (
        f'"{pattern}": may take too long to match (over 1,000,000 ways to try at each '
        "position of a path of up to 64 characters: nested or stacked repeats such as (x+)+ "
        "or .*.*.*.*); write a simpler pattern"
    )
    assert time.monotonic() - started < 1


def test_the_match_bound_takes_the_patterns_the_planner_and_users_write(tmp_path):
    longest = 64
    assert layout_file.match_ways("fc6/kernel", longest) == 1
    assert layout_file.match_ways("(?:conv1|pool1|conv2|pool5)/output", longest) == 4
    assert layout_file.match_ways("fc8/.*", longest) == 65
    assert layout_file.match_ways("conv[0-9]+_block[0-9]+/kernel", longest) == 64 * 64
    assert layout_file.match_ways(".*/kernel.*", longest) == 65 * 65
    assert layout_file.match_ways("([a-z]+)+!", longest) > 2**63
    path = "stage4_block6_conv2_bn/moving_variance"
    shapes = {path: (256,)}
    plan = {"mesh": {"batch": 8, "model": 1}, "layouts": {"stage[0-9]+_.*/moving_.*": [None]}}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    _, layouts = layout_file.read(str(tmp_path / "plan.json"), shapes, devices=8)
    assert layouts == {"stage[0-9]+_.*/moving_.*": (None,)}


def test_a_fifo_in_place_of_the_layout_file_is_refused_without_blocking(tmp_path):
    path = tmp_path / "plan.json"
    os.mkfifo(path)
    with pytest.raises(ValueError) as raised:
        layout_file.read(str(path), SHAPES, devices=8)
    assert str(raised.value) == "cannot read it: it is a FIFO (named pipe), not a file"


def test_special_files_are_named():
    assert storage.special_file("/") == "a directory"
    assert storage.special_file("/dev/null") == "a character device"
    assert storage.special_file(__file__) is None
    assert storage.special_file("/nonexistent/file") is None
    assert storage.special_file("gs://bucket/file") is None


# --- Fashion-MNIST's IDX files ------------------------------------------------------------
def _fashion_mnist(tmp_path):
    from tests.test_fashion_mnist import idx_bytes
    from tests.test_fashion_mnist import make_arrays
    from tests.test_fashion_mnist import write

    folder = tmp_path / "fashion"
    folder.mkdir()
    for name, array in make_arrays().items():
        write(folder, name, idx_bytes(array))
    return folder


def _data_error(folder):
    from keras_lars.tools import input_pipeline

    with pytest.raises(input_pipeline.DataError) as raised:
        input_pipeline.load_fashion_mnist(str(folder))
    return str(raised.value)


@pytest.mark.parametrize(
    "shape, announced",
    [
        ((40, 0, 28), "40x0x28: images of 0x28"),
        ((40, 8, 8), "40x8x8: images of 8x8"),
        ((40, 1, 784), "40x1x784: images of 1x784"),
    ],
    ids=["zero_side", "8x8", "1x784"],
)
def test_images_of_other_sizes_than_28x28_are_refused_from_the_header(tmp_path, shape, announced):
    import numpy as np

    from tests.test_fashion_mnist import idx_bytes
    from tests.test_fashion_mnist import write

    folder = _fashion_mnist(tmp_path)
    write(folder, "train_images", idx_bytes(np.zeros(shape, np.uint8)))
    assert _data_error(folder) == (
        f"{folder}/train-images-idx3-ubyte.gz: its header announces {announced} pixels, "
        "Fashion-MNIST's are 28x28."
    )


def test_a_directory_in_place_of_a_gzip_file_is_one_line(tmp_path):
    folder = _fashion_mnist(tmp_path)
    path = folder / "t10k-labels-idx1-ubyte.gz"
    path.unlink()
    path.mkdir()
    assert _data_error(folder) == f"{path} is a directory, not a gzip file."


def test_a_fifo_in_place_of_a_gzip_file_is_one_line_without_blocking(tmp_path):
    folder = _fashion_mnist(tmp_path)
    path = folder / "train-images-idx3-ubyte.gz"
    path.unlink()
    os.mkfifo(path)
    assert _data_error(folder) == f"{path} is a FIFO (named pipe), not a gzip file."


def test_the_header_is_read_before_the_body_is_decompressed(tmp_path):
    # 64 MB of zeros after 40 images compress to 64 kB: refused after 40 images and a byte.
    import gzip
    import tracemalloc

    import numpy as np

    from tests.test_fashion_mnist import idx_bytes

    folder = _fashion_mnist(tmp_path)
    path = folder / "train-images-idx3-ubyte.gz"
    images = idx_bytes(np.zeros((40, 28, 28), np.uint8))
    path.write_bytes(gzip.compress(images + bytes(2**26), compresslevel=1))
    tracemalloc.start()
    try:
        problem = _data_error(folder)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert problem == (
        f"{path}: longer than its header says (a 40x28x28 header needs 31376 bytes)."
    )
    assert peak < 2**24, peak


def test_a_fifo_or_directory_in_place_of_a_record_file_is_one_line(tmp_path):
    from keras_lars.tools import input_pipeline
    from keras_lars.tools.input_pipeline import tfrecord_files

    os.mkfifo(tmp_path / "train-00000-of-00001")
    with pytest.raises(input_pipeline.DataError) as raised:
        tfrecord_files.list_files(str(tmp_path), tfrecord_files.TRAIN_PATTERN)
    assert str(raised.value) == (
        f"{tmp_path}/train-00000-of-00001 is a FIFO (named pipe), not a TFRecord file."
    )
    os.mkfifo(tmp_path / "dataset.json")
    with pytest.raises(input_pipeline.DataError) as raised:
        tfrecord_files.read_info(str(tmp_path))
    assert (
        str(raised.value) == f"{tmp_path}/dataset.json is a FIFO (named pipe), not a dataset.json."
    )


# --- keras-lars-plan ------------------------------------------------------------------------
NO_GAIN = dict(model="alexnet", devices=2, devices_per_node=2, global_batch_size=8192)


def _plan_main(monkeypatch, capsys, **values):
    """keras-lars-plan's main on PlanSettings(**values): (SystemExit's
    message or None, what it printed)."""
    from keras_lars.tools.plan import cli

    options = cli.PlanSettings(**values)
    monkeypatch.setattr(cli.settings, "options_from_flags", lambda schema: options)
    try:
        cli.main(["keras-lars-plan"])
        message = None
    except SystemExit as stopped:
        message = str(stopped.code)
    return message, capsys.readouterr().out


def test_a_layout_no_layer_gains_from_is_one_line_before_any_table(tmp_path, monkeypatch, capsys):
    path = str(tmp_path / "plan.json")
    message, out = _plan_main(monkeypatch, capsys, **NO_GAIN, layout_out=path)
    assert message == (
        f"error: --layout_out={path}: no layer of --model=alexnet moves fewer bytes "
        "model-parallel at batch 8,192 on 2 devices (or no model axis divides them); nothing "
        "written."
    )
    assert out == "" and not os.path.exists(path)


@pytest.mark.parametrize(
    "where, problem",
    [
        ("missing/plan.json", "no folder {tmp_path}/missing."),
        ("folder", "it is a directory, not a file."),
    ],
)
def test_a_layout_out_that_cannot_be_written_is_one_line_before_the_plan(
    tmp_path, monkeypatch, capsys, where, problem
):
    (tmp_path / "folder").mkdir()
    path = f"{tmp_path}/{where}"
    message, out = _plan_main(
        monkeypatch, capsys, model="alexnet", devices=8, global_batch_size=256, layout_out=path
    )
    assert message == f"error: --layout_out={path}: {problem.format(tmp_path=tmp_path)}"
    assert out == ""


@pytest.mark.parametrize(
    "values, message",
    [
        (
            dict(image_size=99999999999999999999),
            "--image_size=99999999999999999999: must be <= 65536.",
        ),
        (
            dict(image_size_schedule="0:224,2:99999999999999999999", epochs=4),
            "--image_size_schedule=0:224,2:99999999999999999999: phase 2: the image size "
            "99999999999999999999 must be <= 65536.",
        ),
    ],
    ids=["flag", "schedule"],
)
def test_an_image_size_beyond_the_planners_bound_names_the_flag(values, message):
    from keras_lars.tools.plan import cli
    from keras_lars.tools.settings import ConfigError

    with pytest.raises(ConfigError) as raised:
        cli.PlanSettings(**values)
    assert str(raised.value) == message


# --- schedules ------------------------------------------------------------------------------
def _config_problem(schema, values):
    from keras_lars.tools.settings import ConfigError

    with pytest.raises(ConfigError) as raised:
        schema(**values)
    return str(raised.value)


def _schemas():
    from keras_lars.tools import train
    from keras_lars.tools.plan import cli

    return {"train": (train.Config, "train_epochs"), "plan": (cli.PlanSettings, "epochs")}


@pytest.mark.parametrize("tool", ["train", "plan"])
@pytest.mark.parametrize(
    "flag, text, problem",
    [
        (
            "batch_schedule",
            "0:0,2:128",
            "batch schedule phase 1 (epoch 0): the global batch must be an integer >= 1, got 0.",
        ),
        (
            "batch_schedule",
            "0:-4",
            "batch schedule phase 1 (epoch 0): the global batch must be an integer >= 1, got -4.",
        ),
        (
            "image_size_schedule",
            "0:0,2:32",
            "image size schedule phase 1 (epoch 0): the image size must be an integer >= 1, got 0.",
        ),
        (
            "image_size_schedule",
            "0:-32",
            "image size schedule phase 1 (epoch 0): the image size must be an integer >= 1, "
            "got -32.",
        ),
    ],
    ids=["batch_zero", "batch_negative", "size_zero", "size_negative"],
)
def test_a_schedules_first_value_below_one_is_reported_under_the_schedule(
    tool, flag, text, problem
):
    schema, epochs = _schemas()[tool]
    values = {flag: text, epochs: 4, "model": "resnet18"}
    assert _config_problem(schema, values) == f"--{flag}={text}: {problem}"


@pytest.mark.parametrize(
    "text, item",
    [
        ("\uff10:128", "\uff10:128"),  # fullwidth 0
        ("0:\uff11\uff12\uff18", "0:\uff11\uff12\uff18"),  # fullwidth 128
        ("0:128,\u30002:256", "\u30002:256"),  # ideographic space
        ("0:128,2:256\u00a0", "2:256\u00a0"),  # no-break space
        ("0:\u0661\u0662\u0668", "0:\u0661\u0662\u0668"),  # Arabic-Indic 128
    ],
    ids=["fullwidth_epoch", "fullwidth_batch", "ideographic_space", "nbsp", "arabic_indic"],
)
def test_schedules_take_ascii_digits_only(text, item):
    from keras_lars.tools import train

    number = text.split(",").index(item) + 1
    assert _config_problem(train.Config, {"batch_schedule": text, "train_epochs": 4}) == (
        f"--batch_schedule={text}: batch schedule phase {number} {item!r}: expected "
        "epoch:global batch, two whole numbers (e.g. 30:1024)."
    )


# --- the study's store ----------------------------------------------------------------------
def _row(**changes):
    from keras_lars.tools.batch_study import results

    row = dict.fromkeys(results.ROW_FIELDS, 1)
    row.update(optimizer="lars", test_accuracy=0.5, train_accuracy=0.75, key="a")
    return {"key": "a", "row": {**row, **changes}}


@pytest.mark.parametrize(
    "line, problem",
    [
        (
            json.dumps(_row(test_accuracy="NaN")),
            "its test_accuracy is 'NaN', not an accuracy (a number in [0, 1])",
        ),
        (
            json.dumps(_row(test_accuracy=float("nan"))),
            "its test_accuracy is nan, not an accuracy (a number in [0, 1])",
        ),
        (
            json.dumps(_row(test_accuracy_precise_bn=float("inf"))),
            "its test_accuracy_precise_bn is inf, not an accuracy (a number in [0, 1])",
        ),
        (
            json.dumps(_row(train_accuracy=None)),
            "its train_accuracy is None, not an accuracy (a number in [0, 1])",
        ),
        (
            json.dumps(_row(test_accuracy=1.5)),
            "its test_accuracy is 1.5, not an accuracy (a number in [0, 1])",
        ),
        (
            json.dumps(_row(test_accuracy=True)),
            "its test_accuracy is True, not an accuracy (a number in [0, 1])",
        ),
        (json.dumps(_row(steps=-5)), "its steps is -5, not a whole number >= 1"),
        (json.dumps(_row(steps=0)), "its steps is 0, not a whole number >= 1"),
        (json.dumps(_row(steps=2.5)), "its steps is 2.5, not a whole number >= 1"),
        (json.dumps(_row(steps="12")), "its steps is '12', not a whole number >= 1"),
    ],
    ids=[
        "nan_string",
        "nan",
        "inf",
        "null",
        "above_one",
        "bool",
        "steps_negative",
        "steps_zero",
        "steps_fraction",
        "steps_string",
    ],
)
def test_a_study_row_of_unusable_values_is_not_found_done(tmp_path, line, problem):
    from keras_lars.tools import batch_study
    from keras_lars.tools.batch_study import results

    path = tmp_path / "cells.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(storage.StorageError) as raised:
        batch_study.load_store(str(path), results.ROW_FIELDS)
    assert str(raised.value) == (
        f"{path}, line 1: {problem}; repair or remove that line (a removed cell is trained again)"
    )
    assert path.read_text() == line + "\n"  # nothing lost


def test_a_study_row_of_usable_values_is_found_done(tmp_path):
    from keras_lars.tools import batch_study
    from keras_lars.tools.batch_study import results

    path = tmp_path / "cells.jsonl"
    record = _row(test_accuracy=0, train_accuracy=1, test_loss=float("nan"), steps=12)
    batch_study.append_record(str(path), record)
    assert batch_study.load_store(str(path), results.ROW_FIELDS)["a"]["row"]["steps"] == 12


# --- run.lock -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text, problem",
    [
        ("", "it is not JSON (Expecting value: line 1 column 1 (char 0))"),
        (
            "{ torn",
            "it is not JSON (Expecting property name enclosed in double quotes: line 1 "
            "column 3 (char 2))",
        ),
        ("[1, 2]", "it holds [1, 2], not a pid and a host"),
        ('{"pid": "12", "host": "h"}', 'it holds {"pid": "12", "host": "h"}, not a pid and a host'),
        ('{"host": "h"}', 'it holds {"host": "h"}, not a pid and a host'),
    ],
    ids=["empty", "torn", "list", "pid_string", "no_pid"],
)
def test_a_run_lock_that_is_not_a_lock_is_described_and_kept(tmp_path, text, problem):
    path = tmp_path / "run.lock"
    path.write_text(text)
    with pytest.raises(storage.StorageError) as raised:
        with storage.exclusive(str(tmp_path)):
            pass
    assert str(raised.value) == (
        f"--model_dir={tmp_path} has a lock file {path} that is not a run's lock ({problem}); "
        "if no run uses the directory, remove it"
    )
    assert path.read_text() == text  # nothing lost


def test_a_fifo_in_place_of_run_lock_is_described_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "run.lock")
    with pytest.raises(storage.StorageError) as raised:
        with storage.exclusive(str(tmp_path)):
            pass
    assert str(raised.value) == (
        f"--model_dir={tmp_path} has a lock file {tmp_path}/run.lock that is not a run's lock "
        "(it is a FIFO (named pipe)); if no run uses the directory, remove it"
    )


def test_a_fifo_in_place_of_the_study_store_is_one_line_without_blocking(tmp_path):
    from keras_lars.tools import batch_study

    path = tmp_path / "cells.jsonl"
    os.mkfifo(path)
    with pytest.raises(storage.StorageError) as raised:
        batch_study.load_store(str(path))
    assert str(raised.value) == f"{path} is a FIFO (named pipe), not the study's store (a file)"


@pytest.mark.parametrize(
    "target", ["trials.jsonl", "missing.jsonl", "real.jsonl"], ids=["loop", "dangling", "file"]
)
def test_a_symbolic_link_in_place_of_the_study_store_is_one_line(tmp_path, target):
    # The store is appended to in place: a link to a file is refused too.
    from keras_lars.tools import batch_study

    (tmp_path / "real.jsonl").write_text('{"key": "a", "row": {}}\n')
    path = tmp_path / "trials.jsonl"
    path.symlink_to(target)
    line = (
        f"{path} is a symbolic link (to {target}), not the study's store (a file); put the "
        "file itself there"
    )
    for step in (batch_study.load_store, lambda p: batch_study.append_record(p, {"key": "b"})):
        with pytest.raises(storage.StorageError) as raised:
            step(str(path))
        assert str(raised.value) == line
    assert os.readlink(path) == target and not (tmp_path / "missing.jsonl").exists()
    assert (tmp_path / "real.jsonl").read_text() == '{"key": "a", "row": {}}\n'


def test_a_store_the_study_cannot_use_is_refused_before_a_trial_is_trained(tmp_path, monkeypatch):
    # A link loop at trials.jsonl: a trial was trained, its checkpoints
    # removed, and then storing its result failed.
    from keras_lars.tools import batch_study
    from keras_lars.tools.batch_study import target_runner
    from tests.test_batch_study_target import SIMULATED
    from tests.test_batch_study_target import parse

    def run_trial(t):
        raise AssertionError(f"trained {t.name}")

    monkeypatch.setattr(target_runner, "run_trial", run_trial)
    study = parse(*SIMULATED, "--batch_sizes=64", f"--study_dir={tmp_path}")
    path = tmp_path / "trials.jsonl"
    path.symlink_to("trials.jsonl")
    with pytest.raises(storage.StorageError) as raised:
        batch_study.run_target_study(study)
    assert str(raised.value).startswith(f"{path} is a symbolic link (to trials.jsonl)")
    assert os.listdir(tmp_path) == ["trials.jsonl"]


def test_a_store_append_after_a_torn_last_line_starts_a_new_line(tmp_path):
    # The record used to join the torn line, and both were skipped as not JSON.
    from keras_lars.tools import batch_study

    path = tmp_path / "cells.jsonl"
    batch_study.append_record(str(path), {"key": "a", "row": {}})
    with open(path, "a") as f:
        f.write('{"key": "b", "ro')  # killed while appending
    batch_study.append_record(str(path), {"key": "c", "row": {}})
    assert sorted(batch_study.load_store(str(path))) == ["a", "c"]
    assert path.read_text().splitlines()[1:] == ['{"key": "b", "ro', '{"key": "c", "row": {}}']
