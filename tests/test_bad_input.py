"""Bad input that used to end in a traceback or pass silently: each must
end in one line naming the culprit, with nothing lost."""

import json
import os

import numpy as np
import pytest

from keras_lars.tools import input_pipeline
from keras_lars.tools import train
from keras_lars.tools.train import model_dir as train_model_dir
from tests import train_data
from tests.test_mirrored_steps import _all_reduced
from tests.train_tool import fingerprint
from tests.train_tool import run_main

DIGITS = input_pipeline.DatasetInfo("digits", 1438, 359, 10)


@pytest.mark.parametrize("text", ["", "{ torn", "[1, 2]"])
def test_an_unreadable_config_json_is_one_error_naming_the_file(tmp_path, text):
    config = train.Config(model_dir=str(tmp_path))
    path = tmp_path / "config.json"
    path.write_text(text)
    with pytest.raises(train.ConfigError) as raised:
        train_model_dir.prepare(config, DIGITS)
    line = str(raised.value)
    assert "\n" not in line
    assert str(path) in line and "--model_dir" in line, line
    assert path.read_text() == text  # nothing lost


@pytest.mark.parametrize(
    "line",
    ['{"row": {"x": 1}}', "[1, 2]", '"text"', '{"key": ["a"], "row": {}}', '{"key": "b"}'],
)
def test_a_wrong_shaped_line_of_the_study_store_is_one_error_naming_file_and_line(tmp_path, line):
    from keras_lars.tools import batch_study
    from keras_lars.tools import storage

    path = tmp_path / "cells.jsonl"
    batch_study.append_record(str(path), {"key": "a", "row": {"x": 1}})
    with open(path, "a") as f:
        f.write(line + "\n")
    before = path.read_text()
    with pytest.raises(storage.StorageError) as raised:
        batch_study.load_store(str(path))
    message = str(raised.value)
    assert "\n" not in message
    assert f"{path}, line 2" in message, message
    assert path.read_text() == before  # nothing lost


@pytest.mark.parametrize(
    "nested",
    ["[" * 100_000 + "]" * 100_000, '{"a": ' * 100_000 + "1" + "}" * 100_000],
    ids=["list", "object"],
)
def test_a_deeply_nested_line_of_the_study_store_is_one_error_naming_file_and_line(
    tmp_path, nested
):
    # json.loads raised RecursionError: a traceback.
    from keras_lars.tools import batch_study
    from keras_lars.tools import storage

    path = tmp_path / "trials.jsonl"
    batch_study.append_record(str(path), {"key": "a", "row": {"x": 1}})
    with open(path, "a") as f:
        f.write(nested + "\n")
    before = path.read_text()
    with pytest.raises(storage.StorageError) as raised:
        batch_study.load_store(str(path))
    assert str(raised.value) == (
        f"{path}, line 2: JSON nested too deeply to read, not a cell's record; repair or "
        "remove that line (a removed cell is trained again)"
    )
    assert path.read_text() == before  # nothing lost


def test_a_stored_row_without_the_study_fields_names_file_and_line(tmp_path):
    from keras_lars.tools import batch_study
    from keras_lars.tools import storage
    from keras_lars.tools.batch_study import results

    path = tmp_path / "cells.jsonl"
    batch_study.append_record(str(path), {"key": "a", "row": {"x": 1}})
    with pytest.raises(storage.StorageError, match=f"{path}, line 1: .*optimizer"):
        batch_study.load_store(str(path), results.ROW_FIELDS)


@pytest.mark.parametrize(
    "values, message",
    [
        (dict(devices_per_node=0), "--devices_per_node=0: must be >= 1."),
        (dict(devices_per_node=-8), "--devices_per_node=-8: must be >= 1."),
        (dict(parameters=-5), "--parameters=-5: must be >= 0."),
        (dict(model="custom", parameters=-5, forward_gflops=4.0), "--parameters=-5: must be "),
        (dict(forward_gflops=-1.0), "--forward_gflops=-1.0: must be >= 0"),
    ],
)
def test_bad_planner_settings_name_the_flag(values, message):
    from keras_lars.tools import plan
    from keras_lars.tools.settings import ConfigError

    with pytest.raises(ConfigError) as raised:
        plan.PlanSettings(**values)
    assert str(raised.value).startswith(message), raised.value


def test_num_processes_0_outside_a_cluster_is_one_error_naming_what_jax_missed(
    tmp_path, monkeypatch
):
    pytest.importorskip("jax")
    from keras_lars.tools.train import runtime_jax

    launchers = ("SLURM_", "OMPI_", "PMI_", "PMIX_", "TPU_", "KUBERNETES_", "JAX_", "MEGASCALE_")
    for name in list(os.environ):
        if name.startswith(launchers):
            monkeypatch.delenv(name)
    config = train.Config(backend="jax", num_processes=0, model_dir=str(tmp_path))
    with pytest.raises(train.ConfigError) as raised:
        runtime_jax.start_processes(config)
    line = str(raised.value)
    assert "\n" not in line
    assert line.startswith("--num_processes=0: ") and "coordinator" in line, line


