"""Time to accuracy from the user's own noise scale (keras-lars-plan
--target_noise_from_run): the critical batch of the --from_run run's model as

    B_crit = r x B_simple,   r = B_crit / B_simple of a steps-to-target study,

B_simple the run's last unlagged reading (keras-lars-train --noise_scale:
summary.json's history, `NOISE_READINGS`; never the moving average
`noise_scale`, which lags toward early training), r the study's fitted B_crit
(fit.json) over the B_simple it measured at fixed weights nearest its goal
(noise_scales.json: the highest fraction of the steps to the goal, at the
batch nearest the run's), with its 95% interval [B_crit / high, B_crit / low].
The curve goes through one measured point S_1 at B_1 (the flags, else the
run's own steps to its target): S_min = S_1 / (1 + B_crit / B_1).
Every file is read as untrusted; every error is one line naming the flag,
the file and the field.
"""

import dataclasses
import math
import os
import typing

from keras_lars.tools import untrusted_json
from keras_lars.tools.model_dir_names import NOISE_READINGS
from keras_lars.tools.plan import measured_step
from keras_lars.tools.plan import target_curve
from keras_lars.tools.settings import ConfigError
from keras_lars.tools.study_files import NOISE_TABLE

NOISE_FILE = NOISE_TABLE + ".json"


@dataclasses.dataclass(frozen=True)
class Reading:
    """A run's B_simple and its standard error, and where it was read."""

    noise_scale: float
    standard_error: float
    where: str


class Measurement(typing.NamedTuple):
    """One fixed-weight measurement of a study's noise_scales.json."""

    noise_scale: float
    low: float
    high: float
    batch: int
    fraction: float


@dataclasses.dataclass(frozen=True)
class Ratio:
    """r = B_crit / B_simple of a study, its interval (`high` inf where the
    B_simple interval reaches 0), and what it was measured on."""

    ratio: float
    low: float
    high: float
    b_crit: float
    noise_scale: float
    batch: int
    fraction: float
    path: str
    optimizer: str
    model: str
    goal: str  # the study's target, e.g. "accuracy 0.9" ('': not said)

    def text(self):
        high = "inf" if math.isinf(self.high) else f"{self.high:.3g}"
        return (
            f"ratio {self.ratio:.3g} [{self.low:.3g}..{high}] measured by {self.path} for "
            f"{self.optimizer} at batch {self.batch:,}: its B_crit {self.b_crit:,.0f} over "
            f"B_simple {self.noise_scale:,.0f} at fixed weights, {self.fraction:.0%} of the "
            f"steps to its goal"
            + (f" ({self.goal})" if self.goal else "")
            + (f", on {self.model}" if self.model else "")
        )


