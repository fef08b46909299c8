"""How long the run is, in steps: an epoch is one pass over the training set
(drop remainder), steps_per_epoch = floor(N / B). Under --batch_schedule each
phase k (epochs E_k to E_{k+1}, batch B_k) has its own n_k = floor(N / B_k)
(keras_lars.BatchSchedule.steps_per_epoch), and the run is sum_k
(E_{k+1} - E_k) * n_k steps."""

import dataclasses
import math

import keras_lars
from keras_lars.tools.settings import ConfigError


@dataclasses.dataclass(frozen=True)
class PhaseLength:
    """Epochs first_epoch .. end_epoch - 1, at `global_batch_size` and
    `image_size` (None: --image_size), each of `steps_per_epoch` steps."""

    first_epoch: int
    end_epoch: int
    global_batch_size: int
    steps_per_epoch: int
    image_size: int | None = None


@dataclasses.dataclass(frozen=True)
class RunLength:
    """The run's steps: per full epoch (the first phase's), in all, and of the
    warmup; `phases` under --batch_schedule / --image_size_schedule, else empty."""

    steps_per_epoch: int
    total_steps: int
    warmup_steps: int
    phases: tuple = ()
    global_batch_size: int = 0  # without phases: every step's

    def examples_at(self, step):
        """Training examples consumed by the first `step` steps."""
        if not self.phases:
            return step * self.global_batch_size
        examples = 0
        for phase in self.phases:
            steps = min(step, (phase.end_epoch - phase.first_epoch) * phase.steps_per_epoch)
            examples, step = examples + steps * phase.global_batch_size, step - steps
        return examples

    @property
    def epochs(self):
        if self.phases:
            return self.phases[-1].end_epoch
        return math.ceil(self.total_steps / self.steps_per_epoch)

    def phase_of(self, epoch):
        """The PhaseLength that `epoch` is in (under --batch_schedule)."""
        return [phase for phase in self.phases if phase.first_epoch <= epoch][-1]

    def steps_in(self, epoch):
        if self.phases:
            return self.phase_of(epoch).steps_per_epoch
        return min(self.steps_per_epoch, self.total_steps - epoch * self.steps_per_epoch)


def run_length(config, num_train, schedule=None):
    """The RunLength of `config` on `num_train` examples (in the phases of
    `schedule`, a keras_lars.BatchSchedule, where given: --adaptive_batch's);
    a ConfigError names the flag when the batch, --steps_per_execution or the
    warmup does not fit."""
    if config.batch_phases is not None or schedule is not None:
        return _phased_length(config, num_train, schedule)
    if config.global_batch_size > num_train:
        held = config.validation_examples  # the culprit when the batch fits without it
        culprit = (
            f"--validation_examples={held} leaves {num_train} training examples, fewer than "
            f"--global_batch_size={config.global_batch_size}"
            if held and config.global_batch_size <= num_train + held
            else f"--global_batch_size={config.global_batch_size} exceeds the "
            f"{num_train} training examples"
        )
        raise ConfigError(f"{culprit}: an epoch would have no step.")
    per_epoch = keras_lars.steps_per_epoch(num_train, config.global_batch_size)
    total = config.train_steps or config.train_epochs * per_epoch
    warmup = keras_lars.epochs_to_steps(config.warmup_epochs, num_train, config.global_batch_size)
    length = RunLength(per_epoch, total, warmup, global_batch_size=config.global_batch_size)
    k, micro = config.steps_per_execution, config.gradient_accumulation_steps
    if micro > 1 and micro % k and k % micro:
        raise ConfigError(
            f"--steps_per_execution={k}: with --gradient_accumulation_steps={micro} one must "
            "divide the other, so that an execution ends where an update does."
        )
    for steps in sorted({length.steps_in(e) for e in range(length.epochs)}):
        if steps * micro % k:
            raise ConfigError(
                f"--steps_per_execution={k} must divide the steps of every epoch "
                f"({steps} here; {per_epoch} per full epoch"
                + (f", times {micro} micro-batches" if micro > 1 else "")
                + "), since checkpoints and evaluation happen at epoch ends."
            )
    if warmup > total:
        raise ConfigError(
            f"--warmup_epochs={config.warmup_epochs} ({warmup} steps) is longer than "
            f"the training ({total} steps): lower it or train longer."
        )
    return length


def _phased_length(config, num_train, schedule=None):
    """The RunLength under --batch_schedule / --image_size_schedule (or
    `schedule`): each phase's steps per epoch, checked against
    --steps_per_execution (a ConfigError naming the phase)."""
    schedule = schedule or config.batch_phases
    flag = (
        f"--batch_schedule={config.batch_schedule}"
        if config.batch_schedule
        else f"--global_batch_size={config.global_batch_size}"
    )
    try:
        per_epoch = schedule.steps_per_epoch(num_train)
    except ValueError as error:
        raise ConfigError(f"{flag}: {error}") from None
    ends = [p.epoch for p in schedule.phases[1:]] + [config.train_epochs]
    phases = tuple(
        PhaseLength(p.epoch, end, p.global_batch_size, steps, p.image_size)
        for p, end, steps in zip(schedule.phases, ends, per_epoch)
    )
    k = config.steps_per_execution
    for number, phase in enumerate(phases, 1):
        if phase.steps_per_epoch % k:
            raise ConfigError(
                f"{flag}: phase {number} (epoch "
                f"{phase.first_epoch}, global batch {phase.global_batch_size}) has "
                f"{phase.steps_per_epoch} steps per epoch, which --steps_per_execution={k} "
                "does not divide (checkpoints and evaluation happen at epoch ends)."
            )
    total = sum((p.end_epoch - p.first_epoch) * p.steps_per_epoch for p in phases)
    warmup = _steps_to_epoch(phases, config.warmup_epochs)
    return RunLength(phases[0].steps_per_epoch, total, warmup, phases)


def _steps_to_epoch(phases, epochs):
    """The step (rounded) at which `epochs` (fractional, <= the run's) are done."""
    step = 0
    for phase in phases:
        inside = min(max(epochs - phase.first_epoch, 0), phase.end_epoch - phase.first_epoch)
        step += inside * phase.steps_per_epoch
    return round(step)
