"""Batch-size control: the global batch (and image size) by epoch, and the
learning rate as a function of epochs done.

A `BatchSchedule` is a list of phases; phase k runs from epoch E_k (E_0 = 0,
increasing) to the next phase's, with global batch B_k and, optionally, image
side I_k. An epoch is one pass over the N training examples with the
remainder dropped (`keras_lars.steps_per_epoch`, static shapes), so phase k
takes n_k = floor(N / B_k) steps per epoch and starts at step

    S_0 = 0,   S_k = S_{k-1} + (E_k - E_{k-1}) * n_{k-1}.

Steps stop measuring progress once the batch changes; epochs done still do:

    e(s) = E_k + (s - S_k) / n_k       for S_k <= s < S_{k+1}

(s counts updates before this one; the last phase runs on forever).
`EpochWarmupPolyDecay` is `WarmupPolyDecay`'s curve in epochs, evaluated at
e(iterations) inside the train step. The phases themselves, their flag text
and its checks are phases.py's (plain Python: no Keras).
"""

import dataclasses
import math

import keras
from keras import ops

from keras_lars.phases import checked_phases
from keras_lars.phases import schedule_phases
from keras_lars.recipes import steps_per_epoch
from keras_lars.schedules import warmup_poly_decay
from keras_lars.validation import check_integer
from keras_lars.validation import check_number

COUPLINGS = ("grow", "scale")
SCALING_RULES = ("linear", "sqrt")


@keras.saving.register_keras_serializable(package="keras_lars")
class BatchSchedule:
    """Phases of (from epoch, global batch, optional image size); see the
    module docstring for the step arithmetic.

    Args:
        phases: `Phase`s or (epoch, global_batch_size[, image_size]) tuples,
            epochs whole, the first 0, increasing; batches and image sizes
            whole and >= 1 (image size may be None). A ValueError names the
            first phase that is not.
    """

    def __init__(self, phases):
        if isinstance(phases, str):
            raise ValueError(
                f"batch schedule {phases!r}: give phases, or read flag text with "
                "BatchSchedule.parse."
            )
        self.phases = checked_phases(phases)

    @classmethod
    def parse(cls, batch_schedule, image_size_schedule=None):
        """The schedule of flag texts: batch_schedule "0:4096,30:8192"
        (epoch:global batch) and optionally image_size_schedule
        "0:128,40:192" (epoch:image side); a phase starts wherever either
        changes."""
        return cls(schedule_phases(batch_schedule, image_size_schedule))

    @classmethod
    def constant(cls, global_batch_size, image_size=None):
        """One phase: the same batch (and image size) all along."""
        return cls([(0, global_batch_size, image_size)])

    # --- the step arithmetic, given N training examples --------------------------------
    def steps_per_epoch(self, num_examples):
        """n_k = floor(N / B_k) of each phase (drop remainder); a ValueError
        names a phase whose batch exceeds N."""
        num_examples = check_integer("num_examples", num_examples, at_least=1)
        for number, phase in enumerate(self.phases, 1):
            if phase.global_batch_size > num_examples:
                raise ValueError(
                    f"batch schedule phase {number} (epoch {phase.epoch}): the global batch "
                    f"{phase.global_batch_size} exceeds the {num_examples} training examples: "
                    "an epoch would have no step."
                )
        return tuple(steps_per_epoch(num_examples, p.global_batch_size) for p in self.phases)

    def start_steps(self, num_examples):
        """S_k, the step at which each phase starts."""
        per_epoch = self.steps_per_epoch(num_examples)
        starts = [0]
        for k in range(1, len(self.phases)):
            starts.append(
                starts[-1] + (self.phases[k].epoch - self.phases[k - 1].epoch) * per_epoch[k - 1]
            )
        return tuple(starts)

    def phase_at_epoch(self, epoch):
        """The index of the phase that whole epoch `epoch` (>= 0) is in."""
        epoch = check_integer("epoch", epoch, at_least=0)
        return max(k for k, p in enumerate(self.phases) if p.epoch <= epoch)

    def step_at_epoch(self, epoch, num_examples):
        """The step at which whole epoch `epoch` starts (epoch = the number of
        training epochs: the run's total steps)."""
        k = self.phase_at_epoch(epoch)
        per_epoch, starts = self.steps_per_epoch(num_examples), self.start_steps(num_examples)
        return starts[k] + (epoch - self.phases[k].epoch) * per_epoch[k]

    def phase_at_step(self, step, num_examples):
        """The index of the phase that step `step` (>= 0) is in."""
        step = check_integer("step", step, at_least=0)
        return max(k for k, start in enumerate(self.start_steps(num_examples)) if start <= step)

    def epochs_done(self, step, num_examples):
        """e(step) = E_k + (step - S_k) / n_k, in keras.ops (float32; steps
        exact below 2^24): a tensor for a step tensor or a number."""
        step = ops.cast(step, "float32")
        per_epoch, starts = self.steps_per_epoch(num_examples), self.start_steps(num_examples)
        done = 0.0
        for phase, start, steps in zip(self.phases, starts, per_epoch):
            in_phase = float(phase.epoch) + (step - float(start)) / float(steps)
            done = in_phase if start == 0 else ops.where(step >= float(start), in_phase, done)
        return done

    def phase_value(self, step, values, num_examples):
        """values[k] for the phase k of `step` (a tensor), in keras.ops."""
        step = ops.cast(step, "float32")
        chosen = ops.full_like(step, values[0])
        for start, value in zip(self.start_steps(num_examples)[1:], values[1:]):
            chosen = ops.where(step >= float(start), value, chosen)
        return chosen

    # --- equality and serialization ----------------------------------------------------
    def __eq__(self, other):
        return isinstance(other, BatchSchedule) and other.phases == self.phases

    def __hash__(self):
        return hash(self.phases)

    def __repr__(self):
        return f"BatchSchedule({[dataclasses.astuple(p) for p in self.phases]})"

    def get_config(self):
        return {"phases": [list(dataclasses.astuple(p)) for p in self.phases]}

    @classmethod
    def from_config(cls, config):
        return cls(config["phases"])


