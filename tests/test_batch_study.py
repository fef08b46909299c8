"""The large-batch study (keras_lars.tools.batch_study): a tiny sweep end to end,
reuse of finished cells, cell keys, rates, aggregation and bad flags."""

import contextlib
import csv
import dataclasses
import json
import logging
import os
import shutil

import keras
import numpy as np
import pytest
from absl import flags
from PIL import Image

from keras_lars import models
from keras_lars.tools import batch_study
from keras_lars.tools import input_pipeline
from keras_lars.tools import settings
from keras_lars.tools import train
from tests import train_data

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# The studies that train check the study's bookkeeping, not a network: their
# cells name --model=alexnet_bn (a model with batch norm, for precise BN) and
# build tiny_bn_model in its place, on the first 640 digits at 8x8 (AlexNet-BN
# itself, 21.6M parameters there, took three times as long a cell, 2026-12-07).
CELL_MODEL = "--model=alexnet_bn"
EXAMPLES = 640


def tiny_bn_model(num_classes, input_shape, sync_batch_norm=False):
    """The sweeps' stand-in for AlexNet-BN: a 3x3 convolution of 8 filters
    without bias, batch norm, ReLU, global average pooling and the logits;
    with 3 channels and 10 classes 216 + 16 + 90 = 322 trainable parameters
    (16 more moving statistics)."""
    inputs = keras.Input(input_shape)
    x = keras.layers.Conv2D(8, 3, padding="same", use_bias=False)(inputs)
    x = keras.layers.BatchNormalization(momentum=0.9, epsilon=1e-5, synchronized=sync_batch_norm)(x)
    x = keras.layers.GlobalAveragePooling2D()(keras.layers.ReLU()(x))
    return keras.Model(inputs, keras.layers.Dense(num_classes)(x), name="alexnet_bn")


