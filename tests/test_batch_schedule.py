"""BatchSchedule and EpochWarmupPolyDecay: the step arithmetic, the rate at every
step against a numpy closed form, the compiled train step, saving, bad input."""

import json
import math
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_lars import BatchSchedule
from keras_lars import EpochWarmupPolyDecay
from keras_lars import Phase
from keras_lars import WarmupPolyDecay

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# 64 examples: 8 steps an epoch at batch 8 (epochs 0-1), 4 at 16 (2-4), 2 at 32 (5-).
N = 64
PHASES = ((0, 8), (2, 16), (5, 32))
STARTS = (0, 16, 28)  # 2 * 8, then + 3 * 4
# Warmup over 3 epochs crosses the boundary at epoch 2; decay ends at epoch 7 (step 32).
CURVE = dict(
    peak_learning_rate=2.0,
    warmup_epochs=3,
    total_epochs=7,
    power=2.0,
    end_learning_rate=1e-3,
    start_learning_rate=0.1,
)
RULES = [
    dict(coupling="grow"),
    dict(coupling="scale", scaling_rule="linear"),
    dict(coupling="scale", scaling_rule="sqrt"),
    dict(coupling="scale", scaling_rule="linear", reference_batch_size=32),
]


def reference_rates(steps, phases, num_examples, curve, coupling="grow", **scaling):
    """The rate of each step from the equations, every operation in float32."""
    f32 = np.float32
    per_epoch = [num_examples // batch for _, batch in phases]  # floor: remainder dropped
    starts = [0]
    for k in range(1, len(phases)):
        starts.append(starts[-1] + (phases[k][0] - phases[k - 1][0]) * per_epoch[k - 1])

    def phase_of(step):
        return max(k for k in range(len(phases)) if starts[k] <= step)

    def epochs_done(step):
        k = phase_of(step)
        return f32(phases[k][0]) + (f32(step) - f32(starts[k])) / f32(per_epoch[k])

    end, start = (f32(curve[k]) for k in ("end_learning_rate", "start_learning_rate"))
    warmup, total, power = (f32(curve[k]) for k in ("warmup_epochs", "total_epochs", "power"))
    rates = []
    for step in steps:
        done = epochs_done(step)
        if done < warmup:
            rate = (
                start
                + f32(curve["peak_learning_rate"] - curve["start_learning_rate"])
                * epochs_done(step + 1)
                / warmup
            )
        elif done < total:
            progress = min(max((done - warmup) / (total - warmup), f32(0)), f32(1))
            rate = (
                end
                + f32(curve["peak_learning_rate"] - curve["end_learning_rate"])
                * (f32(1) - progress) ** power
            )
        else:
            rate = end
        if coupling == "scale":
            batch = phases[phase_of(step)][1]
            reference = scaling.get("reference_batch_size") or phases[0][1]
            factor = batch / reference
            if scaling.get("scaling_rule", "linear") == "sqrt":
                factor = math.sqrt(factor)
            rate = rate * f32(factor)
        rates.append(f32(rate))
    return np.array(rates, dtype=np.float32)


def _schedule(**rule):
    return EpochWarmupPolyDecay(BatchSchedule(PHASES), N, **CURVE, **rule)


# --- the step arithmetic -----------------------------------------------------------
def test_steps_per_epoch_start_steps_and_phases():
    schedule = BatchSchedule(PHASES)
    assert schedule.steps_per_epoch(N) == (8, 4, 2)
    assert schedule.steps_per_epoch(N + 15) == (9, 4, 2)  # floor(79 / B): remainder dropped
    assert schedule.start_steps(N) == STARTS
    assert schedule.start_steps(N + 15) == (0, 18, 30)
    assert [schedule.phase_at_step(s, N) for s in (0, 15, 16, 27, 28, 10**6)] == [0, 0, 1, 1, 2, 2]
    assert [schedule.phase_at_epoch(e) for e in (0, 1, 2, 4, 5, 90)] == [0, 0, 1, 1, 2, 2]
    assert [schedule.step_at_epoch(e, N) for e in (0, 1, 2, 3, 5, 7)] == [0, 8, 16, 20, 28, 32]
    assert schedule.phases[1] == Phase(epoch=2, global_batch_size=16, image_size=None)
    numpy_ints = BatchSchedule([(np.int64(0), np.int32(8), np.int64(28))])
    assert numpy_ints == BatchSchedule([(0, 8, 28)])
    assert type(numpy_ints.phases[0].global_batch_size) is int  # plain JSON in get_config


def test_epochs_done_at_the_boundaries():
    schedule = BatchSchedule(PHASES)
    steps = [0, 1, 15, 16, 17, 27, 28, 29, 31, 32, 10**6]
    expected = [0, 1 / 8, 15 / 8, 2, 2 + 1 / 4, 2 + 11 / 4, 5, 5.5, 6.5, 7, 5 + (10**6 - 28) / 2]
    done = schedule.epochs_done(tf.constant(steps, tf.int64), N).numpy()
    assert done.dtype == np.float32
    np.testing.assert_array_equal(done, np.float32(expected))
    assert float(schedule.epochs_done(16, N)) == 2.0  # a plain number too


def test_parse_merges_the_image_size_schedule():
    schedule = BatchSchedule.parse("0:4096, 30:8192,60:16384", "0:128,40:192,60:224")
    assert [(p.epoch, p.global_batch_size, p.image_size) for p in schedule.phases] == [
        (0, 4096, 128),
        (30, 8192, 128),
        (40, 8192, 192),
        (60, 16384, 224),
    ]
    assert BatchSchedule.parse("0:256") == BatchSchedule.constant(256)
    assert BatchSchedule.parse("0:256").phases == (Phase(0, 256, None),)


# --- the rate against the closed form ------------------------------------------------
@pytest.mark.parametrize("rule", RULES, ids=lambda r: "-".join(map(str, r.values())))
def test_rate_at_every_step_matches_the_closed_form(rule):
    steps = np.arange(0, 40)  # the run ends at step 32; then the end rate
    rates = _schedule(**rule)(tf.constant(steps, tf.int64)).numpy()
    expected = reference_rates(steps, PHASES, N, CURVE, **rule)
    np.testing.assert_array_max_ulp(rates, expected, maxulp=1)


def test_rate_factors_scale_each_phase_of_the_grow_curve():
    steps = np.arange(0, 40)
    factors = (1.0, 1.75, 0.5)  # one a phase (keras_lars.AdaptiveBatchSize's decisions)
    rates = _schedule(rate_factors=factors)(tf.constant(steps, tf.int64)).numpy()
    grow = reference_rates(steps, PHASES, N, CURVE)
    phase = np.searchsorted(STARTS, steps, side="right") - 1
    np.testing.assert_array_max_ulp(rates, grow * np.float32(factors)[phase], maxulp=1)
    config = _schedule(rate_factors=factors).get_config()
    assert config["rate_factors"] == list(factors)
    assert EpochWarmupPolyDecay.from_config(config).rate_factors == factors


def test_warmup_crosses_the_boundary_at_the_per_epoch_pace():
    rates = _schedule()(tf.range(0, 21)).numpy()
    # Epoch 2 (batch 16): each step is 1/4 epoch of warmup, before 1/8.
    np.testing.assert_allclose(np.diff(rates[:16]), 1.9 / 3 / 8, rtol=1e-5)
    np.testing.assert_allclose(np.diff(rates[16:20]), 1.9 / 3 / 4, rtol=1e-5)
    assert rates[19] == np.float32(2.0)  # step 19 ends epoch 3: the peak


def test_one_phase_equals_warmup_poly_decay():
    epochs = EpochWarmupPolyDecay(BatchSchedule.constant(8), N, 3.0, 2, 9, end_learning_rate=0.01)
    steps = WarmupPolyDecay(3.0, 2 * 8, 9 * 8, end_learning_rate=0.01)
    all_steps = tf.range(0, 80)
    np.testing.assert_array_equal(epochs(all_steps).numpy(), steps(all_steps).numpy())


def test_compiled_with_xla_matches_eager():
    schedule = _schedule(coupling="scale", scaling_rule="sqrt")
    steps = tf.range(0, 40, dtype=tf.int64)
    compiled = tf.function(
        lambda s: tf.map_fn(schedule, s, fn_output_signature=tf.float32), jit_compile=True
    )
    np.testing.assert_array_max_ulp(compiled(steps).numpy(), schedule(steps).numpy(), maxulp=1)


# --- the rate the optimizer used in the compiled train step -------------------------
TOTAL_STEPS = 34  # 2 * 8 + 3 * 4 + 3 * 2: epochs 0 to 7


class _Executions(keras.callbacks.Callback):
    """The optimizer's iterations after every execution of the train step."""

    def __init__(self):
        super().__init__()
        self.iterations = []

    def on_train_batch_end(self, batch, logs=None):
        self.iterations.append(int(self.model.optimizer.iterations.numpy()))


def _rates_used(schedule, steps_per_execution):
    """The rate SGD used at each step, read off the weights: step k's batch is
    B copies of the one-hot row e_k and the loss is x . w, so its gradient is
    exactly e_k and only w_k moves, from 0 to -lr(k). One fit per epoch with
    its phase's batch, as the training tool runs them."""
    model = keras.Sequential(
        [
            keras.Input((TOTAL_STEPS,)),
            keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros"),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.SGD(learning_rate=schedule),
        loss=lambda y_true, y_pred: keras.ops.squeeze(y_pred, -1),
        steps_per_execution=steps_per_execution,
    )
    batches = BatchSchedule(PHASES)
    executions = _Executions()
    for epoch in range(8):
        batch = PHASES[batches.phase_at_epoch(epoch)][1]
        first, last = batches.step_at_epoch(epoch, N), batches.step_at_epoch(epoch + 1, N)
        x = np.repeat(np.eye(TOTAL_STEPS, dtype="float32")[first:last], batch, axis=0)
        model.fit(
            x,
            np.zeros(len(x), "float32"),
            batch_size=batch,
            initial_epoch=epoch,
            epochs=epoch + 1,
            shuffle=False,
            verbose=0,
            callbacks=[executions],
        )
    return -model.layers[-1].kernel.numpy()[:, 0], executions.iterations


@pytest.mark.parametrize("steps_per_execution", [1, 3])
@pytest.mark.parametrize("rule", RULES[:3], ids=lambda r: "-".join(map(str, r.values())))
def test_fit_uses_the_closed_form_rate_at_every_step(rule, steps_per_execution):
    rates, iterations = _rates_used(_schedule(**rule), steps_per_execution)
    expected = reference_rates(np.arange(TOTAL_STEPS), PHASES, N, CURVE, **rule)
    np.testing.assert_array_max_ulp(rates, expected, maxulp=1)
    assert iterations[-1] == TOTAL_STEPS
    if steps_per_execution == 1:
        assert iterations == list(range(1, TOTAL_STEPS + 1))
    else:  # epochs of 8 steps run 3 + 3 + 2, of 4: 3 + 1, of 2: 2
        assert iterations[:4] == [3, 6, 8, 11] and iterations[-2:] == [32, 34]


# --- the JAX backend --------------------------------------------------------------
JAX_SCRIPT = """
import json, sys
import jax, numpy as np
import keras, keras_lars
schedule = keras.optimizers.schedules.deserialize(json.loads(sys.argv[1]))
print(json.dumps(jax.jit(schedule)(np.arange(40)).tolist()))
"""


def test_jax_jit_gives_the_closed_form():
    schedule = _schedule(coupling="scale", scaling_rule="linear")
    config = json.dumps(keras.optimizers.schedules.serialize(schedule))
    result = subprocess.run(
        [sys.executable, "-c", JAX_SCRIPT, config],
        cwd=ROOT,
        env=dict(os.environ, KERAS_BACKEND="jax", TF_CPP_MIN_LOG_LEVEL="2"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    rates = np.float32(json.loads(result.stdout.strip().splitlines()[-1]))
    expected = reference_rates(np.arange(40), PHASES, N, CURVE, coupling="scale")
    np.testing.assert_array_max_ulp(rates, expected, maxulp=1)


# --- serialization ---------------------------------------------------------------
def test_config_round_trip_and_registration():
    schedule = EpochWarmupPolyDecay(
        BatchSchedule.parse("0:8,2:16", "0:28,1:32"),
        N,
        1.5,
        0.5,
        6,
        power=1.0,
        coupling="scale",
        scaling_rule="sqrt",
        reference_batch_size=4,
        name="phased",
    )
    config = schedule.get_config()
    assert json.loads(json.dumps(config)) == config  # plain JSON
    assert EpochWarmupPolyDecay.from_config(config).get_config() == config
    restored = keras.optimizers.schedules.deserialize(
        keras.optimizers.schedules.serialize(schedule)
    )
    assert isinstance(restored, EpochWarmupPolyDecay) and restored.get_config() == config
    assert restored.batch_schedule == schedule.batch_schedule
    steps = tf.range(0, 30)
    np.testing.assert_array_equal(restored(steps).numpy(), schedule(steps).numpy())
    batches = keras.saving.deserialize_keras_object(
        keras.saving.serialize_keras_object(schedule.batch_schedule)
    )
    assert batches == schedule.batch_schedule
    assert (
        keras.saving.get_registered_name(EpochWarmupPolyDecay) == "keras_lars>EpochWarmupPolyDecay"
    )
    assert keras.saving.get_registered_name(BatchSchedule) == "keras_lars>BatchSchedule"


def test_keras_file_round_trip(tmp_path):
    schedule = _schedule(coupling="scale", scaling_rule="linear")
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1, use_bias=False)])
    model.compile(optimizer=keras.optimizers.SGD(schedule), loss="mse")
    model.fit(np.ones((N, 1)), np.zeros(N), batch_size=8, epochs=2, shuffle=False, verbose=0)
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded.optimizer._learning_rate, EpochWarmupPolyDecay)
    assert loaded.optimizer._learning_rate.get_config() == schedule.get_config()
    assert int(loaded.optimizer.iterations) == 16
    expected = reference_rates([16], PHASES, N, CURVE, coupling="scale")[0]  # batch 16 now
    assert float(loaded.optimizer.learning_rate) == pytest.approx(float(expected), rel=1e-6)


