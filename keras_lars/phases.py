"""A batch schedule's phases in plain Python: the flag text "epoch:value,...",
its parse and its checks (keras_lars.BatchSchedule holds the phases; see
batch_schedule.py). No Keras is imported: the tools check their schedule
flags with these before it loads."""

import dataclasses
import numbers
import re

# ASCII digits and spaces only: Python's \d and int() also take fullwidth digits and
# \s Unicode spaces.
_PHASE_TEXT = re.compile(r"\s*([+-]?\d+)\s*:\s*([+-]?\d+)\s*", re.ASCII)


def _whole(value):
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def parse_phases(text, schedule_name="batch schedule", value_name="global batch"):
    """((epoch, value), ...) of flag text "0:4096,30:8192" (epoch:value,
    whole numbers in ASCII digits, ASCII spaces around them allowed); a
    ValueError names the phase that is not. The pairs are checked by
    `BatchSchedule`, not here."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(
            f"{schedule_name} {text!r}: name at least one phase as epoch:{value_name}, "
            "e.g. 0:256,30:1024."
        )
    pairs = []
    for number, item in enumerate(text.split(","), 1):
        match = _PHASE_TEXT.fullmatch(item)
        if not match:
            raise ValueError(
                f"{schedule_name} phase {number} {item!r}: expected epoch:{value_name}, "
                "two whole numbers (e.g. 30:1024)."
            )
        pairs.append((int(match[1]), int(match[2])))
    return tuple(pairs)


def _check_pairs(pairs, schedule_name, value_name):
    """Raises ValueError naming the first phase (epoch, value) that is not:
    whole epochs from 0, increasing, values whole and >= 1."""
    if len(pairs) == 0:
        raise ValueError(f"{schedule_name}: name at least one phase.")
    for number, (epoch, value) in enumerate(pairs, 1):
        phase = f"{schedule_name} phase {number} (epoch {epoch!r})"
        if not _whole(epoch):
            raise ValueError(f"{phase}: the epoch must be a whole number.")
        if number == 1 and epoch != 0:
            raise ValueError(f"{phase}: the first phase must start at epoch 0.")
        if number > 1 and epoch <= pairs[number - 2][0]:
            raise ValueError(
                f"{phase}: epochs must increase; phase {number - 1} starts at epoch "
                f"{pairs[number - 2][0]}."
            )
        if not _whole(value) or value < 1:
            raise ValueError(f"{phase}: the {value_name} must be an integer >= 1, got {value!r}.")


@dataclasses.dataclass(frozen=True)
class Phase:
    """From `epoch` to the next phase's: batches of `global_batch_size`
    examples over all replicas, images `image_size` pixels a side (None:
    the run's)."""

    epoch: int
    global_batch_size: int
    image_size: int | None = None


def _as_phase(number, phase):
    if isinstance(phase, Phase):
        return phase
    if isinstance(phase, (tuple, list)) and len(phase) in (2, 3):
        return Phase(*phase)
    raise ValueError(
        f"batch schedule phase {number}: expected a Phase or (epoch, global batch"
        f"[, image size]), got {phase!r}."
    )


def checked_phases(phases):
    """`phases` (`Phase`s or (epoch, global batch[, image size]) tuples) as a
    tuple of Phases; a ValueError names the first that is not: epochs whole,
    the first 0, increasing; batches and image sizes whole and >= 1, every
    phase with an image size or none (BatchSchedule's phases)."""
    phases = tuple(_as_phase(number, p) for number, p in enumerate(phases, 1))
    _check_pairs([(p.epoch, p.global_batch_size) for p in phases], "batch schedule", "global batch")
    sized = [(p.epoch, p.image_size) for p in phases if p.image_size is not None]
    if sized and len(sized) < len(phases):
        raise ValueError(
            "batch schedule: give every phase an image size or none (phases "
            f"{', '.join(str(i + 1) for i, p in enumerate(phases) if p.image_size is None)} "
            "have none)."
        )
    if sized:
        _check_pairs(sized, "batch schedule", "image size")
    return tuple(
        Phase(int(p.epoch), int(p.global_batch_size), p.image_size and int(p.image_size))
        for p in phases
    )


def schedule_phases(batch_schedule, image_size_schedule=None):
    """The phases (epoch, global batch[, image size]) of flag texts
    batch_schedule "0:4096,30:8192" and optionally image_size_schedule
    "0:128,40:192" (BatchSchedule.parse); a phase starts wherever either
    changes. A ValueError names the text's phase that is not one."""
    batches = parse_phases(batch_schedule, "batch schedule", "global batch")
    _check_pairs(batches, "batch schedule", "global batch")
    if image_size_schedule is None:
        return batches
    sizes = parse_phases(image_size_schedule, "image size schedule", "image size")
    _check_pairs(sizes, "image size schedule", "image size")

    def value_at(pairs, epoch):
        return [value for start, value in pairs if start <= epoch][-1]

    epochs = sorted({epoch for epoch, _ in batches + sizes})
    return [(e, value_at(batches, e), value_at(sizes, e)) for e in epochs]
