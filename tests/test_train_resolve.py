"""From flag values to a Config (keras_lars.tools.train.resolve): --recipe's one
line, the flags given winning over the recipe, and the JAX environment."""

import pytest

from keras_lars.tools import train


def _resolve(values, given=()):
    lines = []
    config = train.config_from_flags(values, given, log=lines.append)
    return config, lines


def test_the_recipe_says_in_one_line_what_it_set():
    # MLPerf v0.7 ResNet-50 LARS at batch 32768: peak 29, 18 of 64 epochs warmup,
    # momentum 0.929, end rate 1e-4, label smoothing 0.1.
    values = {"recipe": "mlperf", "global_batch_size": 32768, "dataset": "synthetic"}
    config, lines = _resolve(values, given=set(values))
    assert lines == [
        "--recipe=mlperf set --base_learning_rate=29 --lr_scaling=none --warmup_epochs=18 "
        "--train_epochs=64 --momentum=0.929 --weight_decay=0.0001 --label_smoothing=0.1 "
        "--end_learning_rate=0.0001"
    ]
    assert (config.peak_learning_rate, config.warmup_epochs, config.train_epochs) == (29.0, 18, 64)


def test_flags_given_win_over_the_recipe_and_the_line_says_so():
    values = {
        "recipe": "mlperf",
        "global_batch_size": 4096,
        "dataset": "synthetic",
        "train_epochs": 3,
        "warmup_epochs": 1.0,
        "base_learning_rate": 1.0,
    }
    config, (line,) = _resolve(values, given=set(values))
    assert line.endswith(
        "; given explicitly, kept: --base_learning_rate --warmup_epochs --train_epochs"
    )
    assert "--lr_scaling" not in line  # the rate given is per 256 images: linear scaling stays
    assert (config.train_epochs, config.warmup_epochs) == (3, 1.0)
    assert config.peak_learning_rate == pytest.approx(16.0)  # 1 * 4096 / 256


def test_no_recipe_no_line():
    config, lines = _resolve({"global_batch_size": 64}, given={"global_batch_size"})
    assert lines == [] and config.global_batch_size == 64
    assert train.recipe_settings("none", "lars", 64) == {}
    assert train.recipe_settings("mlperf", "lamb", 64) == {}


def test_jax_processes_come_from_the_environment_unless_given(monkeypatch):
    monkeypatch.setenv("JAX_NUM_PROCESSES", "two")
    with pytest.raises(
        train.ConfigError, match="JAX_NUM_PROCESSES='two' \\(for --num_processes\\)"
    ):
        _resolve({"backend": "jax"})
    config, _ = _resolve({"backend": "jax", "num_processes": 1}, given={"num_processes"})
    assert config.num_processes == 1


def test_under_a_batch_schedule_the_recipe_is_the_first_phases():
    # MLPerf v0.7 at 32768 (peak 29, 18 of 64 epochs warmup), not the recipe of
    # the --global_batch_size default (128).
    values = {"recipe": "mlperf", "batch_schedule": "0:32768,40:65536", "dataset": "synthetic"}
    config, (line,) = _resolve(values, given=set(values))
    assert line.startswith("--recipe=mlperf set --base_learning_rate=29 ")
    assert config.global_batch_size == 32768
    assert (config.peak_learning_rate, config.warmup_epochs, config.train_epochs) == (29.0, 18, 64)
    plain, _ = _resolve({"recipe": "mlperf", "global_batch_size": 32768, "dataset": "synthetic"})
    assert config.batch_phases.phases[0].global_batch_size == plain.global_batch_size
