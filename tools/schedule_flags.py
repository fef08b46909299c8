"""The schedule flags keras-lars-train and keras-lars-plan share, declared once.

--batch_schedule and --image_size_schedule are keras_lars.BatchSchedule's
phases, "epoch:value,...", the first at epoch 0. Each sets a flag of one
value for its first phase (SETS); left at its default, that flag takes the
first phase's value (`take_first_phases`), otherwise the two must agree.
`schedule_settings` declares both settings for a tool, which adds what a
phase means to it and how it counts its epochs.

Importing or using this module imports no Keras, TensorFlow or JAX (the
tools check their flags before those load): the phases are keras_lars.phases'.
"""

from keras_lars.models import takes_any_image_size
from keras_lars.phases import checked_phases
from keras_lars.phases import parse_phases
from keras_lars.phases import schedule_phases
from keras_lars.tools.settings import setting

SETS = {"batch_schedule": "global_batch_size", "image_size_schedule": "image_size"}


def schedule_settings(*, epochs_flag, batch_phase, size_phase, size_problem, counting_problem):
    """The settings (batch_schedule, image_size_schedule) of a tool whose run
    lasts --`epochs_flag`. `batch_phase` and `size_phase` say what a phase
    does in the tool; `size_problem(size, config)` and
    `counting_problem(config)` (a requirement or None) are its own rules for
    an image size and for a run counted in phases."""

    def check(schedule_flag):
        def problem(value, config):
            if not value:
                return None
            return (
                counting_problem(config)
                or phases_problem(value, config, schedule_flag, epochs_flag, size_problem)
                or (schedule_flag == "image_size_schedule" and _resizing_problem(config))
                or None
            )

        return problem

    before = f"the first at epoch 0, all before --{epochs_flag}"
    batch = setting(
        "",
        f"Batch-size control: phases epoch:global batch, e.g. 0:4096,30:8192 ({before}); "
        f"{batch_phase}. Empty: the constant --global_batch_size.",
        check=check("batch_schedule"),
    )
    sizes = setting(
        "",
        f"Progressive resizing: phases epoch:image side, e.g. 0:128,40:192,80:224 ({before}; "
        f"resnet models); {size_phase}. Empty: the constant --image_size.",
        check=check("image_size_schedule"),
    )
    return batch, sizes


def _resizing_problem(config):
    if takes_any_image_size(config.model):
        return None
    return (
        f"--model={config.model} flattens a feature map of one size; use a resnet "
        "(global pooling takes any size)"
    )


def take_first_phases(config):
    """Sets each flag of SETS left at its default to its schedule's first
    phase's value (in a frozen dataclass's __post_init__, before its checks)."""
    defaults = type(config).__dataclass_fields__
    for schedule, flag in SETS.items():
        value = getattr(config, flag)
        value = first_phase_value(getattr(config, schedule), value, defaults[flag].default)
        object.__setattr__(config, flag, value)


def batch_schedule(config, global_batch_size):
    """The keras_lars.BatchSchedule of `config`'s schedule flags, or None when
    neither is given (`global_batch_size`: the one batch of a run that only
    resizes). Loads Keras."""
    if not (config.batch_schedule or config.image_size_schedule):
        return None
    from keras_lars import BatchSchedule

    return BatchSchedule.parse(
        config.batch_schedule or f"0:{global_batch_size}", config.image_size_schedule or None
    )


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
