"""keras-lars-plan's time-to-accuracy settings (tools/plan/time_to_accuracy.py),
declared apart so that the planner's settings (config.PlanSettings) take them
by inheritance: a steps-to-target curve (target_curve.py), the user's
measured run, the batch x devices grid, and an adaptive batch planned
(adaptive_plan.py) with the training tool's own --adaptive_batch settings."""

import dataclasses
import math

from keras_lars.tools.settings import setting
from keras_lars.tools.train.config import Config as TrainConfig

MAX_GRID = 32  # rows or columns


def parse_counts(text):
    """'1,2,4' -> (1, 2, 4); ValueError naming what is wrong."""
    values = []
    for item in text.split(","):
        item = item.strip()
        if not (item.isascii() and item.isdigit()) or int(item) < 1:
            raise ValueError(f"{item!r} is not a whole number >= 1")
        values.append(int(item))
    if len(values) > MAX_GRID:
        raise ValueError(f"at most {MAX_GRID} values")
    return tuple(sorted(set(values)))


def _counts(value, config):
    if not value:
        return None
    try:
        parse_counts(value)
    except ValueError as error:
        return f"must be whole numbers >= 1, separated by commas: {error}"
    return None


def _positive_or_unset(value, config):
    if not math.isfinite(value):
        return "must be a finite number"
    return None if value >= 0 else "must be > 0 (0: not given)"


def _runs(value, config):
    if len(value) > MAX_GRID:
        return f"at most {MAX_GRID} runs"
    return None if all(value) else "an empty path"


_TOOL = {field.name: field for field in dataclasses.fields(TrainConfig)}
# flags that plan something else than one adaptive run's time to accuracy
_NOT_ADAPTIVE = (
    "target_noise_from_run",
    "batch_schedule",
    "image_size_schedule",
    "layers",
    "layout_out",
    "records",
)


def _adaptive_problem(value, config):
    """--adaptive_batch: planned from a study, one batch to start at and a
    largest one, and nothing it cannot honour."""
    if value == "off":
        return None
    others = [f"--{name}" for name in _NOT_ADAPTIVE if getattr(config, name)]
    if others:
        return f"plans one adaptive run's time to accuracy: not with {', '.join(others)}"
    if not (
        config.target_study
        or config.target_s_min
        or config.target_b_crit
        or config.target_e_min
        or config.target_noise_scale
    ):
        return (
            "plans from steps to the target and a noise-scale curve: give --target_study (its "
            "fit.json, and its noise_scales.json unless --adaptive_noise_curve), or "
            "--target_s_min or --target_noise_scale with --adaptive_noise_curve"
        )
    if not config.target_study and not config.adaptive_noise_curve:
        return (
            "needs B_simple along the run: --target_study's noise_scales.json, or "
            "--adaptive_noise_curve"
        )
    if not config.global_batch_size:
        return "needs --global_batch_size, the batch to start at (as keras-lars-train's)"
    if not config.adaptive_batch_max:
        return "needs --adaptive_batch_max, the largest global batch to grow to"
    return None


def parse_noise_curve(text):
    """'0:100,0.5:400' -> ((0.0, 100.0), (0.5, 400.0)): (fraction of the way
    to the goal, B_simple) by fraction; ValueError naming what is wrong."""
    points = {}
    for item in text.split(","):
        item = item.strip()
        fraction, colon, value = item.partition(":")
        try:
            fraction, value = float(fraction), float(value)
        except ValueError:
            raise ValueError(f"{item!r} is not FRACTION:B_SIMPLE") from None
        if not colon or not math.isfinite(fraction) or fraction < 0:
            raise ValueError(f"{item!r}: the fraction must be a finite number >= 0")
        if not math.isfinite(value) or value <= 0:
            raise ValueError(f"{item!r}: B_simple must be a finite number > 0")
        if fraction in points:
            raise ValueError(f"fraction {fraction:g} given twice")
        points[fraction] = value
    if len(points) > MAX_GRID:
        raise ValueError(f"at most {MAX_GRID} points")
    return tuple(sorted(points.items()))


def _noise_curve(value, config):
    if not value:
        return None
    try:
        parse_noise_curve(value)
    except ValueError as error:
        return f"must be FRACTION:B_SIMPLE pairs separated by commas, e.g. 0:100,1:900: {error}"
    return None


def _adaptive_bound(name):
    """--adaptive_batch_min / _max: 0 (min: --global_batch_size) or a batch,
    min <= the start <= max, as keras-lars-train's."""

    def problem(value, config):
        if value < 0:
            return "must be >= 0"
        low, high, start = (
            config.adaptive_batch_min,
            config.adaptive_batch_max,
            config.global_batch_size,
        )
        if name == "min" and high and low > high:
            return f"exceeds --adaptive_batch_max={high}"
        if name == "min" and start and low > start:
            return f"exceeds --global_batch_size={start}, the batch to start at"
        if name == "max" and value and value < start:
            return f"is below --global_batch_size={start}, the batch to start at"
        return None

    return problem


def _tool_setting(name, check=None, before=""):
    """keras-lars-train's setting `name` as the planner's flag: the tool's
    default, help (after `before`) and choices, one declaration for both;
    its check, unless `check` (where the tool's reads settings the planner
    has not)."""
    found = _TOOL[name]
    return setting(
        found.default,
        before + found.metadata["help"],
        choices=found.metadata["choices"],
        check=check or found.metadata["check"],
    )