def _finite(document, key, where):
    """document[key] as a finite float of any sign."""
    value = document.get(key) if isinstance(document, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise untrusted_json.UntrustedFileError(f"{where}{key}: {value!r} is not a number")
    if not math.isfinite(value):
        raise untrusted_json.UntrustedFileError(f"{where}{key}: {value!r} is not a finite number")
    return float(value)


def run_reading(summary):
    """The Reading of the last history record with an unlagged noise-scale
    reading (UntrustedFileError naming the field, or saying none is there)."""
    history = summary.get("history") if isinstance(summary, dict) else None
    if not isinstance(history, list):
        raise untrusted_json.UntrustedFileError("history: not a list of epochs")
    for index in range(len(history) - 1, -1, -1):
        record, where = history[index], f"history[{index}]."
        for key, error_key in NOISE_READINGS:
            if isinstance(record, dict) and key in record:
                scale = untrusted_json.number(record, key, where=where)
                error = math.nan  # the tool leaves it out below 2 measurements
                if record.get(error_key) is not None:
                    error = untrusted_json.number(record, error_key, positive=False, where=where)
                return Reading(scale, error, f"{where}{key}, epoch {index + 1} of {len(history)}")
    names = " or ".join(key for key, _ in NOISE_READINGS)
    raise untrusted_json.UntrustedFileError(
        f"no noise-scale reading in its history (no {names}): train it with keras-lars-train "
        "--noise_scale (its moving average noise_scale lags toward early training and is not "
        "used)"
    )


def study_ratio(directory, optimizer, batch):
    """The Ratio of the study in `directory` for `optimizer` ('' : its only
    one), measured at the batch nearest `batch`."""
    flag = f"--target_study={directory}"
    found = target_curve.study_fit(directory, optimizer)
    optimizer, s_min, e_min = found.optimizer, found.s_min, found.e_min
    if s_min <= 0 or e_min <= 0:
        raise ConfigError(
            f"{flag}: {found.path}: the fit of {optimizer} has S_min {s_min:g}, E_min "
            f"{e_min:g}: no finite B_crit to take a ratio of."
        )
    path, rows = noise_rows(
        directory, optimizer, "no ratio B_crit / B_simple", "--target_noise_from_run"
    )
    # the highest fraction of the steps to the goal, then the batch nearest
    # `batch` (log scale), then the larger
    scale, low, high, measured_batch, fraction = max(
        rows, key=lambda r: (r[4], -abs(math.log(r[3] / batch)), r[3])
    )
    b_crit = e_min / s_min
    study = found.document["study"]
    goal = ""
    if study.get("target_accuracy") is not None:
        accuracy = target_curve.checked(
            flag, found.path, untrusted_json.number, study, "target_accuracy", True, "study."
        )
        goal = f"accuracy {accuracy:g}"
    return Ratio(
        b_crit / scale,
        b_crit / high,
        b_crit / low if low > 0 else math.inf,
        b_crit,
        scale,
        measured_batch,
        fraction,
        path,
        optimizer,
        found.model,
        goal,
    )


def noise_rows(directory, optimizer, missing, needed_by):
    """(path, rows): the study's noise_scales.json and `optimizer`'s
    fixed-weight measurements in it, each (B_simple, low, high, batch,
    fraction) (a Measurement), in the file's order; rows without a noise_scale (a null: not
    resolved) are not measurements. A ConfigError naming the file where it
    is missing or holds none: then `missing` (what cannot be had) for
    `needed_by` (the flag that needs it)."""
    flag = f"--target_study={directory}"
    path = os.path.join(directory, NOISE_FILE)
    if not os.path.lexists(path):
        raise ConfigError(
            f"{flag}: {path}: missing: the study measured no noise scale at fixed weights "
            f"(keras-lars-study --noise_batch_sizes), so {missing} for {needed_by}."
        )
    document = target_curve.read_json(flag, path)
    rows = target_curve.checked(flag, path, _measurements, document, optimizer)
    if not rows:
        raise ConfigError(
            f"{flag}: {path}: no fixed-weight measurement of {optimizer} (rows with a "
            f"noise_scale): {missing} for it."
        )
    return path, rows


def _measurements(document, optimizer):
    """[(B_simple, low, high, batch, fraction)] of `optimizer`'s rows with a
    noise_scale, each field checked."""
    rows = document.get("rows") if isinstance(document, dict) else None
    if not isinstance(rows, list):
        raise untrusted_json.UntrustedFileError('"rows": not a list of measurements')
    found = []
    for number, row in enumerate(rows):
        if not isinstance(row, dict) or row.get("optimizer") != optimizer:
            continue
        if row.get("noise_scale") is None:
            continue
        where = f"rows[{number}]."
        scale = untrusted_json.number(row, "noise_scale", where=where)
        low = _finite(row, "low", where)
        high = untrusted_json.number(row, "high", where=where)
        if not low <= scale <= high:
            raise untrusted_json.UntrustedFileError(
                f"{where}low, high: [{low:g}, {high:g}] does not hold noise_scale {scale:g}"
            )
        measured = untrusted_json.integer(row, "batch_size", where=where)
        fraction = untrusted_json.number(row, "fraction", positive=False, where=where)
        found.append(Measurement(scale, low, high, measured, fraction))
    return found


def measured_point(options, summary, name):
    """(S_1, B_1, what, the target accuracy or None): --target_measured_steps
    at --target_measured_batch, else the run's steps to its target
    (summary.json's "target")."""
    if options.target_measured_steps or options.target_measured_batch:
        target_curve.check_measured_point(
            options.target_measured_steps, options.target_measured_batch, "--target_noise_from_run"
        )
        return (
            options.target_measured_steps,
            options.target_measured_batch,
            "--target_measured_steps, --target_measured_batch",
            None,
        )
    reached = summary.get("target")
    if not isinstance(reached, dict) or reached.get("reached") is not True:
        raise ConfigError(
            f'{name}: the run reached no --target_accuracy (its "target"): give '
            "--target_measured_steps and --target_measured_batch, the steps a run took to "
            "the target at a batch."
        )
    steps = untrusted_json.integer(reached, "step", where="target.")
    batch = untrusted_json.integer(summary.get("config"), "global_batch_size", where="config.")
    accuracy = untrusted_json.number(reached, "target_accuracy", where="target.")
    return float(steps), batch, f"the run's steps to accuracy {accuracy:g}", accuracy


def run_noise_curve(options):
    """The StepsCurve of --target_noise_from_run (module docstring)."""
    if target_curve.one_source(options) != "--target_study":
        raise ConfigError(
            "--target_noise_from_run: give --target_study, the study whose ratio "
            "B_crit / B_simple turns the run's noise scale into a critical batch."
        )
    if not options.from_run:
        raise ConfigError(
            "--target_noise_from_run: give the run that measured its noise scale: --from_run."
        )
    path = options.from_run[0]
    summary_path, name = measured_step.summary_file(path)
    try:
        summary = untrusted_json.read_json(summary_path)
        run = measured_step.read_run(path, options.from_run_devices)
        reading = run_reading(summary)
        steps, batch, point, accuracy = measured_point(options, summary, name)
    except untrusted_json.UntrustedFileError as error:
        raise ConfigError(f"{name}: {error}.") from None
    ratio = study_ratio(options.target_study, options.target_optimizer, run.global_batch)
    b_crit = ratio.ratio * reading.noise_scale
    s_min = steps / (1 + b_crit / batch)
    return target_curve.StepsCurve(
        s_min,
        s_min * b_crit,
        f"B_crit = r x your B_simple, through {steps:,.0f} steps at batch {batch:,} ({point})",
        measured=(batch,),
        target=f"accuracy {accuracy:g} of {run.model}" if accuracy else "",
        model=run.model,
        image_size=run.image_size,
        details=(
            f"B_crit    = ratio x your B_simple = {ratio.ratio:.3g} x "
            f"{reading.noise_scale:,.0f} = {b_crit:,.0f} ({ratio.text()})",
            f"B_simple  {reading.noise_scale:,.0f} "
            + (
                "(no standard error: fewer than 2 measurements)"
                if math.isnan(reading.standard_error)
                else f"+- {reading.standard_error:.2g} (standard error)"
            )
            + f", unlagged, measured by {name}: {reading.where}",
            f"spread    B_crit {ratio.low * reading.noise_scale:,.0f} .. "
            + ("inf" if math.isinf(ratio.high) else f"{ratio.high * reading.noise_scale:,.0f}")
            + " over the ratio's interval (your B_simple's error not included)",
        ),
    )