def test_an_end_rate_above_the_peak_rate_is_refused_naming_both(tmp_path):
    # The peak is the base rate scaled by --lr_scaling: 0.1 * 64 / 256 = 0.025.
    settings = dict(base_learning_rate=0.1, global_batch_size=64, model_dir=str(tmp_path))
    with pytest.raises(train.ConfigError) as raised:
        train.Config(end_learning_rate=0.05, **settings)
    line = str(raised.value)
    assert line.startswith("--end_learning_rate=0.05: "), line
    assert "0.025" in line and "--base_learning_rate=0.1" in line and "--lr_scaling" in line
    assert train.Config(end_learning_rate=0.025, **settings).end_learning_rate == 0.025
    assert train.Config(end_learning_rate=0.05, lr_scaling="none", **settings)


@pytest.mark.parametrize(
    "settings", [dict(backend="tensorflow"), dict(backend="jax", distribution="model_parallel")]
)
def test_float64_is_refused_off_jax_and_with_model_parallel(tmp_path, settings):
    with pytest.raises(train.ConfigError) as raised:
        train.Config(precision="float64", model_dir=str(tmp_path), **settings)
    line = str(raised.value)
    assert line.startswith("--precision=float64: float64 runs on --backend=jax only, and not ")
    assert "--distribution=model_parallel" in line and "\n" not in line
    config = train.Config(precision="float64", backend="jax", model_dir=str(tmp_path))
    assert config.distribution == "none"


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_non_finite_gradient_entry_stays_in_its_place_as_in_float32(dtype):
    inf, nan = np.inf, np.nan
    parts = [
        [np.array([1, inf, 2], "float32"), np.array([1, nan, -inf, 0.5, 7], "float32")],
        [np.array([2, 1, 4], "float32"), np.array([2, 1, inf, 0.25, inf], "float32")],
    ]
    reduced = _all_reduced(parts, dtype)
    np.testing.assert_array_equal(reduced[0], [3, inf, 6])
    for result, part_0, part_1 in zip(reduced, *parts):
        with np.errstate(invalid="ignore"):  # inf - inf
            expected = part_0 + part_1  # numpy, float32: elementwise
        np.testing.assert_array_equal(np.isnan(result), np.isnan(expected))
        np.testing.assert_allclose(result, expected, rtol=2**-7)  # equal infinities


def _tiny_model():
    import keras

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    model.optimizer.build(model.trainable_variables)
    return model


def test_a_deleted_weights_file_of_the_only_checkpoint_is_refused_naming_it(tmp_path, capfd):
    from keras_lars.tools import checkpoints

    directory = str(tmp_path / "checkpoints")
    state = {"epochs_done": 0, "steps_done": 4, "history": []}
    checkpoints.save(_tiny_model(), directory, 0, state, step=4)
    weights = tmp_path / "checkpoints" / "ckpt-0000-000004.weights.h5"
    weights.unlink()
    with pytest.raises(checkpoints.CheckpointError) as raised:
        checkpoints.restore(_tiny_model(), directory)
    line = str(raised.value)
    assert "\n" not in line and str(weights) in line, line
    assert (tmp_path / "checkpoints" / "ckpt-0000-000004.json").exists()  # nothing lost


def test_a_deleted_weights_file_of_the_latest_checkpoint_falls_back_saying_so(tmp_path, capfd):
    from keras_lars.tools import checkpoints

    directory = str(tmp_path / "checkpoints")
    model = _tiny_model()
    checkpoints.save(model, directory, 1, {"epochs_done": 1, "steps_done": 0, "history": []})
    state = {"epochs_done": 1, "steps_done": 4, "history": []}
    checkpoints.save(model, directory, 1, state, step=4)
    weights = tmp_path / "checkpoints" / "ckpt-0001-000004.weights.h5"
    weights.unlink()
    assert checkpoints.restore(_tiny_model(), directory)["epochs_done"] == 1
    (line,) = [line for line in capfd.readouterr().err.splitlines() if line.strip()]
    assert line.startswith("warning: checkpoint ") and str(weights) in line, line


# The short runs here are the simple CNN's (327k parameters at 8x8), not
# ResNet-18's: the record of a run and its throughput are any model's.
TINY = dict(model="simple_cnn")


