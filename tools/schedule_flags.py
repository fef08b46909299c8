"""The schedule flags keras-lars-train and keras-lars-plan share.

--batch_schedule and --image_size_schedule are keras_lars.BatchSchedule's
phases, "epoch:value,...", the first at epoch 0. Each sets a flag of one
value for its first phase (SETS); left at its default, that flag takes the
first phase's value (`first_phase_value`), otherwise the two must agree
(`phases_problem`). Each tool adds its own requirements around these.

Importing or using this module imports no Keras, TensorFlow or JAX (the
tools check their flags before those load): the phases are keras_lars.phases'.
"""

from keras_lars.phases import checked_phases
from keras_lars.phases import parse_phases
from keras_lars.phases import schedule_phases

SETS = {"batch_schedule": "global_batch_size", "image_size_schedule": "image_size"}


def first_phase_value(schedule, value, default):
    """A setting under its schedule: `value`, or, where it is left at its
    `default`, the first phase's value of the flag text `schedule` (a
    schedule that does not parse, or whose first value is below 1, keeps
    `value`: the schedule's own check names it, not the flag it sets)."""
    if not schedule or value != default:
        return value
    try:
        first = parse_phases(schedule)[0][1]
    except ValueError:
        return value
    return first if first >= 1 else value


def phases_problem(value, config, schedule_flag, epochs_flag, size_problem):
    """The first problem of the phases `value` of --`schedule_flag`, or None:
    they parse, each starts before --`epochs_flag`, each image size passes
    `size_problem(size, config)` (a requirement or None), and the first
    phase's value is the flag it sets (SETS)."""
    if not value:
        return None
    flag = SETS[schedule_flag]
    sizes = flag == "image_size"
    try:  # "0:1": a valid batch, to check the image sizes alone
        phases = checked_phases(schedule_phases(*(("0:1", value) if sizes else (value,))))
    except ValueError as error:
        return str(error).rstrip(".")
    epochs = getattr(config, epochs_flag)
    values = [p.image_size if sizes else p.global_batch_size for p in phases]
    for number, (phase, phase_value) in enumerate(zip(phases, values), 1):
        if phase.epoch >= epochs:
            return (
                f"phase {number} starts at epoch {phase.epoch}, at or beyond "
                f"--{epochs_flag}={epochs:g}"
            )
        problem = sizes and size_problem(phase_value, config)
        if problem:
            return f"phase {number}: the image size {phase_value} {problem}"
    if getattr(config, flag) != values[0]:
        return (
            f"the first phase's {'image size' if sizes else 'batch'} {values[0]} differs from "
            f"--{flag}={getattr(config, flag)} (leave that at its default or make them equal)"
        )
    return None