@keras.saving.register_keras_serializable(package="keras_lars")
class EpochWarmupPolyDecay(keras.optimizers.schedules.LearningRateSchedule):
    """`WarmupPolyDecay`'s curve counted in epochs done, for a batch that
    changes by phase (`BatchSchedule`).

    With s the optimizer's iteration count before the update, e(s) the
    epochs done (module docstring), phase k that of step s, warmup W and
    total T in epochs, and f the curve of `WarmupPolyDecay`:

        f = s0 + (p - s0) * e(s + 1) / W                      e(s) <  W
            e + (p - e) * (1 - (e(s) - W) / (T - W))^power    W <= e(s) < T
            e                                                 e(s) >= T

    the two coupling rules are

        grow:           lr(s) = f                    (Smith et al. 2018)
        scale, linear:  lr(s) = f * B_k / B_ref      (Goyal et al. 2017)
        scale, sqrt:    lr(s) = f * sqrt(B_k / B_ref)  (You et al. 2020)

    and `rate_factors` (a factor c_k per phase, e.g. `keras_lars.AdaptiveBatchSize`'s
    decisions) gives lr(s) = f * c_k in place of either rule.

    "grow" keeps the rate where the batch grows: growth replaces decay, and
    the rate decays only as f does (end_learning_rate = peak_learning_rate
    holds it constant after warmup, as in "Don't decay the learning rate,
    increase the batch size"). "scale" keeps the rate per example: each
    phase's rate is f scaled to its batch, so it jumps at a phase boundary.

    A single phase with whole warmup and total epochs gives `WarmupPolyDecay`
    (W * n, T * n steps) to float32 rounding. Everything is `keras.ops` on the
    step, so the rate is exact at every step in the compiled train step
    (graph, XLA, JAX), whatever `steps_per_execution` is, and after a restore.

    Args:
        batch_schedule: `BatchSchedule` (or its config).
        num_examples: int >= 1, N, training examples per epoch.
        peak_learning_rate: float >= 0, p (at batch B_ref under "scale").
        warmup_epochs: float >= 0, W.
        total_epochs: float > 0, T >= W, where the rate reaches e.
        power: float > 0, the decay's power.
        end_learning_rate: float >= 0, e (at batch B_ref under "scale").
        start_learning_rate: float >= 0, s0.
        coupling: "grow" or "scale".
        scaling_rule: "linear" or "sqrt" (used by "scale").
        reference_batch_size: int >= 1, B_ref; None: the first phase's batch.
        rate_factors: None, or one finite factor >= 0 per phase (overrides
            `coupling`).
        name: optional name.
    """

    def __init__(
        self,
        batch_schedule,
        num_examples,
        peak_learning_rate,
        warmup_epochs,
        total_epochs,
        power=2.0,
        end_learning_rate=1e-4,
        start_learning_rate=0.0,
        coupling="grow",
        scaling_rule="linear",
        reference_batch_size=None,
        rate_factors=None,
        name="epoch_warmup_poly_decay",
    ):
        if isinstance(batch_schedule, dict):
            batch_schedule = BatchSchedule.from_config(batch_schedule)
        if not isinstance(batch_schedule, BatchSchedule):
            raise ValueError(
                f"`batch_schedule` must be a keras_lars.BatchSchedule, received {batch_schedule!r}."
            )
        self.batch_schedule = batch_schedule
        self.num_examples = check_integer("num_examples", num_examples, at_least=1)
        batch_schedule.steps_per_epoch(self.num_examples)  # every phase has a step
        self.peak_learning_rate = check_number(
            "peak_learning_rate", peak_learning_rate, at_least=0.0
        )
        self.warmup_epochs = check_number("warmup_epochs", warmup_epochs, at_least=0.0)
        self.total_epochs = check_number("total_epochs", total_epochs, above=0.0)
        if self.warmup_epochs > self.total_epochs:
            raise ValueError(
                f"`warmup_epochs` ({warmup_epochs}) must not exceed "
                f"`total_epochs` ({total_epochs})."
            )
        self.power = check_number("power", power, above=0.0)
        self.end_learning_rate = check_number("end_learning_rate", end_learning_rate, at_least=0.0)
        self.start_learning_rate = check_number(
            "start_learning_rate", start_learning_rate, at_least=0.0
        )
        if coupling not in COUPLINGS:
            raise ValueError(f"`coupling` must be one of {COUPLINGS}, received {coupling!r}.")
        if scaling_rule not in SCALING_RULES:
            raise ValueError(
                f"`scaling_rule` must be one of {SCALING_RULES}, received {scaling_rule!r}."
            )
        self.coupling, self.scaling_rule = coupling, scaling_rule
        if reference_batch_size is not None:
            reference_batch_size = check_integer(
                "reference_batch_size", reference_batch_size, at_least=1
            )
        self.reference_batch_size = reference_batch_size
        if rate_factors is not None:
            if len(rate_factors) != len(batch_schedule.phases):
                raise ValueError(
                    f"`rate_factors` must hold one factor per phase ({len(batch_schedule.phases)}),"
                    f" received {rate_factors!r}."
                )
            rate_factors = tuple(
                check_number("rate_factors", factor, at_least=0.0) for factor in rate_factors
            )
        self.rate_factors = rate_factors
        self.name = name

    def batch_factors(self):
        """The factor of each phase: `rate_factors`, else 1 under "grow",
        else B_k / B_ref or its root."""
        if self.rate_factors is not None:
            return self.rate_factors
        if self.coupling == "grow":
            return tuple(1.0 for _ in self.batch_schedule.phases)
        reference = self.reference_batch_size or self.batch_schedule.phases[0].global_batch_size
        ratios = [p.global_batch_size / reference for p in self.batch_schedule.phases]
        return tuple(math.sqrt(r) if self.scaling_rule == "sqrt" else r for r in ratios)

    def __call__(self, step):
        step = ops.cast(step, "float32")
        schedule, examples = self.batch_schedule, self.num_examples
        rate = warmup_poly_decay(
            schedule.epochs_done(step, examples),
            schedule.epochs_done(step + 1.0, examples),
            self.warmup_epochs,
            self.total_epochs,
            self.peak_learning_rate,
            self.end_learning_rate,
            self.start_learning_rate,
            self.power,
        )
        if self.coupling == "grow" and self.rate_factors is None:
            return rate
        return rate * schedule.phase_value(step, self.batch_factors(), examples)

    def get_config(self):
        return {
            "batch_schedule": self.batch_schedule.get_config(),
            "num_examples": self.num_examples,
            "peak_learning_rate": self.peak_learning_rate,
            "warmup_epochs": self.warmup_epochs,
            "total_epochs": self.total_epochs,
            "power": self.power,
            "end_learning_rate": self.end_learning_rate,
            "start_learning_rate": self.start_learning_rate,
            "coupling": self.coupling,
            "scaling_rule": self.scaling_rule,
            "reference_batch_size": self.reference_batch_size,
            "rate_factors": None if self.rate_factors is None else list(self.rate_factors),
            "name": self.name,
        }
