"""A checkpoint whose weights file is not its own: another
run's ckpt-0002.weights.h5 copied beside this run's ckpt-0002.json. Keras
only warns ("Skipping variable loading for optimizer ...") and leaves the
optimizer's state fresh; the resume must fall back to the checkpoint before
or stop with one line, never train on."""

import json
import shutil

import h5py
import keras
import numpy as np
import pytest

import keras_lars
from keras_lars.tools import checkpoints


def _model(optimizer):
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="dense")], name="net")
    model.compile(optimizer=optimizer, loss="mse")
    model.optimizer.build(model.trainable_variables)
    return model


def _lars():
    return _model(keras_lars.LARS(0.1, momentum=0.9))


def _lamb():
    return _model(keras_lars.LAMB(0.1))


def _saved(directory, model, epochs):
    for epoch in epochs:
        for variable in model.variables + model.optimizer.variables[2:]:
            variable.assign(np.full(variable.shape, epoch, variable.dtype))
        model.optimizer.iterations.assign(epoch)
        checkpoints.save(model, str(directory), epoch, {"epochs_done": epoch, "history": []})


def _swap_in_lambs_weights(tmp_path):
    """A LARS run's checkpoints 1 and 2, ckpt-0002.weights.h5 replaced by a
    LAMB run's; (lars directory, the replaced file)."""
    lars, lamb = tmp_path / "lars", tmp_path / "lamb"
    _saved(lars, _lars(), (1, 2))
    _saved(lamb, _lamb(), (2,))
    weights = lars / "ckpt-0002.weights.h5"
    shutil.copyfile(lamb / "ckpt-0002.weights.h5", weights)
    return lars, weights


def test_another_runs_weights_file_falls_back_to_the_checkpoint_before(tmp_path, capfd):
    lars, weights = _swap_in_lambs_weights(tmp_path)
    model = _lars()
    assert checkpoints.restore(model, str(lars))["epochs_done"] == 1
    assert capfd.readouterr().err == (
        f"warning: checkpoint {lars}/ckpt-0002 is unusable ({weights} is not the file its "
        "state records: it holds optimizer 'LAMB' with 6 variables, 8 in all, the state "
        "records optimizer 'lars' with 4 variables, 6 in all); trying the one before\n"
    )
    # Epoch 1's weights and momentum, not fresh state.
    for variable in model.variables + model.optimizer.variables[2:]:
        np.testing.assert_array_equal(variable.numpy(), np.ones(variable.shape), variable.path)
    assert int(model.optimizer.iterations.numpy()) == 1


def test_another_runs_weights_file_of_the_only_checkpoint_stops_in_one_line(tmp_path):
    lars, weights = _swap_in_lambs_weights(tmp_path)
    for path in lars.glob("ckpt-0001.*"):
        path.unlink()
    with pytest.raises(checkpoints.CheckpointError) as raised:
        checkpoints.restore(_lars(), str(lars))
    assert str(raised.value) == (
        f"no usable checkpoint in {lars} ({weights} is not the file its state records: it "
        "holds optimizer 'LAMB' with 6 variables, 8 in all, the state records optimizer "
        "'lars' with 4 variables, 6 in all); move the directory aside to start the run over"
    )
    assert sorted(p.name for p in lars.iterdir()) == ["ckpt-0002.json", "ckpt-0002.weights.h5"]


ANOTHER_SAVE = (
    "is not the file its state records: it was written by another save (another run's "
    "file, or another checkpoint's), of the same model and optimizer"
)


@pytest.mark.parametrize("source", ["other/ckpt-0002", "run/ckpt-0001"])
def test_a_weights_file_of_the_same_model_and_optimizer_but_another_save_falls_back(
    tmp_path, capfd, source
):
    # Optimizer, counts and shapes all match: only the save's id tells.
    run, other = tmp_path / "run", tmp_path / "other"
    _saved(run, _lars(), (1, 2))
    _saved(other, _lars(), (2,))
    weights = run / "ckpt-0002.weights.h5"
    shutil.copyfile(tmp_path / f"{source}.weights.h5", weights)
    model = _lars()
    assert checkpoints.restore(model, str(run))["epochs_done"] == 1
    assert capfd.readouterr().err == (
        f"warning: checkpoint {run}/ckpt-0002 is unusable ({weights} {ANOTHER_SAVE}); "
        "trying the one before\n"
    )
    assert int(model.optimizer.iterations.numpy()) == 1
    for path in run.glob("ckpt-0001.*"):
        path.unlink()
    with pytest.raises(checkpoints.CheckpointError) as raised:
        checkpoints.restore(_lars(), str(run))
    assert str(raised.value) == (
        f"no usable checkpoint in {run} ({weights} {ANOTHER_SAVE}); move the directory aside "
        "to start the run over"
    )
    assert sorted(p.name for p in run.iterdir()) == ["ckpt-0002.json", "ckpt-0002.weights.h5"]