# --- bad input: one line naming the culprit --------------------------------------------
def _one_line(error):
    message = str(error.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize(
    "batches, sizes, culprit",
    [
        ("", None, "batch schedule '': name at least one phase"),
        ("   ", None, "name at least one phase"),
        ("0:4096,", None, "batch schedule phase 2 '': expected epoch:global batch"),
        ("0:4096,30", None, "batch schedule phase 2 '30': expected epoch:global batch"),
        ("0:4096,x:8192", None, "phase 2 'x:8192'"),
        ("0:4.5", None, "phase 1 '0:4.5'"),
        ("0:4096:1", None, "phase 1 '0:4096:1'"),
        ("0=4096", None, "phase 1 '0=4096'"),
        ("0:1_000", None, "phase 1 '0:1_000'"),
        ("5:4096", None, r"phase 1 \(epoch 5\): the first phase must start at epoch 0"),
        ("-1:4096", None, r"phase 1 \(epoch -1\): the first phase must start at epoch 0"),
        ("0:4096,30:8192,30:16384", None, r"phase 3 \(epoch 30\): epochs must increase"),
        ("0:4096,30:8192,20:16384", None, r"phase 3 \(epoch 20\): epochs must increase"),
        ("0:0", None, r"phase 1 \(epoch 0\): the global batch must be an integer >= 1, got 0"),
        ("0:4096,30:-8", None, r"phase 2 \(epoch 30\): the global batch must be .* got -8"),
        ("0:4096", "0:128,40", "image size schedule phase 2 '40': expected epoch:image size"),
        ("0:4096", "10:128", r"image size schedule phase 1 \(epoch 10\): the first phase"),
        ("0:4096", "0:0", r"image size schedule phase 1 \(epoch 0\): the image size must be"),
    ],
)
def test_bad_flag_text_is_refused_naming_the_phase(batches, sizes, culprit):
    with pytest.raises(ValueError, match=culprit) as error:
        BatchSchedule.parse(batches, sizes)
    _one_line(error)


@pytest.mark.parametrize(
    "phases, culprit",
    [
        ([], "name at least one phase"),
        ("0:256", "BatchSchedule.parse"),
        ([(0, 256), (2.5, 512)], r"phase 2 \(epoch 2.5\): the epoch must be a whole number"),
        ([(0, 256), (True, 512)], r"phase 2 \(epoch True\): the epoch must be a whole number"),
        ([(0, 256.0)], "the global batch must be an integer >= 1, got 256.0"),
        ([(0, 256, 32), (4, 512)], "give every phase an image size or none"),
        ([(0, 256, 32), (4, 512, -1)], r"phase 2 \(epoch 4\): the image size must be"),
        ([(0, 256), (4,)], r"phase 2: expected a Phase or \(epoch, global batch"),
        ([(0, 256), 4], r"phase 2: expected a Phase or \(epoch, global batch"),
    ],
)
def test_bad_phases_are_refused_naming_the_phase(phases, culprit):
    with pytest.raises(ValueError, match=culprit) as error:
        BatchSchedule(phases)
    _one_line(error)


def test_a_batch_larger_than_the_data_is_refused_naming_the_phase():
    schedule = BatchSchedule(PHASES)
    with pytest.raises(
        ValueError, match=r"phase 3 \(epoch 5\): the global batch 32 exceeds the 20"
    ) as error:
        schedule.steps_per_epoch(20)
    _one_line(error)
    with pytest.raises(ValueError, match=r"phase 3 \(epoch 5\)"):
        EpochWarmupPolyDecay(schedule, 20, 1.0, 1, 5)


@pytest.mark.parametrize(
    "kwargs, culprit",
    [
        (dict(batch_schedule=[(0, 8)]), "batch_schedule"),
        (dict(num_examples=0), "num_examples"),
        (dict(peak_learning_rate=-1.0), "peak_learning_rate"),
        (dict(warmup_epochs=-1), "warmup_epochs"),
        (dict(warmup_epochs=8), "warmup_epochs"),
        (dict(total_epochs=0), "total_epochs"),
        (dict(power=0.0), "power"),
        (dict(end_learning_rate=float("nan")), "end_learning_rate"),
        (dict(start_learning_rate=-0.1), "start_learning_rate"),
        (dict(coupling="linear"), "coupling"),
        (dict(coupling="scale", scaling_rule="cubic"), "scaling_rule"),
        (dict(reference_batch_size=0), "reference_batch_size"),
        (dict(rate_factors=(1.0, 2.0)), "rate_factors"),
        (dict(rate_factors=(1.0, 2.0, -1.0)), "rate_factors"),
    ],
)
def test_bad_rate_schedule_arguments(kwargs, culprit):
    arguments = dict(batch_schedule=BatchSchedule(PHASES), num_examples=N, **CURVE)
    arguments.update(kwargs)
    with pytest.raises(ValueError, match=culprit) as error:
        EpochWarmupPolyDecay(**arguments)
    _one_line(error)
