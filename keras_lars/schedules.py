"""The large-batch learning-rate curve: linear warmup, then polynomial decay.

This is the one place the curve is written down; `WarmupPolyDecayCallback`
and the training tool evaluate this schedule, they do not re-implement it.
"""

import keras
from keras import ops

from keras_lars.validation import check_integer
from keras_lars.validation import check_number


def warmup_poly_decay(done, done_after, warmup, total, peak, end, start, power):
    """The curve at progress `done` (a float32 tensor; steps or epochs before
    the update) and `done_after` (the progress after it), with warmup W and
    total T in the same unit (python floats, 0 <= W <= T, T > 0):

        done <  W:          lr = s + (p - s) * done_after / W
        W <= done < T:      lr = e + (p - e) * (1 - (done - W) / (T - W))^power
        done >= T:          lr = e

    Written once, for `WarmupPolyDecay` (steps) and `EpochWarmupPolyDecay`
    (epochs); a zero-length warmup or decay divides by 1 instead (its branch
    is never taken).
    """
    warmup_rate = start + (peak - start) * done_after / (warmup if warmup > 0 else 1.0)
    decay_length = total - warmup if total > warmup else 1.0
    progress = ops.clip((done - warmup) / decay_length, 0.0, 1.0)
    decay_rate = end + (peak - end) * ops.power(1.0 - progress, power)
    decay_rate = ops.where(done < total, decay_rate, end)
    return ops.where(done < warmup, warmup_rate, decay_rate)


@keras.saving.register_keras_serializable(package="keras_lars")
class WarmupPolyDecay(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup to a peak rate, then polynomial decay to an end rate.

    `step` is the optimizer's iteration count before the update, so step 0
    is the first update and step k the (k+1)-th. With start rate s, peak p,
    end rate e, warmup W and total T steps:

        step <  W:          lr = s + (p - s) * (step + 1) / W
        W <= step < T:      lr = e + (p - e) * (1 - (step - W) / (T - W))^power
        step >= T:          lr = e

    The first update already moves (it uses s + (p - s) / W, not s), the
    W-th update (step W - 1) is the first at the peak, and decay starts from
    the peak at step W. The tensorflow/tpu `lars_util.poly_rate_schedule`
    and the Google MLPerf v0.7 ResNet-50 reference instead warm up with
    p * step / W, spending their first update at rate 0, and decay over
    T - W + 1 steps; otherwise the curves are the same.

    Everything is `keras.ops` on the step tensor, so the rate is computed in
    the compiled train step (graph, XLA, TPU, JAX), exactly at every step,
    whatever `steps_per_execution` is, and correctly after resuming, since
    the step is the optimizer's restored `iterations`. (With Keras's
    `gradient_accumulation_steps`, Keras hands schedules the count of
    micro-batches: count W and T in micro-batches then.)

    Args:
        peak_learning_rate: float >= 0, p, reached at the end of warmup.
        warmup_steps: int >= 0, W; 0 starts decaying from p at step 0.
        total_steps: int > 0, T >= W, where the rate reaches e.
        power: float > 0, the decay polynomial's power (2 in the LARS
            papers and the MLPerf reference; 1 is linear decay).
        end_learning_rate: float >= 0, e.
        start_learning_rate: float >= 0, s, the rate warmup starts from
            (before the first update); 0 in the references.
        name: optional name.
    """

    def __init__(
        self,
        peak_learning_rate,
        warmup_steps,
        total_steps,
        power=2.0,
        end_learning_rate=1e-4,
        start_learning_rate=0.0,
        name="warmup_poly_decay",
    ):
        self.peak_learning_rate = check_number(
            "peak_learning_rate", peak_learning_rate, at_least=0.0
        )
        self.warmup_steps = check_integer("warmup_steps", warmup_steps, 0)
        self.total_steps = check_integer("total_steps", total_steps, 1)
        if self.warmup_steps > self.total_steps:
            raise ValueError(
                f"`warmup_steps` ({warmup_steps}) must not exceed `total_steps` ({total_steps})."
            )
        self.power = check_number("power", power, above=0.0)
        self.end_learning_rate = check_number("end_learning_rate", end_learning_rate, at_least=0.0)
        self.start_learning_rate = check_number(
            "start_learning_rate", start_learning_rate, at_least=0.0
        )
        self.name = name

    def __call__(self, step):
        step = ops.cast(step, "float32")
        return warmup_poly_decay(
            step,
            step + 1.0,
            float(self.warmup_steps),
            float(self.total_steps),
            self.peak_learning_rate,
            self.end_learning_rate,
            self.start_learning_rate,
            self.power,
        )

    def get_config(self):
        return {
            "peak_learning_rate": self.peak_learning_rate,
            "warmup_steps": self.warmup_steps,
            "total_steps": self.total_steps,
            "power": self.power,
            "end_learning_rate": self.end_learning_rate,
            "start_learning_rate": self.start_learning_rate,
            "name": self.name,
        }