@contextlib.contextmanager
def tiny_cells():
    """--model=alexnet_bn builds tiny_bn_model while inside."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(models.BUILDERS, "alexnet_bn", tiny_bn_model)
        yield


# One study (the `sweep` fixture) for the tests that read it: the grid, SGD
# and LARS at 256 and at every training image, 2 epochs, and SGD's
# batch-control cells, a ramp from 256 to every image after the first epoch.
GRID = [
    CELL_MODEL,
    "--image_size=8",
    f"--train_examples={EXAMPLES}",
    "--train_epochs=2",
    "--warmup_epochs=0",
    "--batch_sizes=256,full",
    "--optimizers=sgd,lars",
    "--seeds=1",
]
SWEEP = [*GRID, f"--control_schedule=0:256,1:{EXAMPLES}", "--control_optimizers=sgd"]


def parse(*argv):
    """The Study of a command line, through absl's parser and the study's flags."""
    flag_values = flags.FlagValues()
    batch_study.define_flags(flag_values)
    flag_values(["batch_study", *argv])
    return batch_study.study_from_flags(flag_values)


def read_csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def read_json(path):
    with open(path) as f:
        return json.load(f)


def store_lines(study_dir):
    with open(os.path.join(study_dir, "cells.jsonl")) as f:
        return f.read().splitlines()


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """SWEEP run once: (its study dir, the runs it trained, as (optimizer,
    first batch, --batch_schedule, --batch_coupling), the keys run_study
    returned)."""
    study_dir = str(tmp_path_factory.mktemp("sweep") / "study")
    trainings = []
    real = train.train_and_evaluate

    def counting(config):
        trainings.append(
            (
                config.optimizer,
                config.global_batch_size,
                config.batch_schedule,
                config.batch_coupling,
            )
        )
        return real(config)

    with tiny_cells(), pytest.MonkeyPatch.context() as patch:
        patch.setattr(train, "train_and_evaluate", counting)
        _, trained = batch_study.run_study(parse(*SWEEP, f"--study_dir={study_dir}"))
    return study_dir, trainings, trained


def test_tiny_sweep_writes_tables_and_plot_and_reuses_finished_cells(sweep, tmp_path, monkeypatch):
    study_dir, trainings, trained = sweep
    num_train = input_pipeline.Digits(image_size=8, train_examples=EXAMPLES).info.num_train
    assert num_train == EXAMPLES
    batches = (256, num_train)
    base = {"sgd": 0.1, "lars": 2.5}  # the defaults, linear scaling
    ramp = f"0:256,1:{num_train}"
    # The grid's cells, then SGD's ramp and grow; its fixed cell is the grid's.
    grid = [(o, b, "", train.Config().batch_coupling) for o in base for b in batches]
    assert trainings == [*grid, ("sgd", 256, ramp, "linear"), ("sgd", 256, ramp, "grow")]
    assert len(set(trained)) == len(trained) == 6

    rows = read_csv(os.path.join(study_dir, "cells.csv"))
    assert len(rows) == 4
    assert {(r["optimizer"], int(r["batch_size"]), int(r["seed"])) for r in rows} == {
        (o, b, 0) for o in base for b in batches
    }
    for row in rows:
        batch = int(row["batch_size"])
        for metric in ("test_accuracy", "test_accuracy_precise_bn", "train_accuracy"):
            assert 0.0 <= float(row[metric]) <= 1.0, metric
        assert np.isfinite(float(row["test_loss_precise_bn"])) and float(row["wall_seconds"]) > 0
        # Two epochs: 2 floor(N / B) optimizer steps, counted by the optimizer.
        assert int(row["steps"]) == 2 * (num_train // batch)
        assert int(row["steps_per_epoch"]) == num_train // batch
        assert int(row["epochs"]) == 2 and int(row["warmup_steps"]) == 0
        assert float(row["peak_learning_rate"]) == pytest.approx(
            base[row["optimizer"]] * batch / 256
        )
        assert row["full_batch"] == str(batch == num_train)
    assert [r["key"] for r in rows] == trained[:4]
    cells = read_json(os.path.join(study_dir, "cells.json"))
    assert cells["study"]["train_examples"] == num_train
    assert cells["study"]["batch_sizes"] == list(batches)
    assert cells["study"]["model"] == "alexnet_bn"
    assert [{k: str(v) for k, v in r.items()} for r in cells["rows"]] == rows

    aggregate = read_csv(os.path.join(study_dir, "aggregate.csv"))
    assert len(aggregate) == 4
    by_cell = {(r["optimizer"], r["batch_size"]): r for r in rows}
    for row in aggregate:
        cell = by_cell[(row["optimizer"], row["batch_size"])]
        assert int(row["seeds"]) == 1
        for metric in ("test_accuracy", "test_accuracy_precise_bn"):
            assert float(row[f"{metric}_std"]) == 0.0
            assert float(row[f"{metric}_mean"]) == float(cell[metric])
    assert len(read_json(os.path.join(study_dir, "aggregate.json"))["rows"]) == 4

    png = os.path.join(study_dir, "accuracy_vs_batch.png")
    with open(png, "rb") as f:
        assert f.read(8) == PNG_SIGNATURE
    with Image.open(png) as image:
        image.verify()
    with Image.open(png) as image:
        assert image.format == "PNG" and min(image.size) > 100
    assert len(store_lines(study_dir)) == 6

    # The same command again, on a copy: nothing is trained, the tables are the same.
    again = str(tmp_path / "study")
    shutil.copytree(study_dir, again)

    def refused(config):
        raise AssertionError(f"{config.model_dir} trained again")

    monkeypatch.setattr(train, "train_and_evaluate", refused)
    assert batch_study.run_study(parse(*SWEEP, f"--study_dir={again}"))[1] == []
    assert read_csv(os.path.join(again, "cells.csv")) == rows
    assert len(store_lines(again)) == 6

    # Another SGD rate changes the SGD cells' configs: those, and only those,
    # run again (a stand-in records the cells it is asked to train).
    asked = []
    typed = {(r["optimizer"], r["batch_size"]): r for r in cells["rows"]}

    def stand_in(cell, data):
        asked.append(cell)
        row = dict(typed[(cell.optimizer, cell.batch_size)], key=cell.key)
        return {"key": cell.key, "row": row, "config": {}, "history": []}

    monkeypatch.setattr(batch_study.runner, "run_cell", stand_in)  # run_study looks it up there
    _, trained = batch_study.run_study(
        parse(*GRID, f"--study_dir={again}", "--base_learning_rates=sgd=0.2")
    )
    assert [(c.optimizer, c.batch_size) for c in asked] == [("sgd", b) for b in batches]
    assert trained == [c.key for c in asked]
    assert all(
        c.config.peak_learning_rate == pytest.approx(0.2 * c.batch_size / 256) for c in asked
    )
    assert not {c.key for c in asked} & {r["key"] for r in rows}
    assert len(store_lines(again)) == 8


def test_peak_rates_follow_each_rule():
    assert train.scaled_learning_rate(0.1, 1024, "linear") == pytest.approx(0.4)
    assert train.scaled_learning_rate(0.01, 1024, "sqrt") == pytest.approx(0.02)
    assert train.scaled_learning_rate(0.01, 64, "sqrt") == pytest.approx(0.005)
    assert train.scaled_learning_rate(3.0, 64, "none") == 3.0
    study = parse("--lr_scaling=lars=sqrt", "--base_learning_rates=lamb=0.04")
    assert study.rates == {
        "sgd": (0.1, "linear"),
        "nesterov": (0.1, "linear"),
        "lars": (2.5, "sqrt"),
        "lamb": (0.04, "sqrt"),
    }
    cells = batch_study.make_cells(study, 1024)
    assert len(cells) == 4 * 4 * 3  # optimizers x (32, 128, 512, full) x seeds
    peaks = {(c.optimizer, c.batch_size): c.config.peak_learning_rate for c in cells}
    assert peaks[("lars", 1024)] == pytest.approx(5.0)
    assert peaks[("lamb", 32)] == pytest.approx(0.04 * (32 / 256) ** 0.5)
    assert peaks[("sgd", 32)] == pytest.approx(0.1 / 8)


def test_study_defaults_and_keys_cover_the_whole_config():
    study = parse()
    cells = batch_study.make_cells(study, 1438)
    config = cells[0].config
    assert (config.image_size, config.train_epochs, config.warmup_epochs) == (16, 10, 2.0)
    assert parse("--image_size=24", "--train_epochs=4").shared.train_epochs == 4
    assert len({c.key for c in cells}) == len(cells)
    assert [c.batch_size for c in cells[:4]] == [32, 128, 512, 1438]
    assert all(c.config.model_dir.startswith(os.path.join(study.study_dir, "cells")) for c in cells)
    key = cells[0].key
    for field, value in (
        ("model_dir", "elsewhere"),
        ("log_every_seconds", 5.0),
        ("checkpoint_every_steps", 7),
        ("steps_per_execution", 2),
    ):  # where and how it runs: not what it computes
        assert batch_study.cell_key(dataclasses.replace(config, **{field: value})) == key, field
    for field, value in (
        ("weight_decay", 0.0),
        ("momentum", 0.8),
        ("train_epochs", 11),
        ("model", "resnet34"),
        ("image_size", 8),
        ("label_smoothing", 0.1),
        ("backend", "jax"),
    ):
        assert batch_study.cell_key(dataclasses.replace(config, **{field: value})) != key, field


def test_aggregate_is_mean_and_sample_std_over_seeds():
    accuracies = {
        ("lars", 32): [0.9, 0.8, 0.95],
        ("sgd", 32): [0.5, 0.7, 0.6],
        ("lars", 64): [0.25],
    }
    rows = [
        {
            "optimizer": o,
            "batch_size": b,
            "seed": s,
            "test_accuracy": a,
            "test_accuracy_precise_bn": 1.0 - a / 2,
            "train_accuracy": a / 4,
            "test_loss": 1.0 + s,
            "test_loss_precise_bn": 2.0 * s,
            "steps": 10,
            "peak_learning_rate": 0.1,
            "full_batch": False,
            "wall_seconds": 2.0 + s,
        }
        for (o, b), values in accuracies.items()
        for s, a in enumerate(values)
    ]
    found = {(r["optimizer"], r["batch_size"]): r for r in batch_study.aggregate(rows)}
    assert found.keys() == accuracies.keys()

    def mean_std(values):
        mean = sum(values) / len(values)
        if len(values) == 1:
            return mean, 0.0
        return mean, (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5

    for cell, values in accuracies.items():
        for metric, seen in (
            ("test_accuracy", values),
            ("test_accuracy_precise_bn", [1.0 - v / 2 for v in values]),
        ):
            mean, std = mean_std(seen)
            assert found[cell][f"{metric}_mean"] == pytest.approx(mean)
            assert found[cell][f"{metric}_std"] == pytest.approx(std)
            assert found[cell][f"{metric}_min"] == pytest.approx(min(seen))
            assert found[cell][f"{metric}_max"] == pytest.approx(max(seen))
        assert found[cell]["train_accuracy_mean"] == pytest.approx(mean_std(values)[0] / 4)
        assert found[cell]["seeds"] == len(values)
    assert found[("lars", 32)]["test_loss_mean"] == pytest.approx(2.0)
    assert found[("lars", 32)]["test_loss_precise_bn_mean"] == pytest.approx(2.0)
    assert found[("lars", 32)]["wall_seconds_mean"] == pytest.approx(3.0)


def test_store_ignores_a_torn_last_line(tmp_path):
    path = str(tmp_path / "cells.jsonl")
    batch_study.append_record(path, {"key": "a", "row": {"x": 1}})
    batch_study.append_record(path, {"key": "b", "row": {"x": 2}})
    with open(path, "a") as f:
        f.write('{"key": "c", "row": {"x"')  # killed while appending
    assert {k: r["row"]["x"] for k, r in batch_study.load_store(path).items()} == {"a": 1, "b": 2}
    assert batch_study.load_store(str(tmp_path / "missing.jsonl")) == {}


@pytest.mark.parametrize(
    "argv, culprit",
    [
        (["--batch_sizes=32,0"], "--batch_sizes"),
        (["--batch_sizes=32,big"], "--batch_sizes"),
        (["--batch_sizes="], "--batch_sizes"),
        (["--optimizers=sgd,adagrad"], "--optimizers"),
        (["--optimizers=sgd,sgd"], "--optimizers"),
        (["--seeds=0"], "--seeds=0"),
        (["--base_learning_rates=sgd=-1"], "--base_learning_rates"),
        (["--base_learning_rates=sgd=fast"], "--base_learning_rates"),
        (["--base_learning_rates=adagrad=0.1"], "--base_learning_rates"),
        (["--lr_scaling=lars=cubic"], "--lr_scaling"),
        (["--lr_scaling=lars"], "--lr_scaling"),
        (["--study_dir="], "--study_dir"),
        (["--momentum=1.5"], "--momentum=1.5"),
        (["--dataset=imagenet"], "--data_dir"),
        (["--strategy=multi_worker"], "--strategy=multi_worker: the study trains"),
        (
            ["--backend=jax", "--num_processes=2", "--coordinator_address=h:1"],
            "--num_processes=2: the study trains",
        ),
        (["--backend=jax", "--num_processes=0"], "--num_processes=0: the study trains"),
    ],
)
def test_bad_flags_name_the_flag(argv, culprit):
    with pytest.raises(train.ConfigError, match=culprit):
        parse(*argv)


@pytest.mark.parametrize("flag", batch_study.PER_CELL)
def test_the_settings_set_per_cell_are_not_flags(flag):
    own = {field.name for field in dataclasses.fields(batch_study.StudySettings)}
    if flag not in own:  # --lr_scaling is the study's own (optimizer=rule pairs)
        with pytest.raises(flags.UnrecognizedFlagError, match=flag):
            parse(f"--{flag}=1")
    with pytest.raises(train.ConfigError, match=f"--{flag} is set per cell"):
        batch_study.make_study(batch_study.StudySettings(), {flag: 1})


@pytest.mark.parametrize("flag", batch_study.study.ADAPTIVE)
def test_the_tools_adaptive_batch_settings_are_flags_of_the_adaptive_arm_only(flag):
    # Study-wide flags (the tool's declarations), refused outside the arm
    # (--mode=steps_to_target --search=quasi_random --adaptive_batch=RULE).
    value = "adascale" if flag == "adaptive_batch" else "2"
    culprit = "the adaptive arm runs in" if flag == "adaptive_batch" else "belongs to the adaptive"
    with pytest.raises(train.ConfigError, match=f"^--{flag}(={value})?: {culprit}"):
        parse(f"--{flag}={value}")


def test_bad_batch_plans_are_refused_before_training():
    for argv, culprit in (
        (["--batch_sizes=32,2048"], "--batch_sizes=32,2048: 2048 exceeds"),
        (["--batch_sizes=1438,full"], "--batch_sizes=1438,full"),
        (["--warmup_epochs=20", "--train_epochs=3"], "--warmup_epochs=20"),
    ):
        with pytest.raises(train.ConfigError, match=culprit):
            batch_study.make_cells(parse(*argv), 1438)


def run_main(*argv):
    """keras-lars-study `argv` in this process, without its ~6 s start: absl
    parses `argv` with the study's flags and cli.main runs. Returns the
    SystemExit main ended with (None if it returned). TensorFlow's logger
    level, which main sets, is put back."""
    flag_values = flags.FlagValues()
    batch_study.define_flags(flag_values)
    logger = logging.getLogger("tensorflow")
    level = logger.level
    try:
        settings.parse_flags(["batch_study", *argv], flag_values)
        batch_study.cli.main(["batch_study"], flag_values)
    except SystemExit as stopped:
        return stopped
    finally:
        logger.setLevel(level)
    return None


def test_command_line_error_is_one_line(tmp_path):
    # A batch found too large once the data are loaded (after Keras): main
    # ends in sys.exit("error: ..."), which the interpreter prints alone, as
    # its one line on stderr, with exit status 1 (test_flags_first starts
    # keras-lars-study for an error found before Keras loads).
    study_dir = tmp_path / "study"
    stopped = run_main("--batch_sizes=64,4096", f"--study_dir={study_dir}")
    assert isinstance(stopped, SystemExit) and stopped.code == (
        "error: --batch_sizes=64,4096: 4096 exceeds the 1438 training "
        "examples (an epoch would have no step)."
    )
    assert not study_dir.exists()


def test_a_tfrecord_dataset_sweeps_up_to_its_whole_training_set(tmp_path):
    records = train_data.imagenet_records(str(tmp_path), train_per_class=8, eval_per_class=2)
    study_dir = str(tmp_path / "study")
    with tiny_cells():
        rows, trained = batch_study.run_study(
            parse(
                CELL_MODEL,
                "--dataset=imagenet",
                f"--data_dir={records}",
                "--image_size=8",
                "--train_epochs=1",
                "--warmup_epochs=0",
                "--optimizers=lamb",
                "--batch_sizes=full",
                "--seeds=1",
                f"--study_dir={study_dir}",
            )
        )
    # 4 classes x 8 training images (dataset.json): one step of 32 per epoch.
    assert len(trained) == 1 and len(rows) == 1
    assert (rows[0]["batch_size"], rows[0]["steps"], rows[0]["full_batch"]) == (32, 1, True)
    assert rows[0]["peak_learning_rate"] == pytest.approx(0.01 * (32 / 256) ** 0.5)
    for metric in ("test_accuracy", "test_accuracy_precise_bn"):
        assert 0.0 <= rows[0][metric] <= 1.0
    assert read_json(os.path.join(study_dir, "cells.json"))["study"]["dataset"] == "imagenet"


def test_precise_bn_sets_moving_statistics_to_the_average_of_batch_statistics():
    rng = np.random.default_rng(0)
    inputs = keras.Input((3,))
    normalized = keras.layers.BatchNormalization(momentum=0.9, epsilon=1e-5)(inputs)
    outputs = keras.layers.BatchNormalization(momentum=0.9)(keras.layers.Dense(2)(normalized))
    model = keras.Model(inputs, outputs)
    batches = [rng.normal(k, 1 + k, size=(8, 3)).astype("float32") for k in range(3)]
    assert batch_study.recalibrate_batch_norm(model, iter(batches)) == 2
    first, second = [
        layer for layer in model.layers if isinstance(layer, keras.layers.BatchNormalization)
    ]
    np.testing.assert_allclose(
        first.moving_mean.numpy(), np.mean([b.mean(0) for b in batches], 0), rtol=1e-5
    )
    np.testing.assert_allclose(
        first.moving_variance.numpy(), np.mean([b.var(0) for b in batches], 0), rtol=1e-5
    )
    # The second layer sees the first one's training-mode output, through Dense.
    kernel, bias = (v.numpy() for v in model.layers[2].weights)
    dense = [((b - b.mean(0)) / np.sqrt(b.var(0) + 1e-5)) @ kernel + bias for b in batches]
    np.testing.assert_allclose(
        second.moving_mean.numpy(), np.mean([d.mean(0) for d in dense], 0), rtol=1e-4, atol=1e-6
    )
    np.testing.assert_allclose(
        second.moving_variance.numpy(), np.mean([d.var(0) for d in dense], 0), rtol=1e-4
    )
    assert first.momentum == second.momentum == 0.9


CONTROL = ["--optimizers=sgd,lars,lamb", "--batch_sizes=256,1024", "--seeds=1"]


def test_batch_control_cells_follow_their_rules():
    # N = 4096, --train_epochs=10, phases (0, 256), (3, 512), (6, 1024).
    study = parse(*CONTROL, "--control_schedule=0:256,3:512,6:1024", "--lr_scaling=lars=sqrt")
    cells = batch_study.make_cells(study, 4096)
    control = [c for c in cells if c.kind != "grid"]
    assert [(c.optimizer, c.kind) for c in control] == [
        (o, k) for o in ("sgd", "lars", "lamb") for k in ("fixed", "ramp", "grow")
    ]
    grid = {(c.optimizer, c.batch_size): c for c in cells if c.kind == "grid"}
    ramp_steps = 3 * (4096 // 256) + 3 * (4096 // 512) + 4 * (4096 // 1024)  # 88
    base = {"sgd": 0.1, "lars": 2.5, "lamb": 0.01}
    for cell in control:
        config, o = cell.config, cell.optimizer
        assert cell.batch_size == 1024
        if cell.kind == "fixed":  # the grid's batch-1024 cell, trained once
            assert cell.key == grid[(o, 1024)].key and config.batch_schedule == ""
            assert cell.length.total_steps == 10 * 4
            continue
        assert config.batch_schedule == "0:256,3:512,6:1024"
        assert config.global_batch_size == 256 and cell.length.total_steps == ramp_steps
        scale = (256 / 256) ** (0.5 if o in ("lars", "lamb") else 1.0)
        assert config.peak_learning_rate == pytest.approx(base[o] * scale)
        if cell.kind == "ramp":
            assert config.batch_coupling == ("sqrt" if o in ("lars", "lamb") else "linear")
            assert config.end_learning_rate == study.shared.end_learning_rate
        else:  # grow: the first batch's rate, held after warmup
            assert config.batch_coupling == "grow"
            assert config.end_learning_rate == config.peak_learning_rate
    assert len({c.key for c in cells}) == len(cells) - 3  # the fixed cells are grid cells
    assert (
        "ramp" in control[1].name and control[1].label == "sgd ramp batch=0:256,3:512,6:1024 seed=0"
    )
    only = parse(*CONTROL, "--control_schedule=0:256,3:512", "--control_optimizers=lars")
    kinds = [(c.optimizer, c.kind) for c in batch_study.make_cells(only, 4096)]
    assert kinds[-3:] == [("lars", "fixed"), ("lars", "ramp"), ("lars", "grow")]
    assert len(kinds) == 6 + 3
    none = parse(*CONTROL, "--control_optimizers=lars")  # no schedule: no control cells
    assert all(c.kind == "grid" for c in batch_study.make_cells(none, 4096))


def test_keys_leave_out_settings_at_their_defaults():
    config = batch_study.make_cells(parse(), 1438)[0].config
    key = batch_study.cell_key(config)
    # Spelling out a default changes nothing; moving off it does.
    assert batch_study.cell_key(dataclasses.replace(config, batch_coupling="grow")) == key
    assert batch_study.cell_key(dataclasses.replace(config, batch_coupling="sqrt")) != key
    assert batch_study.cell_key(dataclasses.replace(config, batch_schedule="0:32,2:64")) != key


@pytest.mark.parametrize(
    "argv, culprit",
    [
        (["--control_schedule=0:1024"], "--control_schedule=0:1024: a ramp needs two phases"),
        (["--control_schedule=0:512,3:256"], "--control_schedule=0:512,3:256: each phase's"),
        (["--control_schedule=1:256,3:512"], "--control_schedule=1:256,3:512: .*epoch 0"),
        (["--control_schedule=0:256,x"], "--control_schedule=0:256,x: .*phase 2"),
        (
            ["--optimizers=sgd,lars", "--control_schedule=0:64,2:128", "--control_optimizers=lamb"],
            "--control_optimizers=lamb: lamb is not one of --optimizers=sgd,lars",
        ),
    ],
)
def test_bad_control_flags_name_the_flag(argv, culprit):
    with pytest.raises(train.ConfigError, match=culprit):
        parse(*argv)


def test_control_schedules_that_do_not_fit_are_refused_before_training():
    for argv, culprit in (
        (["--control_schedule=0:256,2:2048"], "--control_schedule=0:256,2:2048: 2048 exceeds"),
        (
            ["--control_schedule=0:32,12:64"],
            "--control_schedule=0:32,12:64: phase 2 starts at epoch 12",
        ),
    ):
        with pytest.raises(train.ConfigError, match=culprit):
            batch_study.make_cells(parse(*argv), 1438)


def test_batch_control_cells_train_and_are_tabled(sweep):
    study_dir, _, trained = sweep
    assert len(trained) == 6  # the grid's 4 (SGD's at 640 = its fixed cell), ramp, grow
    rows = read_csv(os.path.join(study_dir, "batch_control.csv"))
    n = EXAMPLES
    assert [(r["optimizer"], r["kind"], r["batch_schedule"]) for r in rows] == [
        ("sgd", "fixed", f"0:{n}"),
        ("sgd", "ramp", f"0:256,1:{n}"),
        ("sgd", "grow", f"0:256,1:{n}"),
    ]
    # fixed: 1 step an epoch; ramp and grow: 2, then 1
    assert [int(r["steps"]) for r in rows] == [2 * (n // n)] + [n // 256 + n // n] * 2
    grid = {
        (r["optimizer"], int(r["batch_size"])): r
        for r in read_csv(os.path.join(study_dir, "cells.csv"))
    }
    assert grid[("sgd", n)]["key"] == rows[0]["key"]
    assert [r["key"] for r in rows[1:]] == trained[4:]
    # The rate after each epoch (at e = 1, 2 epochs done), closed form: f(e) =
    # end + (peak - end) * (1 - e / 2)^2. fixed: peak 0.25 (0.1 * 640 / 256);
    # ramp: peak 0.1 at batch 256, times 640 / 256 from e = 1 (phase 2); grow
    # holds 0.1.
    rates = {}
    for row in rows:
        stored = (json.loads(line) for line in store_lines(study_dir))
        record = next(r for r in stored if r["key"] == row["key"])
        rates[row["kind"]] = [epoch["learning_rate"] for epoch in record["history"]]
    end = 1e-4

    def f(peak, e):
        return end + (peak - end) * (1 - e / 2) ** 2

    assert rates["fixed"] == pytest.approx([f(0.25, 1), f(0.25, 2)], rel=1e-6)
    assert rates["ramp"] == pytest.approx([2.5 * f(0.1, 1), 2.5 * f(0.1, 2)], rel=1e-6)
    assert rates["grow"] == pytest.approx([0.1, 0.1], rel=1e-6)
    with Image.open(os.path.join(study_dir, "batch_control.png")) as image:
        assert image.format == "PNG" and min(image.size) > 100