def test_a_state_of_an_earlier_version_without_the_save_id_still_resumes(tmp_path):
    _saved(tmp_path, _lars(), (1, 2))
    state_path = tmp_path / "ckpt-0002.json"
    state = json.loads(state_path.read_text())
    del state[checkpoints.RECORD]["save"]
    state_path.write_text(json.dumps(state))
    with h5py.File(tmp_path / "ckpt-0002.weights.h5", "r+") as weights:
        del weights.attrs[checkpoints.SAVE_ID]
    model = _lars()
    assert checkpoints.restore(model, str(tmp_path))["epochs_done"] == 2
    assert int(model.optimizer.iterations.numpy()) == 2


def test_a_state_without_its_record_stops_on_a_weights_file_that_does_not_fit(tmp_path):
    # A checkpoint written before the state recorded its weights file.
    lars, weights = _swap_in_lambs_weights(tmp_path)
    state_path = lars / "ckpt-0002.json"
    state = json.loads(state_path.read_text())
    del state[checkpoints.RECORD]
    state_path.write_text(json.dumps(state))
    with pytest.raises(checkpoints.CheckpointError) as raised:
        checkpoints.restore(_lars(), str(lars))
    assert str(raised.value) == (
        f"{weights} does not fit this model (it holds optimizer 'LAMB' with 6 variables, this "
        "run's 'lars' has 4): was the run started with other data or settings?"
    )


def test_optimizer_variables_of_other_shapes_stop_in_one_line(tmp_path):
    # The same optimizer and count, another model's shapes: Dense(2) on 4 inputs.
    keras.utils.set_random_seed(1)
    other = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, name="dense")], name="net")
    other.compile(optimizer=keras_lars.LARS(0.1, momentum=0.9), loss="mse")
    other.optimizer.build(other.trainable_variables)
    checkpoints.save(other, str(tmp_path), 1, {"epochs_done": 1, "history": []})
    with pytest.raises(checkpoints.CheckpointError) as raised:
        checkpoints.restore(_lars(), str(tmp_path))
    assert str(raised.value) == (
        f"{tmp_path}/ckpt-0001.weights.h5 does not fit this model (its optimizer variable 2 "
        "(lars/net_dense_kernel_momentum) is (4, 2), this run's is (3, 2)): was the "
        "run started with other data or settings?"
    )


def test_the_state_records_its_weights_file(tmp_path):
    _saved(tmp_path, _lars(), (1,))
    record = json.loads((tmp_path / "ckpt-0001.json").read_text())[checkpoints.RECORD]
    assert {k: v for k, v in record.items() if k not in ("shapes", "save")} == {
        "optimizer": "lars",
        "variables": 6,
        "optimizer_variables": 4,
    }
    with h5py.File(tmp_path / "ckpt-0001.weights.h5", "r") as weights:
        assert weights.attrs[checkpoints.SAVE_ID] == record["save"]
    assert len(record["save"]) == 32
    assert checkpoints.problem(str(tmp_path), 1) is None
    state_path = tmp_path / "ckpt-0001.json"
    state = json.loads(state_path.read_text())
    state[checkpoints.RECORD]["shapes"] = "0" * 16
    state_path.write_text(json.dumps(state))
    assert checkpoints.problem(str(tmp_path), 1) == (
        f"{tmp_path}/ckpt-0001.weights.h5 is not the file its state records: the shapes of "
        "its variables are not those the state records"
    )


def test_the_training_tool_resumes_from_the_checkpoint_before_another_runs_weights(tmp_path, capfd):
    # Another run of the same model and optimizer (another seed): its
    # ckpt-0002.weights.h5 beside this run's ckpt-0002.json used to resume
    # "after epoch 2" on the other run's weights. (Another optimizer's file:
    # the tests above.) The simple CNN: any model's checkpoints.
    from tests import train_data

    run, other = tmp_path / "run", tmp_path / "other"
    tiny = dict(optimizer="lars", model="simple_cnn")
    train_data.short_run(run, **tiny)
    train_data.short_run(other, seed=2, **tiny)
    weights = run / "checkpoints" / "ckpt-0002.weights.h5"
    shutil.copyfile(other / "checkpoints" / "ckpt-0002.weights.h5", weights)
    capfd.readouterr()
    _, summary = train_data.short_run(run, **tiny)
    out, err = capfd.readouterr()
    assert f"resuming {run} after epoch 1" in out
    warnings = [line for line in err.splitlines() if line.startswith("warning: checkpoint")]
    assert warnings == [
        f"warning: checkpoint {run}/checkpoints/ckpt-0002 is unusable ({weights} "
        f"{ANOTHER_SAVE}); trying the one before"
    ]
    assert [record["epoch"] for record in summary["history"]] == [1, 2]


def test_a_fifo_in_place_of_a_state_file_falls_back_without_blocking(tmp_path, capfd):
    import os

    _saved(tmp_path, _lars(), (1, 2))
    state = tmp_path / "ckpt-0002.json"
    state.unlink()
    os.mkfifo(state)
    assert checkpoints.latest_state(str(tmp_path))[1]["epochs_done"] == 1
    assert checkpoints.restore(_lars(), str(tmp_path))["epochs_done"] == 1
    assert capfd.readouterr().err == (
        f"warning: checkpoint {tmp_path}/ckpt-0002 is unusable ({state} is a FIFO (named "
        "pipe), not a file); trying the one before\n"
    )
