"""The training tool's checkpoints and model dir, over one short run in this
process (train_data.short_run): bad and unfinished checkpoints, full disks,
the run's lock, leftovers and other settings.
"""

import collections
import dataclasses
import json
import os
import socket

import h5py
import numpy as np
import pytest

import keras_lars
from keras_lars.tools import checkpoints
from keras_lars.tools import input_pipeline
from keras_lars.tools import storage
from keras_lars.tools import train
from keras_lars.tools.train import model_dir as train_model_dir
from tests import train_data
from tests.train_tool import h5_arrays


@pytest.fixture(scope="module")
def short_run(tmp_path_factory):
    """train_data.short_run (2 steps, 2 epochs) in this process: (model_dir, config)."""
    model_dir = tmp_path_factory.mktemp("short") / "run"
    config, summary = train_data.short_run(model_dir)
    assert summary["steps"] == 2, summary
    return model_dir, config


# --- a run in this process ----------------------------------------------------------
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


# --- bad checkpoints, disks, locks --------------------------------------------------
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
