"""The training tool's flags and config (its command line through absl, the run's
length, the optimizers) and what it builds from them: replicas and their batches.
"""

import os

import keras
import numpy as np
import pytest

import keras_lars
from keras_lars.tools import input_pipeline
from keras_lars.tools import train
from keras_lars.tools.train import build as train_build
from keras_lars.tools.train import runtime as train_runtime
from tests import train_data
from tests.train_tool import parse


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    """240 training and 60 validation colour images, 4 classes, labels 1..4."""
    return train_data.imagenet_records(str(tmp_path_factory.mktemp("colours")))


# --- flags and config ---------------------------------------------------------------
def test_the_default_command_line_is_the_digits_run():
    config = parse()
    assert (config.model, config.optimizer, config.dataset) == ("resnet20", "lars", "digits")
    assert config.image_size == 8 and config.model_dir == os.path.join("runs", "digits")
    assert config.global_batch_size == 128
    assert config.peak_learning_rate == pytest.approx(10.0 * 128 / 256)  # linear scaling
    assert config.strategy == "default" and config.precision == "float32"
    plan = train.run_length(config, 1438)
    assert plan.steps_per_epoch == 1438 // 128 and plan.epochs == config.train_epochs
    assert plan.warmup_steps == round(config.warmup_epochs * (1438 // 128))
    assert parse("--dataset=imagenet", "--data_dir=/d").image_size == 224


def test_the_first_line_names_model_data_batch_steps_model_dir_and_backend():
    from keras_lars.tools.train.loop import start_line

    def line(*argv):
        config = parse(*argv)
        return start_line(config, train.run_length(config, 1438))

    where = f"model_dir {os.path.join('runs', 'digits')}, backend tensorflow"
    assert line() == (
        f"training resnet20 with lars on digits (8 px), batch 128, 165 steps (15 epochs x 11), "
        f"{where}"
    )
    assert line("--train_steps=30", "--optimizer=lamb") == (
        "training resnet20 with lamb on digits (8 px), batch 128, 30 steps (3 epochs of 11 "
        f"steps), {where}"
    )
    assert line("--batch_schedule=0:64,1:128", "--train_epochs=2", "--warmup_epochs=1") == (
        f"training resnet20 with lars on digits (8 px), batch 64/128, 33 steps (2 epochs), {where}"
    )


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


def test_adam_is_lambs_update_without_its_trust_ratio():
    # One step from w with gradient g: m_hat = g, v_hat = g^2, so
    # w' = w - lr * (g / (|g| + eps) + wd * w), AdamW's decoupled decay, whatever
    # w's norm (LAMB would scale the update by |w| / |update|).
    config = train.Config(optimizer="adam", weight_decay=0.1, momentum=0.8)
    optimizer = train.create_optimizer(config, 0.5)
    assert (optimizer.name, optimizer.beta_1) == ("adam", 0.8)
    w = keras.Variable(np.array([[3.0, 4.0]], np.float32))
    g = np.array([[1.0, -2.0]], np.float32)
    optimizer.apply([g], [w])
    update = g / (np.abs(g) + optimizer.epsilon) + 0.1 * np.array([[3.0, 4.0]])
    np.testing.assert_allclose(w.numpy(), [[3.0, 4.0]] - 0.5 * update, rtol=1e-6)


def test_global_batch_must_divide_between_replicas(monkeypatch, tmp_path):
    monkeypatch.setattr(
        train_runtime,
        "strategy_of_flags",
        lambda config: keras_lars.make_strategy("mirrored", devices=["/cpu:0", "/cpu:1"]),
    )
    before = os.listdir(tmp_path)
    with pytest.raises(train.ConfigError, match="--global_batch_size=7.*2 replicas"):
        train_data.short_run(tmp_path / "r", global_batch_size=7)  # refused before a step
    assert os.listdir(tmp_path) == before


# --- the build: two replicas --------------------------------------------------------
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
        "strategy_of_flags",
        lambda config: keras_lars.make_strategy("mirrored", devices=["/cpu:0", "/cpu:1"]),
    )
    metrics = train.metrics
    monkeypatch.setattr(train_build, "metrics", lambda n: metrics(n) + [WeightSum()])
    config = train.Config(
        model="alexnet_bn",
        dataset="imagenet",
        data_dir=records,
        image_size=16,
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
    data = input_pipeline.ImageNetRecords(records, image_size=16)
    images, labels = [], []
    for x, y in data.eval(16).map(lambda x, y, w: (x, y)).unbatch().take(60):
        images.append(x.numpy())
        labels.append(int(y))
    predicted = model.predict(np.stack(images), verbose=0).argmax(-1)
    assert summary["final"]["val_accuracy"] == pytest.approx(np.mean(predicted == labels))
