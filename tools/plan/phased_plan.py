"""A run in phases: the batch and image size by epoch (keras_lars.BatchSchedule,
the training tool's --batch_schedule and --image_size_schedule).

Phase k runs epochs E_k to E_{k+1} (the last to the run's T) at global batch
B_k and image side I_k over p devices, and is the plain plan of its own
batch, image size and epochs:

    b_k      = B_k / p                        images a device (p divides B_k)
    steps_k  = (E_{k+1} - E_k) * floor(N / B_k)    (drop remainder; a fractional
                                              last phase rounds, epochs_to_steps)
    step_k   = step(b_k, I_k)                 compute at I_k's FLOPs (~ I_k^2);
                                              the same gradient bytes every step
    memory_k = memory(b_k, I_k)               activations ~ b_k I_k^2
    time     = sum_k steps_k * step_k
"""

import dataclasses


@dataclasses.dataclass(frozen=True)
class PhaseSpan:
    """Epochs first_epoch to end_epoch at `global_batch` and `image_size`."""

    first_epoch: int
    end_epoch: float
    global_batch: int
    image_size: int

    @property
    def epochs(self):
        return self.end_epoch - self.first_epoch


def span_text(span):
    """'epochs 30-60: global batch 8,192, image size 224'."""
    return (
        f"epochs {span.first_epoch}-{span.end_epoch:g}: global batch {span.global_batch:,}, "
        f"image size {span.image_size}"
    )


def phase_spans(schedule, epochs, image_size):
    """The PhaseSpan of each phase of `schedule` (a keras_lars.BatchSchedule),
    the last ending at `epochs`; `image_size` where the schedule has none."""
    phases = schedule.phases
    ends = [phase.epoch for phase in phases[1:]] + [epochs]
    return tuple(
        PhaseSpan(phase.epoch, end, phase.global_batch_size, phase.image_size or image_size)
        for phase, end in zip(phases, ends)
    )


@dataclasses.dataclass(frozen=True)
class PhasePlan:
    """A phase's span, its step.Run and its memory.MemoryEstimate."""

    span: PhaseSpan
    run: object
    memory: object


@dataclasses.dataclass(frozen=True)
class PhasedPlan:
    """The phases of a run and their sums."""

    phases: tuple

    @property
    def steps(self):
        return sum(phase.run.steps for phase in self.phases)

    @property
    def seconds(self):
        return sum(phase.run.seconds for phase in self.phases)