@dataclasses.dataclass(frozen=True)
class TargetSettings:
    """Time to accuracy: any one of --target_study, --target_s_min (with
    --target_b_crit or --target_e_min) and --target_noise_scale (with
    --target_measured_steps and --target_measured_batch) prints it."""

    target_study: str = setting(
        "",
        "Time to accuracy from a steps-to-target study: the directory of keras-lars-study "
        "--mode=steps_to_target (its fit.json: S(B) = S_min + E_min / B).",
    )
    target_optimizer: str = setting(
        "", "The --target_study optimizer whose fit to use; empty: the study's only one."
    )
    target_s_min: float = setting(
        0.0,
        "Time to accuracy from given steps: S_min, the fewest steps to the target (at a "
        "batch far above B_crit); with --target_b_crit or --target_e_min.",
        check=_positive_or_unset,
    )
    target_b_crit: float = setting(
        0.0,
        "B_crit = E_min / S_min, the critical batch (with --target_s_min).",
        check=_positive_or_unset,
    )
    target_e_min: float = setting(
        0.0,
        "E_min, the fewest examples to the target (at a batch far below B_crit; with "
        "--target_s_min).",
        check=_positive_or_unset,
    )
    target_noise_scale: float = setting(
        0.0,
        "Time to accuracy from a measured gradient noise scale B_noise, taken as B_crit "
        "(McCandlish et al. 2018), with one measured point: --target_measured_steps at "
        "--target_measured_batch.",
        check=_positive_or_unset,
    )
    target_measured_steps: float = setting(
        0.0,
        "Steps one run took to the target at --target_measured_batch.",
        check=_positive_or_unset,
    )
    target_measured_batch: int = setting(
        0, "The global batch of the --target_measured_steps run.", check=_positive_or_unset
    )
    target_noise_from_run: bool = setting(
        False,
        "Time to accuracy for the first --from_run run's model from the gradient noise scale "
        "it measured (keras-lars-train --noise_scale): B_crit = r x its B_simple of the last "
        "epoch with a reading (history's noise_scale_interval, or an adaptive batch's "
        "adaptive_noise_scale; not the lagged moving average), r = B_crit / B_simple that "
        "--target_study measured for --target_optimizer at fixed weights nearest its goal "
        "(its noise_scales.json); through --target_measured_steps at --target_measured_batch, "
        "else the steps the run took to its --target_accuracy.",
    )
    target_from_other_model: bool = setting(
        False,
        "Time a --target_study's curve for another model (--model, --image_size) than the one "
        "the study trained; every answer then says so. Without it the planner refuses.",
    )
    from_run: tuple = setting(
        (),
        "keras-lars-train runs (model dirs or summary.json files, comma-separated) of one "
        "model on one kind of device whose measured train_images_per_second times a step "
        "(time to accuracy): two or more at different batches fit the fixed and the "
        "per-image time; one alone is taken as proportional to the images a device.",
        check=_runs,
    )
    from_run_devices: int = setting(
        0,
        "Replicas each --from_run run trained on; 0: the run's record of them (summary.json's "
        "layout.replicas; a run of an earlier version: its newest checkpoints/ckpt-*.json's).",
        check=_positive_or_unset,
    )
    target_batches: str = setting(
        "",
        "Global batches of the time-to-accuracy grid, e.g. 256,1024,4096; empty: powers of "
        "two around the curve's measured batches (or B_crit).",
        check=_counts,
    )
    target_devices: str = setting(
        "",
        "Device counts of a time-to-accuracy sweep, e.g. 1,2,4,8; empty: one column, "
        "--devices where given, else the devices the step was measured on (the --from_run "
        "runs', the study's host: 1), else --devices' default.",
        check=_counts,
    )
    adaptive_batch: str = _tool_setting(
        "adaptive_batch",
        _adaptive_problem,
        "Plan an adaptive-batch run's time to accuracy beside the grid (from the steps to the "
        "target and B_simple along the run: --target_study's noise_scales.json or "
        "--adaptive_noise_curve; the rule sets the rate, "
        "which the plan takes as tuned: it plans the same steps under each), starting at "
        "--global_batch_size. keras-lars-train's: ",
    )
    adaptive_noise_curve: str = setting(
        "",
        "With --adaptive_batch: B_simple along the run, as fraction of the way to the goal: "
        "B_simple pairs, e.g. 0:100,0.5:400,1:900 (piecewise linear, constant beyond the "
        "ends), instead of --target_study's noise_scales.json; with any source of the steps "
        "to the target (--target_study, --target_s_min or --target_noise_scale).",
        check=_noise_curve,
    )
    adaptive_batch_every_epochs: int = _tool_setting("adaptive_batch_every_epochs")
    adaptive_batch_min: int = _tool_setting("adaptive_batch_min", _adaptive_bound("min"))
    adaptive_batch_max: int = _tool_setting("adaptive_batch_max", _adaptive_bound("max"))
    adaptive_batch_growth: float = _tool_setting("adaptive_batch_growth")
    adaptive_batch_target: float = _tool_setting("adaptive_batch_target")