def test_a_resumed_run_reports_its_own_throughput_not_the_checkpoints(tmp_path, capsys):
    model_dir = tmp_path / "run"
    _, whole = train_data.short_run(model_dir, train_epochs=3, **TINY)
    measured = [h["images_per_second"] for h in whole["history"] if "images_per_second" in h]
    assert measured and whole["train_images_per_second"] in measured
    for path in (model_dir / "checkpoints").glob("ckpt-0003*"):
        path.unlink()  # as if stopped after epoch 2
    capsys.readouterr()
    # The resumed process trains one epoch of one step: the first epoch of a
    # process traces, so it measures nothing.
    _, resumed = train_data.short_run(model_dir, train_epochs=3, **TINY)
    output = capsys.readouterr().out
    assert "resuming" in output
    assert resumed["history"][1]["images_per_second"] == whole["history"][1]["images_per_second"]
    assert resumed["train_images_per_second"] is None
    (final,) = [line for line in output.splitlines() if line.startswith("final:")]
    assert " images_per_second=none " in final, final
    assert "no epoch of this process was timed" in final, final


# --- a model dir without config.json: the checkpoints' record of the run ----------------
@pytest.fixture(scope="module")
def lars_run(tmp_path_factory):
    """train_data.short_run (LARS, 2 epochs of 1 step) in this process: its model_dir."""
    model_dir = tmp_path_factory.mktemp("lars") / "run"
    train_data.short_run(model_dir, **TINY)
    return model_dir


def _without_config_json(lars_run, tmp_path, last_checkpoint=True):
    """A copy of the run with config.json deleted (and its last checkpoint, unless kept)."""
    import shutil

    model_dir = tmp_path / "run"
    shutil.copytree(lars_run, model_dir)
    (model_dir / "config.json").unlink()
    if not last_checkpoint:
        for path in (model_dir / "checkpoints").glob("ckpt-0002*"):
            path.unlink()
    return model_dir


def test_a_deleted_config_json_still_refuses_other_settings_naming_them(lars_run, tmp_path, capfd):
    # Before: this rerun resumed the LARS run's checkpoint with SGD, diverged
    # (val_loss 2.2e7) and exited 0. Now the checkpoint's record refuses it.
    # The tool's main in this process: exit status 1 and its one line.
    model_dir = _without_config_json(lars_run, tmp_path)
    before = fingerprint(model_dir)
    flags = [f"--{k}={v}" for k, v in {**train_data.SHORT_RUN, **TINY}.items()]
    capfd.readouterr()
    status = run_main(*flags, "--optimizer=sgd", "--momentum=0.5", f"--model_dir={model_dir}")
    out, err = capfd.readouterr()
    assert status == 1, err[-3000:]
    assert "Traceback" not in err
    (line,) = [line for line in err.splitlines() if line.startswith("error:")]
    assert line == (
        f"error: --model_dir={model_dir} holds a run with other settings (--optimizer: "
        "'lars' there, 'sgd' now, --momentum: 0.9 there, 0.5 now); resume it with its flags "
        "or use another --model_dir."
    )
    assert "resuming" not in out
    assert fingerprint(model_dir) == before  # byte for byte: nothing written, nothing lost


def test_a_resumable_change_without_config_json_resumes_and_writes_it_again(
    lars_run, tmp_path, capfd
):
    model_dir = _without_config_json(lars_run, tmp_path, last_checkpoint=False)
    _, summary = train_data.short_run(model_dir, eval=False, log_every_seconds=5.0, **TINY)
    output = capfd.readouterr()
    assert f"resuming {model_dir} after epoch 1" in output.out
    assert "warning" not in output.err and "error" not in output.err
    assert [h["epoch"] for h in summary["history"]] == [1, 2]
    assert "val_loss" in summary["history"][0] and "val_loss" not in summary["history"][1]
    # config.json is written again, with this run's settings (--noeval now).
    saved = json.loads((model_dir / "config.json").read_text())
    assert saved["eval"] is False and saved["optimizer"] == "lars"
    state = json.loads((model_dir / "checkpoints" / "ckpt-0002.json").read_text())
    assert state["settings"] == saved and state["layout"] == {"workers": 1, "replicas": 1}


def test_a_checkpoint_without_the_record_resumes_as_before_saying_so(lars_run, tmp_path, capfd):
    model_dir = _without_config_json(lars_run, tmp_path, last_checkpoint=False)
    state_path = model_dir / "checkpoints" / "ckpt-0001.json"
    state = json.loads(state_path.read_text())
    assert state.pop("settings")["optimizer"] == "lars" and state.pop("layout")
    state_path.write_text(json.dumps(state))  # as the versions before the record wrote it
    _, summary = train_data.short_run(model_dir, **TINY)
    output = capfd.readouterr()
    (line,) = [line for line in output.err.splitlines() if line.strip()]
    assert line == (
        f"warning: {model_dir / 'checkpoints' / 'ckpt-0001'}.json holds no record of its run's "
        "settings (written by an earlier version); resuming it with the settings unchecked"
    )
    assert f"resuming {model_dir} after epoch 1" in output.out
    assert summary["steps"] == 2
